"""hcpe3's first open (issue 23): the bulk replay reads what a move-by-move reading reads, refuses what it
refuses with the same message, and files are decoded several at a time in child processes.

The oracle is `move_by_move`, the reader as it was before the bulk replay (one Python step per field, every
candidate looked up in `Board.legal_moves`), kept here so that the readings can be compared whatever the
package does."""

from __future__ import annotations

import struct
from pathlib import Path

import cshogi
import numpy as np
import pytest
from cshogi.dlshogi import make_move_label

from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.cache import hcpe3
from tideborn.data.cache.hcpe3 import Hcpe3File, build_caches, build_positions, cache_path, iter_games
from tideborn.data.decode import hcpe3_replay
from tideborn.data.decode.features import material_problem, sane_kings
from tideborn.data.sets.sources import open_source
from tideborn.errors import UserError

SKIPPED = (cshogi.REPETITION_DRAW, cshogi.REPETITION_SUPERIOR, cshogi.REPETITION_INFERIOR)


@pytest.fixture(scope="module")
def games() -> list:
    return sample_games()


def move_by_move(path: Path) -> dict[str, np.ndarray]:
    """The positions arrays of `path` read one move at a time (the reading before issue 23), or UserError."""
    data = path.read_bytes()
    size, board, hcp = len(data), cshogi.Board(), np.empty(32, np.uint8)
    out: dict[str, list] = {k: [] for k in ("game_offsets", "hcp", "eval", "move16", "result", "label", "game",
                                            "ply", "counts", "cand_move16", "cand_label", "cand_visits")}
    offset, game = 0, 0
    while offset < size:
        where = f"{path}: game {game} (byte {offset})"
        if size - offset < 36:
            raise hcpe3_replay.truncated(path, game, offset, "game header", 36, size)
        start = np.frombuffer(data, np.uint8, 32, offset).copy()
        move_num, result, _ = struct.unpack_from("<HBB", data, offset + 32)
        if result & 3 == 3:
            raise UserError(f"{where}: result byte {result:#04x} out of range (bits 0-1 must be 0 draw, 1 black win "
                            f"or 2 white win); the file is not hcpe3 or is misaligned")
        if result & 0xE0:
            raise UserError(f"{where}: result byte {result:#04x} has unknown bits set ({result & 0xE0:#04x}; only "
                            f"bits 0-4 are defined: result, sennichite, nyugyoku, max moves); the file is not hcpe3 "
                            f"or is misaligned")
        if not sane_kings(start.reshape(1, 32))[0]:
            raise UserError(f"{where}: undecodable start position (king squares off the board); the file is not "
                            f"hcpe3 or is misaligned")
        try:
            board.set_hcp(start)
            decoded = material_problem(board) is None
        except RuntimeError:
            decoded = False
        if not decoded:
            raise UserError(f"{where}: {hcpe3_replay.UNDECODABLE_START}; the file is not hcpe3 or is misaligned")
        out["game_offsets"].append(offset)
        p = offset + 36
        for i in range(move_num):
            if p + 6 > size:
                raise hcpe3_replay.truncated(path, game, offset, f"move {i} of {move_num}", 6, size, p)
            selected, evaluation, count = struct.unpack_from("<HhH", data, p)
            p += 6
            if count > 593:
                raise UserError(f"{where}: move {i}: candidateNum {count} is more than a position can have legal "
                                f"moves (593); the file is corrupt or misaligned")
            if p + 4 * count > size:
                raise UserError(f"{where}: move {i}: candidateNum {count} reaches past the end of the file (byte "
                                f"{p + 4 * count} of {size}); the file is cut short or is not hcpe3")
            pairs = struct.unpack_from(f"<{2 * count}H", data, p)
            p += 4 * count
            move = board.move_from_move16(selected) if selected else 0
            if not move or not board.is_legal(move):
                what = "empty" if not selected else f"{selected:#06x}, illegal"
                raise UserError(f"{where}: move {i} of {move_num}: selected move {what} in the replayed position "
                                f"({board.sfen()}); the file is corrupt or misaligned")
            candidates, turn = pairs[0::2], board.turn
            legal = {m & 0xFFFF for m in board.legal_moves}
            for candidate in candidates:
                if candidate not in legal:
                    raise UserError(f"{where}: move {i} of {move_num}: candidate {candidate:#06x} is not a legal "
                                    f"move in the replayed position ({board.sfen()})")
            if len(set(candidates)) != count:
                again = next(m for k, m in enumerate(candidates) if m in candidates[:k])
                raise UserError(f"{where}: move {i} of {move_num}: candidate {again:#06x} appears more than once "
                                f"among its {count}; the file is corrupt")
            board.to_hcp(hcp)
            board.push(move)
            if board.is_draw(16) not in SKIPPED:
                for name, value in (("hcp", hcp.copy()), ("eval", evaluation), ("move16", selected),
                                    ("result", result), ("label", make_move_label(selected, turn)), ("game", game),
                                    ("ply", i), ("counts", count)):
                    out[name].append(value)
                out["cand_move16"] += candidates
                out["cand_visits"] += pairs[1::2]
                out["cand_label"] += [make_move_label(m, turn) for m in candidates]
        offset, game = p, game + 1
    dtypes = {"game_offsets": np.int64, "hcp": np.uint8, "eval": np.int16, "move16": np.uint16, "result": np.uint8,
              "label": np.uint16, "game": np.int32, "ply": np.uint16, "cand_move16": np.uint16,
              "cand_label": np.uint16, "cand_visits": np.uint16}
    arrays = {name: np.array(out[name], dtype=dtype).reshape(-1, 32) if name == "hcp" else
              np.array(out[name], dtype=dtype) for name, dtype in dtypes.items()}
    arrays["cand_offsets"] = np.concatenate([[0], np.cumsum(np.array(out["counts"], np.int64))]).astype(np.int64)
    return arrays


