"""hcpe3's first open, issue 23 must 1: the compiled loop (`compiled.play_games`) and the fast loop (`_play_fast`:
each game's candidates and moves as one list of ops, nothing but the cshogi calls per op) read what the
move-by-move loop reads (`_play_carefully`, the loop as it was, which the fast ones hand a game to whenever
something is not plainly right), and the first open holds the file's arrays once.

The comparison forces the careful loop on every game (`_play_fast` answering False, as it does at a bad
move) and compares arrays, or the first error's words, with the fast reading: on the shipped games with six
candidates a move (typical self-play), in both layouts (the full one of `build_positions`, the compact one a
first open writes), and on copies with faults injected."""

from __future__ import annotations

import collections
import random
import tracemalloc
from pathlib import Path

import cshogi
import numpy as np
import pytest

from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.cache import hcpe3
from tideborn.data.decode import hcpe3_replay
from tideborn.data.formats.games import Game
from tideborn.errors import UserError


@pytest.fixture(scope="module")
def games() -> list:
    return sample_games()


@pytest.fixture(scope="module")
def selfplay(games, tmp_path_factory) -> Path:
    """The shipped games as self-play writes them: six candidates from the first move on."""
    path = tmp_path_factory.mktemp("open_fast") / "selfplay.hcpe3"
    write_hcpe3(path, games, seed=2320, book_plies=0)
    return path


def reading(path: Path, full: bool) -> tuple:
    """("ok", the arrays as bytes and the meta) or ("refused", the message) of the first open's replay."""
    try:
        built, _ = hcpe3._build(path, full=full)
    except UserError as exc:
        return "refused", str(exc)
    arrays = {name: (a.dtype.str, a.shape, a.tobytes()) for name, a in sorted(built["arrays"].items())}
    return "ok", arrays, built["meta"]


def no_compiled(starts, *args) -> tuple[list[int], np.ndarray]:
    return [0] * len(starts), np.zeros(0, np.uint8)


def compiled_reading(path: Path, full: bool, monkeypatch) -> tuple[tuple, list[int]]:
    """`reading`, and per game whether the compiled loop played it (1) or left it to the Python loops (0)."""
    played: list[int] = []
    compiled_loop = hcpe3_replay.ReplayedPositions._play_compiled

    def counted_compiled(*args):
        games_played, gaps = compiled_loop(*args)
        played.extend(games_played)
        return games_played, gaps

    with monkeypatch.context() as patch:
        patch.setattr(hcpe3_replay.ReplayedPositions, "_play_compiled", staticmethod(counted_compiled))
        return reading(path, full), played


def careful_reading(path: Path, full: bool, monkeypatch) -> tuple:
    with monkeypatch.context() as patch:
        patch.setattr(hcpe3_replay.ReplayedPositions, "_play_compiled", staticmethod(no_compiled))
        patch.setattr(hcpe3_replay.ReplayedPositions, "_play_fast", lambda *args: False)
        return reading(path, full)


@pytest.mark.parametrize("full", [True, False], ids=["full layout", "compact layout"])
def test_the_fast_loop_reads_what_the_move_by_move_loop_reads(selfplay, monkeypatch, full):
    played = []
    fast = hcpe3_replay.ReplayedPositions._play_fast

    def counted(self, *args):
        played.append(fast(self, *args))
        return played[-1]

    monkeypatch.setattr(hcpe3_replay.ReplayedPositions, "_play_fast", counted)
    monkeypatch.setattr(hcpe3_replay.ReplayedPositions, "_play_compiled", staticmethod(no_compiled))
    got = reading(selfplay, full)
    monkeypatch.undo()
    assert played and all(played), "every game of the shipped ones is read by the fast loop"
    want = careful_reading(selfplay, full, monkeypatch)
    assert want[0] == "ok" and want[2]["positions"] > 5000 and want[2]["repetitions"] > 0
    assert got == want


@pytest.mark.parametrize("full", [True, False], ids=["full layout", "compact layout"])
def test_the_compiled_loop_reads_what_the_move_by_move_loop_reads(selfplay, monkeypatch, full):
    """The compiled loop (`compiled.play_games`) plays every game of the shipped ones, repetitions included
    (cshogi's `is_draw` rules: a draw, superior or inferior repetition left out, a perpetual check kept)."""
    played, fast = [], []
    compiled_loop = hcpe3_replay.ReplayedPositions._play_compiled
    python_loop = hcpe3_replay.ReplayedPositions._play_fast

    def counted_compiled(*args):
        games, gaps = compiled_loop(*args)
        played.extend(games)
        return games, gaps

    def counted_fast(self, *args):
        fast.append(python_loop(self, *args))
        return fast[-1]

    monkeypatch.setattr(hcpe3_replay.ReplayedPositions, "_play_compiled", staticmethod(counted_compiled))
    monkeypatch.setattr(hcpe3_replay.ReplayedPositions, "_play_fast", counted_fast)
    got = reading(selfplay, full)
    monkeypatch.undo()
    want = careful_reading(selfplay, full, monkeypatch)
    assert want[0] == "ok" and want[2]["repetitions"] > 0
    assert got == want
    assert played and all(played) and not fast, (sum(played), len(played), len(fast))


