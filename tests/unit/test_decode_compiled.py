"""The compiled decode (`tideborn.data.compiled`, issue 23's decode per core) against cshogi itself, position by
position: what it certifies (status DONE) must be exactly cshogi's planes, hand/check values and move label, and
only for moves cshogi calls legal; what it leaves (SLOW) goes to cshogi, so a whole batch through `Decoder` equals
the cshogi-only path (`compiled=False`), messages and skips included. Positions: the shipped games, random play
(white to move, drops, promotions, checks), stored moves drawn at random, and damaged records.

The loops run as a process gets them (`native.loops()`: the module scripts/setup.sh built ahead of time); the
build ahead of time and numba's JIT are held to the same arrays on a whole first open and decode, and the argument
checks in front of both to their signatures."""

from __future__ import annotations

import importlib.machinery
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
from tideborn.data import native
from tideborn.data.features import BadRecord, Decoder
from tideborn.data.hcpe3_ops import DONE, SLOW

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
    native.loops().decode_batch(packed, moves16, np.ones(n, bool), packed, NO_MOVES, NO_MOVES, planes, hand_planes,
                                labels, status)
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


WARM_THEN_USE = r"""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[2])
from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data import compiled, native
from tideborn.data.sources import BatchDecoder, open_source
native._loops = native.jit()  # the JIT's path, as where nothing is built ahead of time
native.warm_jit()
path = Path(sys.argv[1])
write_hcpe3(path, sample_games(limit=8), seed=1)
source = open_source([path], processes=1)  # the first open: the walk and the replay
decoder = BatchDecoder(600.0, 0.5)
indices = np.arange(min(len(source), 300))
decoder.decode(source, indices)  # hcpe3 positions replayed from the cache's anchors
out = np.zeros((len(indices), 62, 9, 9), np.uint8)
records = np.concatenate([r for r, _ in source.record_groups(indices)])
decoder.decoder("hcpe").decode(records, out)  # hcpe records, into a worker's array
native.prepare_decoder()
print(len(compiled.decode_batch.signatures), len(compiled.play_games.signatures), len(compiled.walk_games.signatures))
"""


def test_warming_compiles_the_argument_types_the_callers_pass(tmp_path):
    """Where nothing is built ahead of time, scripts/setup.sh compiles the loops with `native.warm_jit()`; a run
    that then opens hcpe3 and decodes finds each entry point already compiled for its arguments (a second signature
    would be a second compilation)."""
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", WARM_THEN_USE, str(tmp_path / "games.hcpe3"), str(repo)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == ["1", "1", "1"], result.stdout


TINY = """
import sys
from pathlib import Path
from numba import njit
from tideborn.data.compiled import _SturdyCache, sources_stamp
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

    from tideborn.data import compiled
    from tideborn.data.compiled import _SturdyCache

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
    """numba keys its cache on the function's file's mtime and size: a constant changed in a module the code reads
    (as compiled.py reads hcpe3_ops), or an edit that keeps the size and the mtime, loaded the old code. The
    compiled loops' cache is keyed on the contents of both files."""
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


BUILT_AHEAD_ONLY = r"""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[2])
from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data import native
from tideborn.data.sources import BatchDecoder, open_source
path = Path(sys.argv[1])
write_hcpe3(path, sample_games(limit=4), seed=2)
source = open_source([path], processes=1)
batch = BatchDecoder(600.0, 0.5).decode(source, np.arange(len(source)))
print(native.loops().built_ahead, "numba" in sys.modules, len(batch.policy), len(batch.skipped))
"""


def test_setup_built_the_loops_ahead_and_a_process_that_opens_and_decodes_never_imports_numba(tmp_path):
    """scripts/setup.sh (run by scripts/test.sh before the suite) builds the loops ahead of time for this checkout
    and CPU; a first open and a decode then run without numba's import and registries (0.35 s a process)."""
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", BUILT_AHEAD_ONLY, str(tmp_path / "games.hcpe3"), str(repo)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    built_ahead, numba_imported, positions, skipped = result.stdout.splitlines()[-1].split()
    assert (built_ahead, numba_imported, skipped) == ("True", "False", "0"), result.stdout
    assert int(positions) > 100