def reading(read, path: Path) -> tuple:
    """("ok", arrays as bytes) or ("refused", the message) of one reader on `path`."""
    try:
        arrays = read(path)
    except UserError as exc:
        return "refused", str(exc)
    return "ok", {name: (a.dtype.str, a.shape, a.tobytes()) for name, a in sorted(arrays.items())}


def bulk(path: Path) -> dict[str, np.ndarray]:
    return build_positions(path)["arrays"]


@pytest.mark.parametrize("window", [hcpe3_replay.WINDOW_BYTES, 1500])
def test_the_bulk_replay_reads_what_a_move_by_move_reading_reads(games, tmp_path, monkeypatch, window):
    """Every array equal, on the shipped games with six candidates a move (typical self-play); a small window
    puts game boundaries, and games longer than the window, across windows."""
    monkeypatch.setattr(hcpe3, "WINDOW_BYTES", window)
    write_hcpe3(tmp_path / "a.hcpe3", games, seed=2301)
    want = reading(move_by_move, tmp_path / "a.hcpe3")
    assert want[0] == "ok" and len(want[1]["eval"][2]) > 1000
    assert reading(bulk, tmp_path / "a.hcpe3") == want


@pytest.mark.parametrize("window", [hcpe3_replay.WINDOW_BYTES, 2000])
def test_a_damaged_file_is_read_or_refused_as_a_move_by_move_reading_does(games, tmp_path, monkeypatch, window):
    """Bytes flipped, runs overwritten, the file cut: the same arrays, or the same first error in the same
    words (the first bad move of the file is named, whichever check finds it)."""
    monkeypatch.setattr(hcpe3, "WINDOW_BYTES", window)
    write_hcpe3(tmp_path / "good.hcpe3", games[:4], seed=2302)
    good = (tmp_path / "good.hcpe3").read_bytes()
    rng = np.random.default_rng(2302)
    outcomes = {"ok": 0, "refused": 0}
    for case in range(160):
        data = bytearray(good)
        if case % 4 == 0:
            for at in rng.integers(0, len(data), size=int(rng.integers(1, 8))):
                data[at] = int(rng.integers(0, 256))
        elif case % 4 == 1:
            data = data[:int(rng.integers(1, len(data)))]
        elif case % 4 == 2:
            at = int(rng.integers(0, len(data) - 40))
            data[at:at + 40] = rng.integers(0, 256, size=40, dtype=np.uint8).tobytes()
        else:  # one bit of three bytes: near misses of valid moves and counts
            for at in rng.integers(0, len(data), size=3):
                data[at] ^= 1 << int(rng.integers(0, 8))
        path = tmp_path / "case.hcpe3"
        path.write_bytes(bytes(data))
        want = reading(move_by_move, path)
        assert reading(bulk, path) == want, f"case {case}"
        outcomes[want[0]] += 1
    assert outcomes["ok"] > 5 and outcomes["refused"] > 60


