"""The compiled decode (`tideborn.data.decode.compiled`, issue 23's decode per core) against cshogi itself, position by
position: what it certifies (status DONE) must be exactly cshogi's planes, hand/check values and move label, and
only for moves cshogi calls legal; what it leaves (SLOW) goes to cshogi, so a whole batch through `Decoder` equals
the cshogi-only path (`compiled=False`), messages and skips included. Positions: the shipped games, random play
(white to move, drops, promotions, checks), stored moves drawn at random, and damaged records.

The loops run under numba's JIT, as every process gets them: the callers pass each entry point one set of argument
types (one compilation each), and numba's on-disk cache of them is keyed on the sources' contents and survives a
damaged file."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import cshogi
import numpy as np
import pytest
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_input_features, make_move_label

from tests.helpers.hcpe3 import sample_games
from tideborn.data.decode import compiled
from tideborn.data.decode.features import BadRecord, Decoder
from tideborn.data.decode.hcpe3_ops import DONE, SLOW

NO_MOVES = np.zeros(0, dtype=np.int64)


def game_positions() -> tuple[np.ndarray, np.ndarray]:
    """Every position of the shipped games with the move played there."""
    board = cshogi.Board()
    hcps, moves = [], []
    for game in sample_games():
        board.reset()
        for move in game.moves:
            hcp = np.zeros(1, cshogi.HuffmanCodedPos)
            board.to_hcp(hcp)
            hcps.append(hcp["hcp"][0])
            moves.append(cshogi.move16(move))
            board.push(move)
    return np.stack(hcps).astype(np.uint8), np.array(moves, dtype=np.int64)


def random_positions(seed: int, games: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of random legal play; the stored move a legal one, or one in five any 15-bit number."""
    rng = random.Random(seed)
    board = cshogi.Board()
    hcps, moves = [], []
    for _ in range(games):
        board.reset()
        for _ in range(rng.randint(20, 300)):
            legal = list(board.legal_moves)
            if not legal:
                break
            hcp = np.zeros(1, cshogi.HuffmanCodedPos)
            board.to_hcp(hcp)
            move = rng.choice(legal)
            hcps.append(hcp["hcp"][0])
            moves.append(cshogi.move16(move) if rng.random() < 0.8 else rng.randrange(1, 1 << 16))
            board.push(move)
    return np.stack(hcps).astype(np.uint8), np.array(moves, dtype=np.int64)


def run_compiled(packed: np.ndarray, moves16: np.ndarray):
    n = len(packed)
    planes = np.full((n, FEATURES1_NUM, 81), 7, np.uint8)  # not zeroed: the loop clears a row it writes
    hand_planes = np.full((n, FEATURES2_NUM), 7, np.uint8)
    labels = np.zeros(n, np.int64)
    status = np.zeros(n, np.uint8)
    compiled.decode_batch(packed, moves16, np.ones(n, bool), packed, NO_MOVES, NO_MOVES, planes, hand_planes, labels,
                          status)
    return planes, hand_planes, labels, status


def check_against_cshogi(packed: np.ndarray, moves16: np.ndarray) -> dict[str, int]:
    planes, hand_planes, labels, status = run_compiled(packed, moves16)
    board = cshogi.Board()
    f1 = np.zeros((FEATURES1_NUM, 9, 9), np.float32)
    f2 = np.zeros((FEATURES2_NUM, 9, 9), np.float32)
    tally = {"done": 0, "slow": 0, "legal left to cshogi": 0, "in check done": 0, "white done": 0}
    for i in range(len(packed)):
        try:
            board.set_hcp(packed[i])
        except RuntimeError:  # a damaged record cshogi does not decode (every time: past its 256 bits it reads
            assert status[i] == SLOW, i  # what lies beyond them); cshogi names it then
            tally["slow"] += 1
            continue
        move = board.move_from_move16(int(moves16[i]))
        legal = bool(move) and board.is_legal(move)
        if status[i] == SLOW:
            tally["slow"] += 1
            tally["legal left to cshogi"] += legal
            assert (planes[i] == 7).all(), f"position {i}: a row left to cshogi was written"
            continue
        assert status[i] == DONE
        assert legal, f"position {i} ({board.sfen()}): move {int(moves16[i]):#06x} certified, cshogi calls it illegal"
        f1.fill(0)
        f2.fill(0)
        make_input_features(board, f1, f2)
        assert np.array_equal(planes[i], (f1 != 0).reshape(FEATURES1_NUM, 81).astype(np.uint8)), board.sfen()
        assert np.array_equal(hand_planes[i], f2[:, 0, 0].astype(np.uint8)), board.sfen()
        assert labels[i] == make_move_label(move, board.turn), board.sfen()
        tally["done"] += 1
        tally["in check done"] += board.is_check()
        tally["white done"] += board.turn == cshogi.WHITE
    return tally