def shuffling_games(seed: int, count: int) -> tuple[list[Game], collections.Counter]:
    """Games that come back to their positions: after a random opening, each side mostly takes back its last
    move, or checks (so that perpetual checks occur); and how often cshogi's `is_draw(16)` answered what."""
    rng = random.Random(seed)
    board = cshogi.Board()
    games, kinds = [], collections.Counter()
    for _ in range(count):
        board.reset()
        for _ in range(rng.randint(10, 40)):
            board.push(rng.choice(list(board.legal_moves)))
        sfen, moves = board.sfen(), []
        for _ in range(rng.randint(40, 160)):
            legal = list(board.legal_moves)
            if not legal:
                break
            back = []
            if len(moves) >= 2 and not cshogi.move_is_drop(moves[-2]):
                last = moves[-2]
                back = [m for m in legal if cshogi.move_from(m) == cshogi.move_to(last)
                        and cshogi.move_to(m) == cshogi.move_from(last) and not cshogi.move_is_promotion(m)]
            checks = []
            for m in legal:
                board.push(m)
                if board.is_check():
                    checks.append(m)
                board.pop()
            r = rng.random()
            move = (back[0] if back and (r < 0.6 or back[0] in checks) else
                    rng.choice(checks) if checks and r < 0.85 else rng.choice(legal))
            board.push(move)
            moves.append(move)
            kinds[board.is_draw(16)] += 1
        games.append(Game(source="made up", sfen=sfen, moves=moves, result=cshogi.DRAW))
    return games, kinds


@pytest.mark.parametrize("full", [True, False], ids=["full layout", "compact layout"])
def test_repetitions_of_every_kind_are_read_as_the_move_by_move_loop_reads(tmp_path, monkeypatch, full):
    """Draws, superior and inferior repetitions (left out) and perpetual checks (kept), as cshogi's `is_draw`
    tells them, found by the compiled loop itself: it plays every game, with the same arrays as the careful
    loop."""
    games, kinds = shuffling_games(2327, 40)
    assert all(kinds[kind] > 3 for kind in (cshogi.REPETITION_DRAW, cshogi.REPETITION_WIN, cshogi.REPETITION_LOSE,
                                            cshogi.REPETITION_SUPERIOR, cshogi.REPETITION_INFERIOR)), kinds
    path = tmp_path / "shuffling.hcpe3"
    write_hcpe3(path, games, seed=2327, book_plies=0)
    got, played = compiled_reading(path, full, monkeypatch)
    want = careful_reading(path, full, monkeypatch)
    assert want[0] == "ok" and want[2]["repetitions"] > 100
    assert got == want
    assert len(played) == len(games) and all(played)


def ring_game(plies: int) -> Game:
    """Both kings walk a ring of eight squares, a step a move: the board comes back exactly 16 plies after it was
    last seen and never sooner, the farthest back cshogi's `is_draw(16)` looks."""
    rings = (["6f", "5f", "4f", "4g", "4h", "5h", "6h", "6g"], ["6b", "5b", "4b", "4c", "4d", "5d", "6d", "6c"])
    sfen = "9/3k5/9/9/9/3K5/9/9/9 b - 1"
    board, moves = cshogi.Board(sfen), []
    for ply in range(plies):
        ring, step = rings[ply % 2], ply // 2
        move = board.move_from_usi(ring[step % 8] + ring[(step + 1) % 8])
        assert board.is_legal(move), (ply, board.sfen())
        board.push(move)
        moves.append(move)
    return Game(source="made up", sfen=sfen, moves=moves, result=cshogi.DRAW)


def test_a_board_back_exactly_16_plies_later_is_a_repetition_left_out(tmp_path, monkeypatch):
    """The window's far end: the count of positions left out is cshogi's `is_draw(16)`, asked here with 16
    written out (both loops read the window from one constant, which a comparison of the two cannot check)."""
    game = ring_game(40)
    board, kinds = cshogi.Board(game.sfen), []
    for move in game.moves:
        board.push(move)
        kinds.append(board.is_draw(16))
    assert kinds[:15] == [cshogi.NOT_REPETITION] * 15 and kinds[15] == cshogi.REPETITION_DRAW, kinds
    # a record is left out where its move repeats the board (as dlshogi's moveIsDraw): moves 16 to 40
    left_out = sum(kind in hcpe3_replay.REPETITIONS_SKIPPED for kind in kinds)
    path = tmp_path / "ring.hcpe3"
    write_hcpe3(path, [game], seed=2328, book_plies=0)
    got, played = compiled_reading(path, False, monkeypatch)
    assert played == [1]
    assert got[0] == "ok" and got[2]["repetitions"] == left_out == 25, (got[2], left_out)
    assert got == careful_reading(path, False, monkeypatch)


