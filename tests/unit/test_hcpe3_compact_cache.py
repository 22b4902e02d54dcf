"""The hcpe3 positions cache's compact layout (version 4, `tideborn.data.cache.hcpe3_compact`): at most 50 bytes a
position at six candidates, read back exactly as a fresh decode gives the positions, and caches of the older
layout rebuilt, never misread."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.cache import hcpe3
from tideborn.data.cache.hcpe3 import Hcpe3File, build_positions, cache_path, read_arrays, write_arrays
from tideborn.errors import UserError

FULL_NAMES = ("game_offsets", "hcp", "eval", "move16", "result", "label", "game", "ply", "cand_offsets",
              "cand_move16", "cand_label", "cand_visits")


@pytest.fixture(scope="module")
def selfplay(tmp_path_factory):
    """Self-play-like: every move with up to six candidates (no book moves), sennichite games among them
    (repetitions left out: anchors after the gaps); the file, its fresh decode, and its opened positions."""
    folder = tmp_path_factory.mktemp("compact")
    path = folder / "selfplay.hcpe3"
    write_hcpe3(path, sample_games(), seed=2323, book_plies=0)
    want = build_positions(path)["arrays"]
    return path, want


def opened(path):
    return Hcpe3File(path).positions()


def test_the_cache_holds_at_most_50_bytes_a_position_at_six_candidates(selfplay):
    path, want = selfplay
    positions = opened(path)
    assert positions.cached and positions.repetitions > 0
    per_position = len(want["cand_move16"]) / len(want["eval"])
    assert 5.5 <= per_position <= 6, per_position
    size = cache_path(path).stat().st_size
    assert size / len(want["eval"]) <= 50, f"{size / len(want['eval']):.1f} bytes a position"
    header = json.loads(cache_path(path).read_bytes()[:4096].split(b"\n", 1)[0])
    assert header["version"] == hcpe3.CACHE_VERSION >= 4 and header["arrays"]["hcp"][2][0] < len(want["eval"]) / 6


def test_every_array_reads_back_as_a_fresh_decode_gives_it(selfplay):
    path, want = selfplay
    positions = opened(path)
    assert positions.cached
    for name in FULL_NAMES:
        assert np.array_equal(np.asarray(positions.arrays[name]), want[name]), name
    rng = np.random.default_rng(0)
    batch = rng.permutation(len(want["eval"]))[:700]
    again = pickle.loads(pickle.dumps(positions))  # as a data loader worker gets it
    for reader in (positions, again):
        assert np.array_equal(reader.hcp[batch], want["hcp"][batch])
        assert np.array_equal(reader.hcp[5:40], want["hcp"][5:40]) and np.array_equal(reader.hcp[-1], want["hcp"][-1])
        records = reader.hcpe_records(batch)
        assert np.array_equal(records["hcp"], want["hcp"][batch])
        assert np.array_equal(records["gameResult"], (want["result"][batch] & 3).view(np.int8))
        for name in ("label", "game", "ply", "result"):
            assert np.array_equal(np.asarray(getattr(reader, name)[batch]), want[name][batch]), name
        labels, probs, top = reader.targets(batch, 1.0)
        memory = hcpe3.Hcpe3Positions(path, {"games": 0, "repetitions": 0, "positions": len(want["eval"])}, want)
        mem_labels, mem_probs, mem_top = memory.targets(batch, 1.0)
        assert np.array_equal(labels, mem_labels) and np.array_equal(probs, mem_probs) and np.array_equal(top, mem_top)
    again.arrays["eval"].cache.close()


def write_old_layout(path, want, version):
    """A cache as the reader of version 3 wrote it (the full arrays), its header claiming `version`."""
    meta = {"games": len(want["game_offsets"]), "positions": len(want["eval"]), "repetitions": 0,
            "candidates": len(want["cand_move16"]), "source": hcpe3.source_fingerprint(path),
            "identity": hcpe3.source_identity(path), "content": hcpe3.content_hash(path)}
    saved = hcpe3.CACHE_VERSION
    hcpe3.CACHE_VERSION = version
    try:
        write_arrays(cache_path(path), meta, want, hcpe3.CACHE_FORMAT)
    finally:
        hcpe3.CACHE_VERSION = saved


@pytest.mark.parametrize("version", [3, 4])
def test_a_cache_of_the_older_layout_is_rebuilt_never_misread(selfplay, tmp_path, version):
    """Version 3's full layout (what every cache on disk is today), and the same arrays under a header that
    claims version 4: both are rebuilt, and the positions read are the file's."""
    path, want = selfplay
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    write_old_layout(copy, want, version)
    positions = opened(copy)
    assert positions.cached
    assert all(np.array_equal(np.asarray(positions.arrays[name]), want[name]) for name in FULL_NAMES)
    header, arrays = read_arrays(cache_path(copy), hcpe3.CACHE_FORMAT)
    assert header["version"] == hcpe3.CACHE_VERSION and "anchor" in arrays


def test_anchors_damaged_in_place_under_a_run_are_named_not_an_index_error(selfplay, tmp_path):
    path, want = selfplay
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    positions = opened(copy)
    cache = cache_path(copy)
    offset = json.loads(cache.read_bytes()[:4096].split(b"\n", 1)[0])["arrays"]["anchor"][0]
    with open(cache, "r+b") as handle:
        handle.seek(offset + 4 * 10)
        handle.write((2**32 - 1).to_bytes(4, "little"))
    with pytest.raises(UserError, match=r"\.selfplay\.hcpe3\.positions: the positions cache of .* is damaged"):
        positions.hcpe_records(np.arange(5, 15))
