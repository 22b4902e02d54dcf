"""Features and targets against hand-made positions: planes as cshogi makes them, move labels for both
sides, results from the side to move's view, the value mix, and bad moves skipped or refused."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import cshogi
import numpy as np
import pytest
import torch
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_input_features, make_move_label

from tests.helpers.data import HCPE, PSV, hcpe_records, psv_records, random_positions
from tideborn.data.decode.features import BadRecord, Decoder, king_squares, value_targets
from tideborn.data.training.loader import to_device_batch

# A middle game with pieces in hand on both sides, black to move, and the same with white to move.
HANDS_SFEN = "ln1g1g1nl/1ks2r3/1ppp1s1pp/p4pp2/9/P1P1P1P1P/1PSP1PP2/1KG1G2R1/LN5NL b BSbp 1"
HANDS_SFEN_WHITE = HANDS_SFEN.replace(" b ", " w ")


def one_record(sfen: str, usi: str, kind: str, result: int, score: int = 0) -> np.ndarray:
    board = cshogi.Board(sfen)
    move = board.move_from_usi(usi)
    assert board.is_legal(move), usi
    if kind == "hcpe":
        record = np.zeros(1, HCPE)
        board.to_hcp(record["hcp"][0])
        record["bestMove16"] = np.uint16(cshogi.move16(move)).view(np.int16)
        record["gameResult"], record["eval"] = result, score
    else:
        record = np.zeros(1, PSV)
        board.to_psfen(record["sfen"][0])
        record["move"] = cshogi.move16_to_psv(cshogi.move16(move))
        record["game_result"], record["score"] = result, score
    return record


def decode_one(record: np.ndarray, kind: str, value_lambda: float = 0.0):
    return Decoder(kind, 756.0, value_lambda).decode(record)


@pytest.mark.parametrize("kind", ["hcpe", "psv"])
@pytest.mark.parametrize("sfen", [cshogi.STARTING_SFEN, HANDS_SFEN, HANDS_SFEN_WHITE])
def test_planes_are_cshogis_dlshogi_features(kind, sfen):
    board = cshogi.Board(sfen)
    usi = cshogi.move_to_usi(next(iter(board.legal_moves)))
    expected1 = np.zeros((FEATURES1_NUM, 9, 9), np.float32)
    expected2 = np.zeros((FEATURES2_NUM, 9, 9), np.float32)
    make_input_features(board, expected1, expected2)
    decoded = decode_one(one_record(sfen, usi, kind, cshogi.DRAW if kind == "hcpe" else 0), kind)
    assert np.array_equal(decoded.features1[0].astype(np.float32), expected1)
    # every hand/check plane is constant, so one value per plane carries it
    assert np.array_equal(np.broadcast_to(decoded.features2[0][:, None, None], expected2.shape), expected2)
    batch = to_device_batch({name: torch.from_numpy(getattr(decoded, name))
                             for name in ("features1", "features2", "policy", "value")}, torch.device("cpu"))
    assert torch.equal(batch.features1[0], torch.from_numpy(expected1))
    assert torch.equal(batch.features2[0], torch.from_numpy(expected2))
    assert batch.features1.dtype == batch.features2.dtype == torch.float32
    if sfen == HANDS_SFEN:
        assert expected2.any(), "the hand position must light some hand planes"


def test_move_labels_follow_dlshogis_layout_for_both_sides():
    # 7g7f (black pawn up to 7f) and its mirror 3c3d (white pawn up, seen from white) are label 0*81 + 59:
    # direction UP, square 7f = file index 6 * 9 + rank index 5.
    black = decode_one(one_record(cshogi.STARTING_SFEN, "7g7f", "hcpe", cshogi.DRAW), "hcpe")
    after = cshogi.Board()
    after.push_usi("7g7f")
    white = decode_one(one_record(after.sfen(), "3c3d", "hcpe", cshogi.DRAW), "hcpe")
    assert black.policy.tolist() == [59] == white.policy.tolist()
    drop = decode_one(one_record(HANDS_SFEN, "B*5e", "hcpe", cshogi.DRAW), "hcpe")
    # 10 directions, 10 promoting ones, then drops in piece-type order (pawn lance knight silver bishop ...)
    bishop_drop_direction = 20 + cshogi.BISHOP - 1
    assert drop.policy.tolist() == [bishop_drop_direction * 81 + 4 * 9 + 4]
    board = cshogi.Board(HANDS_SFEN)
    assert drop.policy[0] == make_move_label(board.move_from_usi("B*5e"), cshogi.BLACK)


@pytest.mark.parametrize("stored, sfen, expected", [
    (cshogi.BLACK_WIN, HANDS_SFEN, 1.0), (cshogi.BLACK_WIN, HANDS_SFEN_WHITE, 0.0),
    (cshogi.WHITE_WIN, HANDS_SFEN, 0.0), (cshogi.WHITE_WIN, HANDS_SFEN_WHITE, 1.0),
    (cshogi.DRAW, HANDS_SFEN, 0.5), (cshogi.DRAW, HANDS_SFEN_WHITE, 0.5),
])
def test_hcpe_results_are_turned_to_the_side_to_move(stored, sfen, expected):
    usi = cshogi.move_to_usi(next(iter(cshogi.Board(sfen).legal_moves)))
    decoded = decode_one(one_record(sfen, usi, "hcpe", stored), "hcpe")
    assert decoded.result.tolist() == [expected] == decoded.value.tolist()


@pytest.mark.parametrize("stored, expected", [(1, 1.0), (0, 0.5), (-1, 0.0)])
@pytest.mark.parametrize("sfen", [HANDS_SFEN, HANDS_SFEN_WHITE])
def test_psv_results_are_already_the_side_to_moves(stored, expected, sfen):
    usi = cshogi.move_to_usi(next(iter(cshogi.Board(sfen).legal_moves)))
    assert decode_one(one_record(sfen, usi, "psv", stored), "psv").result.tolist() == [expected]


@pytest.mark.parametrize("kind, win", [("hcpe", cshogi.BLACK_WIN), ("psv", 1)])
def test_the_value_target_mixes_result_and_eval_through_a_sigmoid(kind, win):
    decoded = decode_one(one_record(HANDS_SFEN, "B*5e", kind, win, score=-756), kind, value_lambda=0.25)
    assert decoded.value[0] == pytest.approx(0.75 * 1.0 + 0.25 / (1 + math.e), rel=1e-6)
    assert value_targets(np.array([0.5]), np.array([0.0]), 756.0, 0.333).tolist() == pytest.approx([0.5])


@pytest.mark.parametrize("kind", ["hcpe", "psv"])
def test_empty_and_illegal_moves_are_skipped_and_listed(kind):
    records = hcpe_records(random_positions(6)) if kind == "hcpe" else psv_records(random_positions(6))
    move_field = "bestMove16" if kind == "hcpe" else "move"
    records[move_field][1] = 0
    start = one_record(cshogi.STARTING_SFEN, "7g7f", kind, 0)
    records[4] = start[0]
    records[move_field][4] = one_record(HANDS_SFEN, "B*5e", kind, 0)[move_field][0]  # no bishop in hand here
    decoded = Decoder(kind, 756.0, 0.0).decode(records)
    assert len(decoded) == 4
    assert [position for position, _ in decoded.skipped] == [1, 4]
    assert decoded.skipped[0][1] == "empty move" and "illegal" in decoded.skipped[1][1]
    with pytest.raises(BadRecord, match="empty move") as raised:
        Decoder(kind, 756.0, 0.0, bad_records="error").decode(records)
    assert raised.value.position == 1


def test_king_squares_are_read_from_the_packed_bits():
    records = hcpe_records(random_positions(40, seed=3))
    black, white = king_squares(np.ascontiguousarray(records["hcp"]))
    board = cshogi.Board()
    for i in range(len(records)):
        board.set_hcp(records["hcp"][i])
        assert (black[i], white[i]) == (board.king_square(cshogi.BLACK), board.king_square(cshogi.WHITE))


@pytest.mark.parametrize("kind", ["hcpe", "psv"])
def test_random_bytes_never_crash_the_decoder(kind):
    # cshogi's decoders can crash on garbage; run in a child so a crash fails this test, not the suite.
    code = textwrap.dedent(f"""
        import numpy as np
        from tideborn.data.decode.features import BadRecord, Decoder
        from tideborn.data.formats.records import RECORD_DTYPES
        dtype = RECORD_DTYPES[{kind!r}]
        rng = np.random.default_rng(11)
        decoder = Decoder({kind!r}, 756.0, 0.3)
        bad = good = 0
        for _ in range(3000):
            record = np.frombuffer(rng.bytes(dtype.itemsize), dtype=dtype).copy()
            record[dtype.names[-2]] = rng.integers(-1, 3)
            try:
                good += len(decoder.decode(record))
            except BadRecord:
                bad += 1
        print(bad, good)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    bad, good = map(int, done.stdout.split())
    assert bad > 2000  # almost all garbage is refused before or by cshogi's decoder