def test_every_position_of_the_shipped_games_is_decoded_as_cshogi_does():
    packed, moves16 = game_positions()
    tally = check_against_cshogi(packed, moves16)
    # Real games: every move is legal, and the loop certifies all of them but a pawn dropped in front of the king
    # (cshogi's own pawn-drop mate test decides those).
    assert tally["done"] >= 0.99 * len(packed), tally
    assert tally["in check done"] > 100 and tally["white done"] > len(packed) // 3, tally


@pytest.mark.parametrize("seed", [0, 1])
def test_random_play_and_random_stored_moves_agree_with_cshogi(seed):
    packed, moves16 = random_positions(seed, games=120)
    tally = check_against_cshogi(packed, moves16)
    # The random move16s (one in five) are mostly illegal and go to cshogi; legal stored moves are certified but
    # for the rare ones the loop leaves (a pawn dropped in front of the king, an odd move16 cshogi accepts).
    assert tally["done"] >= 0.7 * len(packed), tally
    assert tally["legal left to cshogi"] <= 0.02 * len(packed), tally


def test_damaged_records_are_left_to_cshogi_or_decoded_as_cshogi_does():
    packed, moves16 = game_positions()
    rng = np.random.default_rng(3)
    rows = rng.choice(len(packed), size=3000, replace=False)
    damaged = packed[rows].copy()
    for row in damaged:  # one or two bits flipped past the side to move and the kings
        for bit in rng.choice(np.arange(15, 256), size=rng.integers(1, 3), replace=False):
            row[bit >> 3] ^= 1 << (bit & 7)
    tally = check_against_cshogi(damaged, moves16[rows])
    assert tally["done"] > 0 and tally["slow"] > 0, tally


def records_of(packed: np.ndarray, moves16: np.ndarray) -> np.ndarray:
    records = np.zeros(len(packed), cshogi.HuffmanCodedPosAndEval)
    records["hcp"] = packed
    records["bestMove16"] = moves16.astype(np.uint16).view(np.int16)
    records["eval"] = np.arange(len(packed)) % 600 - 300
    records["gameResult"] = np.arange(len(packed)) % 3
    return records


@pytest.mark.parametrize("bad_records", ["skip", "error"])
def test_a_batch_equals_the_cshogi_only_path_with_skips_and_messages(bad_records):
    packed, moves16 = random_positions(5, games=12)
    records = records_of(packed, moves16)
    records["bestMove16"][[0, 7, len(records) - 1]] = 0
    kwargs = {"kind": "hcpe", "eval_scale": 600.0, "value_lambda": 0.5, "bad_records": bad_records}
    fast, plain = Decoder(**kwargs), Decoder(**kwargs, compiled=False)
    assert plain.compiled is False and fast.compiled is True
    if bad_records == "error":
        with pytest.raises(BadRecord) as fast_error:
            fast.decode(records)
        with pytest.raises(BadRecord) as plain_error:
            plain.decode(records)
        assert (fast_error.value.position, fast_error.value.reason) == (0, 'empty move (data.bad_records="error")')
        assert (fast_error.value.position, fast_error.value.reason) == (plain_error.value.position,
                                                                        plain_error.value.reason)
        return
    out = np.full((len(records), FEATURES1_NUM, 9, 9), 3, np.uint8)  # a worker's array, not zeroed
    got, expected = fast.decode(records, out), plain.decode(records)
    assert got.skipped == expected.skipped and len(got.skipped) > 3
    assert np.shares_memory(got.features1, out)
    for name in ("features1", "features2", "policy", "value", "result", "eval_value"):
        assert np.array_equal(getattr(got, name), getattr(expected, name)), name
    assert not out[len(got):].any()  # the rows past the batch are left zeroed


def test_an_undecodable_record_is_named_as_before():
    packed, moves16 = game_positions()
    records = records_of(packed[:50], moves16[:50])
    records["hcp"][20, 5:] = 0xFF  # no Huffman code fits
    with pytest.raises(BadRecord) as fast_error:
        Decoder("hcpe", 600.0, 0.5).decode(records)
    with pytest.raises(BadRecord) as plain_error:
        Decoder("hcpe", 600.0, 0.5, compiled=False).decode(records)
    assert fast_error.value.position == plain_error.value.position == 20
    assert fast_error.value.reason == plain_error.value.reason
    assert fast_error.value.reason.startswith("undecodable position")


def test_psv_records_keep_the_cshogi_path():
    assert Decoder("psv", 600.0, 0.5).compiled is False


