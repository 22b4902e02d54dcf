"""The batch decoder gathers cshogi's float planes a chunk of positions at a time and narrows them to uint8 in one
pass (issue 23, decode per core): on the shipped games its arrays must equal, bit for bit, those of the plain
per-position path (cshogi's `make_input_features` into zeroed planes, `make_move_label`), for hcpe records and for
hcpe3 positions replayed from the positions cache, across chunk boundaries and around skipped records."""

from __future__ import annotations

from pathlib import Path

import cshogi
import numpy as np
import pytest
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_input_features, make_move_label

from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.decode.features import CHUNK, Decoder
from tideborn.data.sets.sources import BatchDecoder, open_source


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """The shipped games as hcpe3 (its positions cache built) and the same positions as hcpe records."""
    path = tmp_path_factory.mktemp("shipped") / "games.hcpe3"
    write_hcpe3(path, sample_games(), seed=0)
    source = open_source([path])
    try:
        records = np.concatenate([r for r, _ in source.record_groups(np.arange(len(source)))])
    finally:
        source.close()
    return path, records


def plain_decode(records: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The per-position path the decoder had before (features, hand values, labels, kept rows)."""
    board = cshogi.Board()
    planes1 = np.zeros((FEATURES1_NUM, 9, 9), np.float32)
    planes2 = np.zeros((FEATURES2_NUM, 9, 9), np.float32)
    features1, features2, labels, kept = [], [], [], []
    for row, record in enumerate(records):
        board.set_hcp(record["hcp"])
        move16 = int(record["bestMove16"]) & 0xFFFF
        move = board.move_from_move16(move16) if move16 else 0
        if not move or not board.is_legal(move):
            continue
        planes1.fill(0)
        planes2.fill(0)
        make_input_features(board, planes1, planes2)
        features1.append(planes1.astype(np.uint8))
        features2.append(planes2[:, 0, 0].astype(np.uint8))
        labels.append(make_move_label(move, board.turn))
        kept.append(row)
    return np.stack(features1), np.stack(features2), np.array(labels, np.int64), kept


def test_hcpe_batches_equal_the_per_position_path_across_chunks_and_skips(shipped):
    _, records = shipped
    records = records[:40 * CHUNK + 7].copy()  # not a whole number of chunks
    # Empty moves (skipped) at the start, inside and at the end of chunks, so kept positions and chunk slots part.
    for row in (0, CHUNK - 1, CHUNK, 3 * CHUNK + 5, 3 * CHUNK + 6, len(records) - 1):
        records[row]["bestMove16"] = 0
    features1, features2, labels, kept = plain_decode(records)
    decoder = Decoder("hcpe", 756.0, 0.5)
    for out in (None, np.zeros((len(records), FEATURES1_NUM, 9, 9), np.uint8)):  # own array, or a worker's
        for _ in range(2):  # the decoder's scratch is reused from one batch to the next
            decoded = decoder.decode(records, out)
            assert np.array_equal(decoded.features1, features1)
            assert np.array_equal(decoded.features2, features2)
            assert np.array_equal(decoded.policy, labels)
            assert [row for row, _ in decoded.skipped] == [0, CHUNK - 1, CHUNK, 3 * CHUNK + 5, 3 * CHUNK + 6,
                                                           len(records) - 1]
            assert len(decoded) == len(kept)


def test_hcpe3_batches_replayed_from_the_cache_equal_the_per_position_path(shipped):
    path, records = shipped
    source = open_source([path])
    try:
        indices = np.sort(np.random.default_rng(1).choice(len(source), 1000, replace=False))
        decoded = BatchDecoder(756.0, 0.5).decode(source, indices)
    finally:
        source.close()
    features1, features2, _, kept = plain_decode(records[indices])
    assert len(kept) == len(indices)  # every cached position has a legal move
    assert np.array_equal(decoded.features1, features1)
    assert np.array_equal(decoded.features2, features2)