def test_the_build_ahead_of_time_and_numbas_jit_open_replay_and_decode_alike(tmp_path, monkeypatch):
    """The same first open (walk and replay), cache bytes, decode, and range replay from either build."""
    from tests.helpers.hcpe3 import write_hcpe3
    from tideborn.data.sources import BatchDecoder, open_source

    built = native.loops()
    assert built.built_ahead, built.origin
    outputs = {}
    for name, loops in (("built", built), ("jit", native.jit())):
        monkeypatch.setattr(native, "_loops", loops)
        folder = tmp_path / name
        folder.mkdir()
        write_hcpe3(folder / "games.hcpe3", sample_games(limit=12), seed=4)
        source = open_source([folder / "games.hcpe3"], processes=1)
        batch = BatchDecoder(600.0, 0.5).decode(source, np.arange(len(source)))
        packed, moves16 = random_positions(7, games=20)
        run = run_compiled(packed, moves16)
        steps = np.tile(np.arange(len(packed) // 4, dtype=np.int64), 4)[:len(packed)]  # an anchor every ... rows
        out = np.zeros_like(packed)
        replayed = loops.replay_range(packed, steps, moves16, 0, out)
        # the cache files past their header (which names the source file by inode and mtime)
        outputs[name] = {"cache": {p.name: p.read_bytes()[4096:] for p in sorted(folder.iterdir()) if p.is_file()},
                         "batch": [batch.features1, batch.features2, batch.policy, batch.value],
                         "run": run, "replay": (replayed, out)}
    files = {"games.hcpe3", ".games.hcpe3.positions"}
    assert outputs["built"]["cache"].keys() == outputs["jit"]["cache"].keys() == files
    assert len(outputs["jit"]["cache"][".games.hcpe3.positions"]) > 10_000
    for file_name, content in outputs["jit"]["cache"].items():
        assert outputs["built"]["cache"][file_name] == content, file_name
    for got, expected in zip(outputs["built"]["batch"] + list(outputs["built"]["run"]),
                             outputs["jit"]["batch"] + list(outputs["jit"]["run"])):
        assert np.array_equal(got, expected)
    assert (outputs["built"]["replay"][0], outputs["jit"]["replay"][0]) == (False, False)  # random moves: cshogi's
    assert np.array_equal(outputs["built"]["replay"][1], outputs["jit"]["replay"][1])
    game_packed, game_moves = game_positions()
    first_game = len(sample_games()[0].moves)
    for loops in (built, native.jit()):  # the first shipped game's positions, from its start and from move 10 on
        for lead in (0, 10):
            rows = first_game - lead
            out = np.zeros((rows, 32), np.uint8)
            steps = np.arange(lead, first_game, dtype=np.int64)
            assert loops.replay_range(game_packed[:rows], steps, game_moves, lead, out)
            assert np.array_equal(out, game_packed[lead:first_game])


def test_the_argument_checks_refuse_what_the_built_module_would_misread():
    """The module built ahead of time reads its arguments as the signature says (a wrong dtype crashed it):
    every entry point checks them first, with a TypeError that names the function and the argument."""
    loops = native.loops()
    hcp, out = np.zeros((1, 32), np.uint8), np.zeros((1, 32), np.uint8)
    steps, moves = np.zeros(1, np.int64), np.zeros(0, np.int64)
    read_only = out.copy()
    read_only.flags.writeable = False
    wrong = {"an int32 array": (hcp, steps.astype(np.int32), moves, 0, out),
             "a 2-d array": (hcp, steps.reshape(1, 1), moves, 0, out),
             "a strided view": (np.zeros((1, 64), np.uint8)[:, ::2], steps, moves, 0, out),
             "a read-only output": (hcp, steps, moves, 0, read_only),
             "a float for an int": (hcp, steps, moves, 0.0, out),
             "a list": (hcp.tolist(), steps, moves, 0, out)}
    for what, args in wrong.items():
        with pytest.raises(TypeError, match=r"^replay_range: argument \d") as error:
            loops.replay_range(*args)
        assert "C-contiguous" in str(error.value) or "int" in str(error.value), what
    with pytest.raises(TypeError, match="replay_range: 4 arguments, not 5"):
        loops.replay_range(hcp, steps, moves, 0)
    assert loops.replay_range(hcp, steps, moves, np.int64(0), out) is not None  # numpy's ints are ints


def test_a_stale_or_damaged_build_is_never_loaded(tmp_path, monkeypatch):
    """The built module's name carries a hash of its sources (and of numba's and numpy's versions and this CPU):
    an edited source makes another key, and a file at a key's name that does not load is passed over."""
    for name in native.SOURCES:
        (tmp_path / name).write_bytes((native.HERE / name).read_bytes())
    monkeypatch.setattr(native, "HERE", tmp_path)
    same = native.key()
    assert same == native.key() and same.split("_")[0] != "" and len(same.split("_")) == 2
    (tmp_path / "compiled.py").write_bytes((tmp_path / "compiled.py").read_bytes() + b"\n")
    edited = native.key()
    assert edited.split("_")[0] != same.split("_")[0] and edited.split("_")[1] == same.split("_")[1]
    monkeypatch.undo()
    damaged_key = f"damaged{os.getpid()}"
    damaged = native.HERE / f"{native.PREFIX}{damaged_key}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    damaged.write_bytes(b"\x7fELF cut short")
    try:
        assert native._built_module(damaged_key) is None
    finally:
        damaged.unlink()
    assert native._built_module("no_such_build") is None


def test_a_build_that_cannot_be_written_falls_back_to_the_jit_with_one_line(tmp_path, capsys):
    """Where the module cannot be built (here: its directory is missing), setup's build says so in one line and
    fills numba's cache instead; nothing is left behind."""
    assert native.build_or_fall_back(tmp_path / "missing") is False
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "not built ahead of time (FileNotFoundError" in lines[0], lines
    assert "numba's JIT serves them" in lines[0]
    assert not (tmp_path / "missing").exists()
    from tideborn.data import compiled

    assert all(len(getattr(compiled, name).signatures) >= 1 for name in native.SIGNATURES)


def test_a_build_killed_outright_leaves_a_folder_that_the_next_build_removes(tmp_path):
    """The build works in `._loops.scratch-PID-...` beside the module, removed however it ends; a SIGKILL leaves
    it, and the next build removes it once its process is gone (never a running builder's, never through a
    link)."""
    from tideborn.safefile import SCRATCH_MARK, remove_stale_scratch

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    killed = tmp_path / f"._loops{SCRATCH_MARK}{dead_pid}-abc"
    (killed / "inner").mkdir(parents=True)
    (killed / "inner" / "part.o").write_bytes(b"half a build")
    running = tmp_path / f"._loops{SCRATCH_MARK}{os.getppid()}-def"
    running.mkdir()
    elsewhere = tmp_path / "kept"
    elsewhere.mkdir()
    (elsewhere / "file").write_text("not the build's")
    linked = tmp_path / f"._loops{SCRATCH_MARK}{dead_pid}-link"
    linked.symlink_to(elsewhere)
    removed = remove_stale_scratch(tmp_path / "_loops", folders=True)
    assert sorted(removed) == sorted([killed, linked])
    assert not killed.exists() and not linked.is_symlink() and running.is_dir()
    assert (elsewhere / "file").read_text() == "not the build's"  # the link removed, not followed