def test_a_range_replays_from_its_anchor_as_cshogi_played_it():
    """`replay_range` (a positions cache read in order) gives the first shipped game's positions from its start and
    from move 10 on; a range with a move it does not certify is left to cshogi whole."""
    game_packed, game_moves = game_positions()
    first_game = len(sample_games()[0].moves)
    for lead in (0, 10):
        rows = first_game - lead
        out = np.zeros((rows, 32), np.uint8)
        steps = np.arange(lead, first_game, dtype=np.int64)
        assert compiled.replay_range(game_packed[:rows], steps, game_moves, lead, out)
        assert np.array_equal(out, game_packed[lead:first_game])
    packed, moves16 = random_positions(7, games=20)
    steps = np.tile(np.arange(len(packed) // 4, dtype=np.int64), 4)[:len(packed)]  # an anchor every ... rows
    assert not compiled.replay_range(packed, steps, moves16, 0, np.zeros_like(packed))


OPEN_DECODE_COUNT = r"""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[2])
from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.decode import compiled
from tideborn.data.sets.sources import BatchDecoder, open_source
path = Path(sys.argv[1])
write_hcpe3(path, sample_games(limit=8), seed=1)
source = open_source([path], processes=1)  # the first open: the walk and the replay
decoder = BatchDecoder(600.0, 0.5)
indices = np.arange(min(len(source), 300))
decoder.decode(source, indices)  # hcpe3 positions replayed from the cache's anchors
out = np.zeros((len(indices), 62, 9, 9), np.uint8)
records = np.concatenate([r for r, _ in source.record_groups(indices)])
decoder.decoder("hcpe").decode(records, out)  # hcpe records, into a worker's array
compiled.prepare_decoder()  # what the loader calls before its workers fork
print(len(compiled.decode_batch.signatures), len(compiled.play_games.signatures), len(compiled.walk_games.signatures))
"""


def test_the_callers_pass_each_loop_one_set_of_argument_types(tmp_path):
    """numba compiles an entry point once per set of argument types (seconds each, on a first run after an edit): a
    first open of hcpe3, a decode of its positions and of hcpe records, and the loader's `prepare_decoder` use one
    compilation of each loop, so the loader's workers inherit the one they decode with."""
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", OPEN_DECODE_COUNT, str(tmp_path / "games.hcpe3"), str(repo)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == ["1", "1", "1"], result.stdout


TINY = """
import sys
from pathlib import Path
from numba import njit
from tideborn.data.decode.compiled import _SturdyCache, sources_stamp
from step import STEP

@njit(cache=True)
def plus_one(x):
    return x + STEP

plus_one._cache = _SturdyCache(plus_one.py_func, sources_stamp(Path("tiny.py"), Path("step.py")))
print(plus_one(41))
"""


def test_a_damaged_cache_file_is_compiled_again_with_one_line(tmp_path):
    """numba raises on a cache file it cannot read (cut short, garbage, a directory at its name); the compiled
    loops' caches (`_SturdyCache`) take it as a miss: the function runs, one line names the file, and the damaged
    index is replaced by the fresh compilation's."""
    from numba.core.dispatcher import Dispatcher  # here: numba's import only where a test runs the JIT

    from tideborn.data.decode import compiled
    from tideborn.data.decode.compiled import _SturdyCache

    assert all(isinstance(f._cache, _SturdyCache) for f in vars(compiled).values() if isinstance(f, Dispatcher))
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "step.py").write_text("STEP = 1\n")
    repo = Path(__file__).resolve().parents[2]

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "tiny.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(repo)})

    first = run()
    assert first.returncode == 0 and first.stdout.split() == ["42"] and not first.stderr, first.stderr
    index = next((tmp_path / "__pycache__").glob("tiny.plus_one-*.nbi"))
    for damage in ("garbage", "cut", "directory"):
        if damage == "garbage":
            index.write_bytes(b"\\x80\\x04not a pickle at all")
        elif damage == "cut":
            index.write_bytes(index.read_bytes()[:10] if index.is_file() else b"\\x80")
        else:
            index.unlink()
            index.mkdir()
        damaged = run()
        assert damaged.returncode == 0 and damaged.stdout.split() == ["42"], damaged.stderr
        lines = damaged.stderr.strip().splitlines()
        assert len(lines) == 1 and str(index) in lines[0] and "compiling again" in lines[0], damaged.stderr
        if damage != "directory":  # the fresh compilation was kept: the next run is quiet
            again = run()
            assert again.returncode == 0 and not again.stderr, again.stderr
    index.rmdir()


def test_the_jit_cache_is_keyed_on_the_sources_contents_not_their_mtime(tmp_path):
    """numba keys its cache on the function's own file (its contents in recent numba, its mtime and size in older
    releases): a constant changed in a module the code reads (as compiled.py reads hcpe3_ops) loaded the old code,
    and under an older numba so did an edit that keeps the size and the mtime. The compiled loops' cache is keyed
    on the contents of both files."""
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "step.py").write_text("STEP = 1\n")
    repo = Path(__file__).resolve().parents[2]

    def run() -> str:
        done = subprocess.run([sys.executable, "tiny.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(repo)})
        assert done.returncode == 0 and not done.stderr, done.stderr
        return done.stdout.strip()

    assert run() == "42"
    assert run() == "42"  # from the cache
    tiny = (tmp_path / "tiny.py").stat()
    (tmp_path / "step.py").write_text("STEP = 2\n")
    assert run() == "43"
    source = (tmp_path / "tiny.py").read_text()
    (tmp_path / "tiny.py").write_text(source.replace("x + STEP", "x - STEP"))  # the same size
    os.utime(tmp_path / "tiny.py", ns=(tiny.st_atime_ns, tiny.st_mtime_ns))
    assert run() == "39"
