"""The hcpe3 first open packs only the compact cache's anchors (`hcpe3_replay.anchor_starts`): every 8th ply
of a game and the position after a left-out repetition, known before the game is played; what it writes is
the compact layout of a full decode, position for position."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.cache import hcpe3
from tideborn.data.cache.hcpe3 import CACHE_FORMAT, Hcpe3File, build_positions, cache_path, read_arrays, write_arrays
from tideborn.data.cache.hcpe3_compact import ANCHOR_EVERY, compact
from tideborn.data.tools.checks import verify_hcpe3


@pytest.fixture(scope="module")
def selfplay(tmp_path_factory):
    """Self-play-like games with sennichite among them (repetitions left out), and their full decode."""
    path = tmp_path_factory.mktemp("anchors") / "selfplay.hcpe3"
    write_hcpe3(path, sample_games(), seed=23, book_plies=0)
    return path, build_positions(path)["arrays"]


def test_the_anchors_are_every_8th_ply_of_a_game_and_the_positions_after_a_gap(selfplay):
    path, full = selfplay
    positions = Hcpe3File(path).positions()
    assert positions.cached and positions.repetitions > 0
    _, stored = read_arrays(cache_path(path), CACHE_FORMAT)
    rows = np.asarray(stored["anchor_position"])
    game, ply = full["game"].astype(np.int64), full["ply"].astype(np.int64)
    after_gap = np.zeros(len(game), np.bool_)
    after_gap[0] = True
    after_gap[1:] = (game[1:] != game[:-1]) | (ply[1:] != ply[:-1] + 1)
    want = np.flatnonzero((ply % ANCHOR_EVERY == 0) | after_gap)
    assert np.array_equal(rows, want)
    assert after_gap.sum() > full["game"].max() + 1  # some anchors come from repetitions, not game starts
    assert np.array_equal(np.asarray(stored["hcp"]), full["hcp"][want])


def test_the_first_open_writes_the_compact_layout_of_a_full_decode(selfplay):
    path, full = selfplay
    positions = Hcpe3File(path).positions()  # the first open here, whichever test of the file runs first
    _, stored = read_arrays(cache_path(path), CACHE_FORMAT)
    for name, array in compact(full).items():
        assert np.array_equal(np.asarray(stored[name]), array), name
    every = np.arange(len(positions))
    for name in ("hcp", "label", "result", "game", "ply", "cand_label"):
        assert np.array_equal(np.asarray(getattr(positions, name)), full[name]), name
    assert np.array_equal(positions.hcp.take(every[::-1]), full["hcp"][::-1])


def test_a_cache_with_anchors_by_place_is_rebuilt_and_not_called_foreign(selfplay, tmp_path):
    """Version 4 chose its anchors by place in the file (every 8th position): such a cache reads right, but is
    not what a fresh decode writes; it is rebuilt, and `verify` has nothing to say about it meanwhile."""
    path, full = selfplay
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    game, ply = full["game"].astype(np.int64), full["ply"].astype(np.int64)
    by_place = np.arange(len(game)) % ANCHOR_EVERY == 0
    by_place[1:] |= (game[1:] != game[:-1]) | (ply[1:] != ply[:-1] + 1)
    rows = np.flatnonzero(by_place)
    old = {**compact(full), "hcp": full["hcp"][rows], "anchor_position": rows.astype(np.int64),
           "anchor_game": full["game"][rows], "anchor_ply": full["ply"][rows], "anchor_result": full["result"][rows],
           "anchor": (np.cumsum(by_place) - 1).astype(np.uint32)}
    meta = {"games": len(full["game_offsets"]), "positions": len(full["eval"]), "repetitions": 0,
            "candidates": len(full["cand_move16"]), "source": hcpe3.source_fingerprint(copy),
            "identity": hcpe3.source_identity(copy), "content": hcpe3.content_hash(copy)}
    saved = hcpe3.CACHE_VERSION
    hcpe3.CACHE_VERSION = 4
    try:
        write_arrays(cache_path(copy), meta, old, CACHE_FORMAT)
    finally:
        hcpe3.CACHE_VERSION = saved
    assert verify_hcpe3(copy) == []
    positions = Hcpe3File(copy).positions()
    assert positions.cached and np.array_equal(np.asarray(positions.hcp), full["hcp"])
    header, stored = read_arrays(cache_path(copy), CACHE_FORMAT)
    assert header["version"] == hcpe3.CACHE_VERSION
    assert np.array_equal(np.asarray(stored["anchor_position"]), np.asarray(compact(full)["anchor_position"]))
