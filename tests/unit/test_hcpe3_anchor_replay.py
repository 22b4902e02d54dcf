"""The hcpe3 first open packs only the compact cache's anchors (`hcpe3_replay.anchor_starts`): every 8th ply
of a game and the position after a left-out repetition, known before the game is played; what it writes is
the compact layout of a full decode, position for position."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.hcpe3 import CACHE_FORMAT, Hcpe3File, build_positions, cache_path, read_arrays
from tideborn.data.hcpe3_compact import ANCHOR_EVERY, compact


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
    _, stored = read_arrays(cache_path(path), CACHE_FORMAT)
    for name, array in compact(full).items():
        assert np.array_equal(np.asarray(stored[name]), array), name
    positions = Hcpe3File(path).positions()
    every = np.arange(len(positions))
    for name in ("hcp", "label", "result", "game", "ply", "cand_label"):
        assert np.array_equal(np.asarray(getattr(positions, name)), full[name]), name
    assert np.array_equal(positions.hcp.take(every[::-1]), full["hcp"][::-1])