def with_candidate(path: Path, games: list, move16_of: object) -> tuple[int, int, int]:
    """Rewrite `path` with game 1's first move with candidates given one more candidate, `move16_of(board)`
    in its position; (game offset, ply, the move16)."""
    stored = list(iter_games(path))
    game = stored[1]
    ply = next(i for i, c in enumerate(game.candidates) if len(c))
    board = cshogi.Board()
    board.set_hcp(game.hcp)
    for info in game.moves[:ply]:
        board.push_move16(int(info["selectedMove16"]))
    extra = int(move16_of(board))
    game.candidates[ply] = np.concatenate([game.candidates[ply],
                                           np.array([(extra, 1)], dtype=game.candidates[ply].dtype)])
    parts = []
    for g in stored:
        header = np.zeros(1, hcpe3.HEADER_DTYPE)
        header["hcp"][0], header["moveNum"], header["result"] = g.hcp, g.move_num, g.result
        parts.append(header.tobytes())
        for info, candidates in zip(g.moves, g.candidates):
            info = np.array(info, hcpe3.MOVE_INFO_DTYPE)
            info["candidateNum"] = len(candidates)
            parts += [info.tobytes(), candidates.tobytes()]
    path.write_bytes(b"".join(parts))
    return game.offset, ply, extra


def _pawn_push(board: cshogi.Board, promote: bool) -> int:
    """A pawn's one-square push of the side to move, promoting or not (a move16)."""
    pawn = cshogi.BPAWN if board.turn == cshogi.BLACK else cshogi.WPAWN
    step = -1 if board.turn == cshogi.BLACK else 1
    square = next(sq for sq in range(81) if board.piece(sq) == pawn and board.piece(sq + step) == 0)
    return (square + step) | square << 7 | (1 << 14 if promote else 0)


def _gold_promotion(board: cshogi.Board) -> int:
    gold = cshogi.BGOLD if board.turn == cshogi.BLACK else cshogi.WGOLD
    for move in board.legal_moves:
        if board.piece(cshogi.move_from(move)) == gold:
            return cshogi.move16(move) | 1 << 14
    raise AssertionError("no gold move")


@pytest.mark.parametrize("how, move16_of", [
    ("a pawn promoting outside the zone", lambda board: _pawn_push(board, promote=True)),
    ("a gold promoting", _gold_promotion),
    ("a move16 with bit 15 set", lambda board: cshogi.move16(next(iter(board.legal_moves))) | 0x8000),
    ("a square past the board", lambda board: 0x7F7F),
])
def test_a_candidate_that_is_legal_only_to_is_legal_is_refused(games, tmp_path, how, move16_of):
    """`Board.is_legal` takes moves the legal-move list does not hold (it does not look at promotions); a
    candidate like that is refused as before, not trained with a label of no move."""
    write_hcpe3(tmp_path / "a.hcpe3", games[:3], seed=2303)
    offset, ply, extra = with_candidate(tmp_path / "a.hcpe3", games, move16_of)
    pattern = rf"a\.hcpe3: game 1 \(byte {offset}\): move {ply} of \d+: candidate {extra:#06x} is not a legal move"
    with pytest.raises(UserError, match=pattern):
        build_positions(tmp_path / "a.hcpe3")
    assert reading(bulk, tmp_path / "a.hcpe3") == reading(move_by_move, tmp_path / "a.hcpe3")