def _damaged(good: bytes, rng: np.random.Generator, case: int) -> bytes:
    data = bytearray(good)
    if case % 4 == 0:  # a few bytes anywhere
        for at in rng.integers(0, len(data), size=int(rng.integers(1, 8))):
            data[at] = int(rng.integers(0, 256))
    elif case % 4 == 1:  # cut short
        data = data[:int(rng.integers(1, len(data)))]
    elif case % 4 == 2:  # a run overwritten
        at = int(rng.integers(0, len(data) - 40))
        data[at:at + 40] = rng.integers(0, 256, size=40, dtype=np.uint8).tobytes()
    else:  # one bit of three bytes: near misses of real moves, candidates and counts
        for at in rng.integers(0, len(data), size=3):
            data[at] ^= 1 << int(rng.integers(0, 8))
    return bytes(data)


@pytest.mark.parametrize("full", [True, False], ids=["full layout", "compact layout"])
def test_a_damaged_file_is_read_or_refused_as_the_move_by_move_loop_does(games, tmp_path, monkeypatch, full):
    """The same arrays, or the same first error in the same words, whichever check finds it and wherever
    in a game the fast loop gives up."""
    write_hcpe3(tmp_path / "good.hcpe3", games[:4], seed=2321, book_plies=0)
    good = (tmp_path / "good.hcpe3").read_bytes()
    rng = np.random.default_rng(2321 + full)
    outcomes = {"ok": 0, "refused": 0}
    for case in range(120):
        path = tmp_path / "case.hcpe3"
        path.write_bytes(_damaged(good, rng, case))
        want = careful_reading(path, full, monkeypatch)
        assert reading(path, full) == want, f"case {case}"
        outcomes[want[0]] += 1
    assert outcomes["ok"] > 5 and outcomes["refused"] > 50


def _peak_and_kept(path: Path) -> tuple[int, int, int]:
    """(peak bytes traced, bytes of the arrays it gives, positions) of a first open's replay of `path`."""
    tracemalloc.start()
    try:
        built, _ = hcpe3._build(path, full=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, sum(a.nbytes for a in built["arrays"].values()), built["meta"]["positions"]


def test_the_first_open_holds_the_files_arrays_once(games, tmp_path, monkeypatch):
    """What the first open's memory grows by with the file: about the arrays it gives (45 bytes a position
    here, 5.8 candidates each; 42 measured), gathered window by window and joined once. Gathering them from
    whole-file arrays of every position's game and ply, holding the windows' pieces and the joined arrays at
    once, grew it by 88. Measured as the growth from a file to the same games three times over, with small
    windows and reads, so that what does not grow with the file (a window's work, the tables) drops out."""
    write_hcpe3(tmp_path / "one.hcpe3", games, seed=2322, book_plies=0)
    (tmp_path / "three.hcpe3").write_bytes((tmp_path / "one.hcpe3").read_bytes() * 3)
    monkeypatch.setattr(hcpe3, "WINDOW_BYTES", 1 << 15)
    monkeypatch.setattr(hcpe3, "READ_CHUNK", 1 << 15)
    hcpe3._build(tmp_path / "one.hcpe3", full=False)  # the tables a process builds once are not the file's
    peak_one, kept_one, positions = _peak_and_kept(tmp_path / "one.hcpe3")
    peak_three, kept_three, _ = _peak_and_kept(tmp_path / "three.hcpe3")
    assert positions > 5000
    grown, kept = (peak_three - peak_one) / (2 * positions), (kept_three - kept_one) / (2 * positions)
    assert grown < 1.5 * kept, f"the peak grows by {grown:.0f} bytes a position, the arrays by {kept:.0f}"


def test_a_candidate_given_twice_is_found_past_the_first_65536_moves():
    """The check for a candidate given twice sorts 32-bit keys a block of 65,536 moves at a time: one given
    twice in a later block is found and named, and one move16 at moves 65,536 apart is no repetition."""
    rng = np.random.default_rng(2323)
    counts = rng.integers(0, 6, size=150_000)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    within = np.arange(starts[-1]) - np.repeat(starts[:-1], counts)  # distinct in a move: its place there
    moves = (within * 4096 + rng.integers(0, 4096, size=len(within))).astype(np.uint16)
    same_spot = [m for m in (10, 10 + (1 << 16)) if counts[m]]
    for m in same_spot:  # the same first candidate at moves 65,536 apart
        moves[starts[m]] = 4242
    assert hcpe3_replay._first_repeated(moves, counts, starts, len(counts)) is None
    twice = int(np.flatnonzero(counts[100_000:] >= 3)[0]) + 100_000
    moves[starts[twice] + 2] = moves[starts[twice]]
    assert hcpe3_replay._first_repeated(moves, counts, starts, len(counts)) == (twice, int(moves[starts[twice]]))
    assert hcpe3_replay._first_repeated(moves, counts, starts, twice) is None