def test_the_label_table_is_make_move_label():
    table = hcpe3_replay.move_labels()
    rng = np.random.default_rng(2304)
    for move16 in rng.integers(0, 1 << 15, size=4000).tolist():
        to, source, promote = move16 & 0x7F, move16 >> 7 & 0x7F, move16 >> 14 & 1
        if to < 81 and (source < 81 or source < 88 and not promote):
            for color in (cshogi.BLACK, cshogi.WHITE):
                assert table[color, move16] == make_move_label(move16, color), hex(move16)
        else:
            assert (table[:, move16] == hcpe3_replay.NO_LABEL).all()


def test_several_files_are_decoded_at_once_in_child_processes(games, tmp_path, monkeypatch, capsys):
    """The caches come from the children (the parent only reads them), and hold what a decoding in the
    process holds."""
    monkeypatch.setattr(hcpe3, "PARALLEL_BYTES", 0)
    paths = [tmp_path / f"{name}.hcpe3" for name in "abc"]
    for k, path in enumerate(paths):
        write_hcpe3(path, games[k * 5:k * 5 + 5], seed=2305 + k)
    Hcpe3File(paths[2]).positions()  # already current: left alone
    assert build_caches(paths, processes=2) == paths[:2]
    assert "hcpe3: decoding" in capsys.readouterr().out
    monkeypatch.setattr(hcpe3, "_build", lambda *args: pytest.fail("decoded again in the parent"))
    source = open_source(paths)
    for path, positions in zip(paths, source.parts[0].files):
        assert positions.cached
        want = move_by_move(path)
        assert all(np.array_equal(np.asarray(positions.arrays[name]), want[name]) for name in want)
    source.close()


def test_a_malformed_file_among_several_is_named_as_when_decoded_alone(games, tmp_path, monkeypatch):
    monkeypatch.setattr(hcpe3, "PARALLEL_BYTES", 0)
    paths = [tmp_path / f"{name}.hcpe3" for name in "abc"]
    for k, path in enumerate(paths):
        write_hcpe3(path, games[k * 5:k * 5 + 5], seed=2308 + k)
    paths[1].write_bytes(paths[1].read_bytes()[:-3])
    with pytest.raises(UserError) as alone:
        build_positions(paths[1])
    with pytest.raises(UserError) as among:
        open_source(paths, processes=2)
    assert str(among.value) == str(alone.value) and "b.hcpe3: game 4" in str(alone.value)
    assert cache_path(paths[0]).is_file() and not cache_path(paths[1]).exists()


INTERRUPTED_BUILD = """
import signal
import sys
# Ctrl-C as in a terminal's foreground job, even where the test runs with SIGINT ignored (a background job)
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from tideborn.data.cache import hcpe3
hcpe3.PARALLEL_BYTES = 0
hcpe3.build_caches([Path(p) for p in sys.argv[1:]], processes=2)
"""


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_a_parallel_build_interrupted_leaves_no_cache_a_later_open_trusts(games, tmp_path, signal_name):
    """Ctrl-C (SIGINT to the foreground process group) or kill -9 of the group while the children write:
    a cache left at its name is whole and right, and the next open reads the right positions."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.common import REPO_ROOT, child_env

    write_hcpe3(tmp_path / "one.hcpe3", games, seed=2312)
    one = (tmp_path / "one.hcpe3").read_bytes()
    paths = [tmp_path / f"{name}.hcpe3" for name in "abc"]
    for k, path in enumerate(paths):
        path.write_bytes(one * (24 + k))  # a few seconds of decoding in all, long enough to be interrupted
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED_BUILD, *map(str, paths)], cwd=REPO_ROOT,
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert "hcpe3: decoding" in child.stdout.readline()
        # The children write: a cache's temp file is there (a state, not a time, so a busy machine is no matter).
        deadline = time.monotonic() + 120  # only a hang's guard
        while not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]:
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.01)
        os.killpg(child.pid, getattr(signal, signal_name))
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode != 0
    for path in paths:
        left = cache_path(path)
        want = build_positions(path)["arrays"]
        if left.exists():  # finished before the signal: then it must be whole
            assert hcpe3.read_arrays(left, hcpe3.CACHE_FORMAT) is not None
        got = Hcpe3File(path).positions()
        assert got.cached and all(np.array_equal(np.asarray(got.arrays[name]), want[name]) for name in want)
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name], "a dead child's temp file was kept"
