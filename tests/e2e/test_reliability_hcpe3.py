"""hcpe3 teacher data under attack: caches truncated under a running trainer, hostile cache entries (links,
FIFOs, directories, someone else's files, crafted headers, a cache copied from another file), a malformed
hcpe3 file through `train_run start`, and files truncated under a running `data verify` / `data inspect`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.common import (
    REPO_ROOT,
    assert_user_error,
    child_env,
    describe,
    events_of,
    settings_args,
    terminal_events,
    truncated_while_read,
    wait_until,
)
from tests.helpers.hcpe3 import records_of_positions, sample_games, write_hcpe3
from tests.helpers.reliability import launched_runs, tmpfs, tool
from tideborn.config.schema import DataSettings
from tideborn.data.cache import hcpe3 as hcpe3_module
from tideborn.data.cache.cachefile import CacheArray
from tideborn.data.cache.hcpe3 import Hcpe3File, build_positions, cache_path
from tideborn.data.sets.average import averaged_source
from tideborn.data.sets.sources import open_source

TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"
ENDLESS = ("optim.batch_size=32", "runtime.max_steps=100000", "runtime.log_every=1", "runtime.eval_every=100000",
           "runtime.checkpoint_every=100000", 'runtime.progress="plain"', "data.test=[]", 'data.kind="auto"')


@pytest.fixture(scope="module")
def games() -> list:
    return sample_games()


@pytest.fixture
def launched():
    yield from launched_runs()


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Warnings are said once per cache path and process; each test starts with none said."""
    hcpe3_module._warned_unwritable.clear()
    getattr(hcpe3_module, "_decoded_in_memory", {}).clear()  # (a getattr: the same tests run on older code)


# -- 1. a cache truncated under a running trainer --------------------------------------------------------------

@pytest.mark.parametrize("cache", ["positions", "average"])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_cache_truncated_during_training_fails_the_run_naming_it(games, tmp_path, start_trainer, workers, cache):
    """Truncating a memory-mapped cache killed the trainer with SIGBUS (silently with 0 workers; a
    'DataLoader worker killed by signal: Bus error' with 1). Now: run_failed naming the cache and its
    hcpe3 file, exit 2."""
    data = tmp_path / "data"
    data.mkdir()
    write_hcpe3(data / "train.hcpe3", games[:40], seed=1)
    run_dir = tmp_path / "run"
    trainer = start_trainer("train", *settings_args(
        run_dir, f"paths.data_root={str(data)!r}", 'data.train=["train.hcpe3"]', f"data.workers={workers}",
        f"data.use_average={'true' if cache == 'average' else 'false'}", *ENDLESS, config=TEACHER_CONFIG))
    wait_until(lambda: any(e["kind"] == "step" for e in events_of(run_dir)), trainer, "the first step")
    if cache == "positions":
        target = cache_path(data / "train.hcpe3")
    else:
        (target,) = data.glob(".train.hcpe3.average-*.positions")
    os.truncate(target, 4096 + 64)  # the header and a few bytes: what a disk cleanup or a bad copy leaves

    status = trainer.wait()
    assert status == 2, trainer.output()
    ended = terminal_events(events_of(run_dir))
    assert [e["kind"] for e in ended] == ["run_failed"], trainer.output()
    error = ended[0]["error"]
    assert str(target) in error and "changed while the run read it" in error, error
    named = str(data / "train.hcpe3") if cache == "positions" else "data.train"
    assert named in error, error
    assert "Bus error" not in trainer.output() and "Traceback" not in trainer.output()


def test_a_cache_replaced_by_a_rename_under_a_run_is_read_as_it_was(games, tmp_path):
    """A rebuild by another process renames a new cache over the old one: readers holding the old file
    go on reading it (the same inode); a copy of the set pickled for a spawned worker refuses the new one."""
    import pickle

    from tideborn.errors import UserError

    write_hcpe3(tmp_path / "a.hcpe3", games[:4], seed=2)
    positions = Hcpe3File(tmp_path / "a.hcpe3").positions()
    before = np.asarray(positions.hcp).copy()
    pickled = pickle.dumps(positions)
    cache = cache_path(tmp_path / "a.hcpe3")
    other = tmp_path / "other"
    shutil.copyfile(cache, other)
    os.replace(other, cache)  # same bytes, another inode
    assert np.array_equal(positions.hcp[np.arange(len(positions))], before)
    with pytest.raises(UserError, match=r"\.a\.hcpe3\.positions: the positions cache of .*a\.hcpe3 changed while "
                                        r"the run read it \(another file is in its place"):
        pickle.loads(pickled).hcp[0]


# -- 4. a malformed hcpe3 file through train_run start --------------------------------------------------------

def test_start_with_a_malformed_hcpe3_file_says_file_and_game_in_one_line(games, tmp_path, launched):
    """`start` checks hcpe3 files only for being readable and not empty; the trainer decodes them. A game
    whose move does not replay: start waits for the trainer's refusal and says it in one line naming the
    file and the game, exit 2, and takes train.pid and launch.json back as for its other refusals."""
    from tests.helpers.hcpe3 import corrupt

    offset = corrupt(tmp_path / "bad.hcpe3", games, "illegal")
    run_dir = tmp_path / "run"
    launched.append(run_dir)
    result = tool("start", *settings_args(run_dir, f"paths.data_root={str(tmp_path)!r}", 'data.train=["bad.hcpe3"]',
                                          "data.workers=0", *ENDLESS, config=TEACHER_CONFIG))
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, rf"bad\.hcpe3: game 2 \(byte {offset}\): move 1 of \d+: selected move 0x7f7f, "
                                     r"illegal")
    assert not (run_dir / "train.pid").exists() and not (run_dir / "launch.json").exists()
    assert not cache_path(tmp_path / "bad.hcpe3").exists()
    assert "bad.hcpe3: game 2" in (run_dir / "train.log").read_text()


# -- 3. hostile cache entries ----------------------------------------------------------------------------------

@pytest.fixture
def no_hang():
    """Fails a test that blocks (opening a FIFO waits for a writer for ever) instead of hanging the suite."""
    def expired(signum, frame):
        raise TimeoutError("blocked for 60 s (opened a FIFO?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def entry_facts(path: Path) -> tuple:
    """What a cache entry is, without following it: type, owner, group, mode, link target."""
    facts = os.lstat(path)
    return (stat.S_IFMT(facts.st_mode), facts.st_uid, facts.st_gid, stat.S_IMODE(facts.st_mode),
            os.readlink(path) if stat.S_ISLNK(facts.st_mode) else None)


def plant(kind: str, data: Path) -> str:
    """Put a hostile entry where data/a.hcpe3's positions cache goes; returns what the warning must say."""
    cache = cache_path(data / "a.hcpe3")
    if kind == "link-to-passwd":
        cache.symlink_to("/etc/passwd")
        return r"is a symbolic link \(to /etc/passwd\)"
    if kind == "link-to-fifo":
        os.mkfifo(data / "pipe")
        cache.symlink_to(data / "pipe")
        return "is a symbolic link"
    if kind == "link-to-valid-cache":
        # a/s own valid cache, moved elsewhere and linked: swappable by whoever controls the target
        Hcpe3File(data / "a.hcpe3").positions()
        (data / "elsewhere").mkdir()
        os.replace(cache, data / "elsewhere" / "cache")
        cache.symlink_to(data / "elsewhere" / "cache")
        return "is a symbolic link"
    if kind == "directory":
        cache.mkdir()
        return "is a directory, not a regular file"
    if kind == "fifo":
        os.mkfifo(cache)
        return "is a FIFO"
    if kind in ("other-user", "world-writable", "group-writable"):
        Hcpe3File(data / "a.hcpe3").positions()  # a valid cache of the right file...
        if kind == "other-user":
            os.chown(cache, 4242, 4242)  # ...that someone else could have crafted
            return "belongs to uid 4242, neither you nor the owner of the data"
        if kind == "world-writable":
            os.chmod(cache, 0o666)
            return r"is writable by others \(mode 666\)"
        os.chown(cache, -1, 4242)  # a group that is not the owner's own
        os.chmod(cache, 0o664)
        return r"is writable by others \(mode 664\)"
    raise AssertionError(kind)


HOSTILE = ["link-to-passwd", "link-to-fifo", "link-to-valid-cache", "directory", "fifo", "other-user",
           "world-writable", "group-writable"]


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_cache_entry_is_left_alone_and_decoded_in_memory_with_one_warning(games, tmp_path, no_hang, kind,
                                                                                     read_only):
    """Never followed, never waited on, never trusted or replaced: the positions are decoded in memory, one
    warning names the entry and why, and the entry is as it was (on a read-only data mount too)."""
    if kind in ("other-user", "group-writable") and os.geteuid() != 0:
        pytest.skip("giving a file to another user or group needs root")
    with contextlib.ExitStack() as stack:
        data = stack.enter_context(tmpfs(tmp_path / "data", "size=4m")) if read_only else tmp_path / "data"
        data.mkdir(exist_ok=True)
        write_hcpe3(data / "a.hcpe3", games[:3], seed=100)
        want = build_positions(data / "a.hcpe3")["arrays"]
        said = plant(kind, data)
        before = entry_facts(cache_path(data / "a.hcpe3"))
        passwd = Path("/etc/passwd").read_bytes()
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(data)], check=True)
        warnings: list[str] = []
        for _ in range(2):
            got = Hcpe3File(data / "a.hcpe3", warn=warnings.append).positions()
            assert np.array_equal(np.asarray(got.hcp), want["hcp"])
            assert np.array_equal(np.asarray(got.cand_visits), want["cand_visits"])
            assert not isinstance(got.hcp, CacheArray), "decoded in memory, not read from the entry"
        assert len(warnings) == 1, warnings
        assert re.search(rf"a\.hcpe3: decoded in memory, .*\.a\.hcpe3\.positions {said}", warnings[0]), warnings[0]
        assert entry_facts(cache_path(data / "a.hcpe3")) == before, "the entry is left as it was"
        assert Path("/etc/passwd").read_bytes() == passwd
        assert not [p for p in data.iterdir() if ".tmp-" in p.name]


def test_a_run_with_a_fifo_for_its_cache_trains_decoding_once_with_one_warning(games, tmp_path, no_hang):
    """End to end: the trainer's checks and its data loader share the positions decoded in memory (one
    'decoding' line, one warning), and the FIFO is neither opened for good nor replaced."""
    from tests.helpers.common import trainer_in_process

    write_hcpe3(tmp_path / "a.hcpe3", games[:6], seed=106)
    os.mkfifo(cache_path(tmp_path / "a.hcpe3"))
    # In this process (the warnings said once a process start with none said: `fresh_warnings`); a FIFO
    # opened for good would block, and `no_hang` fails the test instead of hanging the suite.
    done = trainer_in_process("train", *settings_args(
        tmp_path / "run", f"paths.data_root={str(tmp_path)!r}", 'data.train=["a.hcpe3"]', "data.workers=0",
        "optim.batch_size=16", "runtime.max_steps=2", "data.test=[]", 'data.kind="auto"', config=TEACHER_CONFIG),
        cwd=tmp_path)
    assert done.returncode == 0, describe(done)
    output = done.stdout + done.stderr
    assert output.count("hcpe3: decoding") == 1, output
    warnings = [line for line in done.stderr.splitlines() if "decoded in memory" in line]
    assert len(warnings) == 1 and "is a FIFO" in warnings[0], done.stderr
    assert stat.S_ISFIFO(os.lstat(cache_path(tmp_path / "a.hcpe3")).st_mode)


def test_a_hostile_averaged_cache_is_left_alone_and_averaged_in_memory(games, tmp_path, no_hang):
    write_hcpe3(tmp_path / "a.hcpe3", games[:3], seed=101)
    write_hcpe3(tmp_path / "b.hcpe3", games[:3], seed=102)
    paths = [tmp_path / "a.hcpe3", tmp_path / "b.hcpe3"]
    settings = DataSettings(train=tuple(str(p) for p in paths), use_average=True)
    reference = averaged_source(open_source(paths), settings)
    cache = Path(reference.note["average"]["cache"])
    want = np.asarray(reference.parts[0].arrays["cand_prob"])
    cache.unlink()
    os.mkfifo(cache)
    warnings: list[str] = []
    again = averaged_source(open_source(paths), settings, warn=warnings.append)
    assert np.array_equal(np.asarray(again.parts[0].arrays["cand_prob"]), want)
    assert len(warnings) == 1 and re.search(r"\.a\.hcpe3\.average-\w+\.positions is a FIFO", warnings[0]), warnings
    assert stat.S_ISFIFO(os.lstat(cache).st_mode)


def test_a_cache_copied_from_another_file_of_the_same_size_and_mtime_is_not_trusted(games, tmp_path):
    """b.hcpe3 is a.hcpe3 with one visit count changed where the 64 sampled pieces do not look, and a's
    mtime; a's cache copied as b's. Size, mtime and the sampled digest all agree: the file's identity (another
    inode) sends it to the whole-content hash, which does not."""
    written = write_hcpe3(tmp_path / "a.hcpe3", games[:6], seed=103)
    size = (tmp_path / "a.hcpe3").stat().st_size
    sampled = [(size - 64) * i // 63 for i in range(64)]
    # byte offsets of every visitNum, and one no sample covers
    fields, offset = [], 0
    for game in written:
        offset += 36
        for candidates in game.candidates:
            offset += 6
            fields.extend(offset + 4 * k + 2 for k in range(len(candidates)))
            offset += 4 * len(candidates)
    field = next(f for f in fields[len(fields) // 2:] if all(not s - 2 <= f < s + 64 for s in sampled))
    data = bytearray((tmp_path / "a.hcpe3").read_bytes())
    visits = int.from_bytes(data[field:field + 2], "little")
    data[field:field + 2] = (visits + 1).to_bytes(2, "little")
    (tmp_path / "b.hcpe3").write_bytes(bytes(data))
    facts = (tmp_path / "a.hcpe3").stat()
    os.utime(tmp_path / "b.hcpe3", ns=(facts.st_atime_ns, facts.st_mtime_ns))
    a = Hcpe3File(tmp_path / "a.hcpe3").positions()
    shutil.copyfile(cache_path(tmp_path / "a.hcpe3"), cache_path(tmp_path / "b.hcpe3"))
    b = Hcpe3File(tmp_path / "b.hcpe3").positions()
    want = build_positions(tmp_path / "b.hcpe3")["arrays"]["cand_visits"]
    assert not np.array_equal(want, np.asarray(a.cand_visits))
    assert np.array_equal(np.asarray(b.cand_visits), want), "b's own visit counts, not a's cache"
    # the rebuilt cache is b's, and it is read (not rebuilt) next time
    built = cache_path(tmp_path / "b.hcpe3").stat().st_mtime_ns
    assert np.array_equal(np.asarray(Hcpe3File(tmp_path / "b.hcpe3").positions().cand_visits), want)
    assert cache_path(tmp_path / "b.hcpe3").stat().st_mtime_ns == built
    # moved to another directory with its cache (another inode, the same content): read, not rebuilt
    (tmp_path / "moved").mkdir()
    shutil.copy2(tmp_path / "b.hcpe3", tmp_path / "moved" / "b.hcpe3")
    shutil.copy2(cache_path(tmp_path / "b.hcpe3"), cache_path(tmp_path / "moved" / "b.hcpe3"))
    moved = Hcpe3File(tmp_path / "moved" / "b.hcpe3").positions()
    assert isinstance(moved.cand_visits, CacheArray) and np.array_equal(np.asarray(moved.cand_visits), want)


def craft(header: dict, how: str) -> None:
    arrays = header["arrays"]
    if how == "huge-shape":
        arrays["hcp"][2] = [2**40, 32]
        header["positions"] = 2**40
    elif how == "shape-overflowing-int64":
        arrays["cand_visits"][2] = [2**62, 2**40]
    elif how == "object-dtype":
        arrays["eval"][1] = "|O"
    elif how == "offset-in-header":
        arrays["hcp"][0] = 0
    elif how == "negative-offset":
        arrays["hcp"][0] = -4096
    elif how == "three-dimensions":
        arrays["hcp"][2] = [arrays["hcp"][2][0], 4, 8, 1]
    elif how == "not-a-list":
        arrays["label"] = {"offset": 4096}


@pytest.mark.parametrize("how", ["huge-shape", "shape-overflowing-int64", "object-dtype", "offset-in-header",
                                 "negative-offset", "three-dimensions", "not-a-list"])
def test_a_cache_with_a_crafted_header_is_rebuilt(games, tmp_path, how):
    write_hcpe3(tmp_path / "a.hcpe3", games[:3], seed=104)
    want = build_positions(tmp_path / "a.hcpe3")["arrays"]
    Hcpe3File(tmp_path / "a.hcpe3").positions()
    cache = cache_path(tmp_path / "a.hcpe3")
    data = bytearray(cache.read_bytes())
    header = json.loads(data[:4096].split(b"\n", 1)[0])
    craft(header, how)
    data[:4096] = (json.dumps(header).encode() + b"\n").ljust(4096, b" ")
    cache.write_bytes(bytes(data))
    got = Hcpe3File(tmp_path / "a.hcpe3").positions()
    assert np.array_equal(np.asarray(got.hcp), want["hcp"]) and np.array_equal(np.asarray(got.eval), want["eval"])
    # rebuilt whole (in the compact layout, whose stored hcp are a few positions' each)
    rebuilt = json.loads(cache.read_bytes()[:4096].split(b"\n", 1)[0])
    assert rebuilt["positions"] == len(want["hcp"])
    assert hcpe3_module.read_arrays(cache, hcpe3_module.CACHE_FORMAT) is not None


def test_candidate_offsets_damaged_in_place_under_a_run_are_named_not_an_index_error(games, tmp_path):
    """The cache is checked when opened; bytes changed in place afterwards (same size) are caught where
    they would index past the candidates: one line naming the cache."""
    from tideborn.errors import UserError

    write_hcpe3(tmp_path / "a.hcpe3", games[:3], seed=105)
    positions = Hcpe3File(tmp_path / "a.hcpe3").positions()
    cache = cache_path(tmp_path / "a.hcpe3")
    offset = json.loads(cache.read_bytes()[:4096].split(b"\n", 1)[0])["arrays"]["cand_offsets"][0]
    with open(cache, "r+b") as handle:
        handle.seek(offset + 8 * 10)
        handle.write((10**12).to_bytes(8, "little"))
    with pytest.raises(UserError, match=r"\.a\.hcpe3\.positions: the positions cache of .*a\.hcpe3 is damaged"):
        positions.targets(np.arange(5, 15), 1.0)


# -- 2. files truncated under a running `data verify` / `data inspect` -----------------------------------------

@pytest.fixture(scope="module")
def big_files(games, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Teacher files that take `verify` seconds: the sample games' positions as hcpe and psv records, and
    as hcpe3 games, repeated (an hcpe3 file is its games one after another)."""

    root = tmp_path_factory.mktemp("big")
    write_hcpe3(root / "one.hcpe3", games, seed=200)
    (root / "big.hcpe3").write_bytes((root / "one.hcpe3").read_bytes() * 24)
    positions = build_positions(root / "one.hcpe3")["arrays"]
    hcpe, psv = records_of_positions(positions, psv_results=False)
    repeat = -(-700_000 // len(hcpe))  # about 11 of inspect's 65,536-record chunks
    np.tile(hcpe, repeat).tofile(root / "big.hcpe")
    np.tile(psv, repeat).tofile(root / "big.psv")
    return {"hcpe": root / "big.hcpe", "psv": root / "big.psv", "hcpe3": root / "big.hcpe3"}


@pytest.mark.parametrize("command", ["verify", "inspect"])
@pytest.mark.parametrize("kind", ["hcpe", "psv", "hcpe3"])
def test_a_file_truncated_under_a_running_data_command_is_one_line_exit_2(big_files, tmp_path, command, kind):
    """A memory map of the file killed verify and inspect with SIGBUS (exit -7, no message). Read in
    chunks: one line naming the file, exit 2."""
    path = tmp_path / big_files[kind].name
    shutil.copyfile(big_files[kind], path)
    done = truncated_while_read([sys.executable, "-m", "tideborn.data", command, str(path), "--quiet"], path,
                                cwd=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert_user_error(done.stderr, rf"{re.escape(str(path))}: changed while it was read")


# -- 5. DDP: one decode a node ---------------------------------------------------------------------------------

def test_under_torchrun_the_cache_is_built_once_and_training_matches_a_run_that_found_it(games, tmp_path):
    """Two CPU ranks (gloo), no cache yet: local rank 0 decodes while rank 1 waits, then both read the
    cache (one 'decoding' line, not one per rank). A second run that finds the cache trains to the same weights."""
    import torch

    from tests.helpers.torchrun import TORCHRUN, parameters

    data = tmp_path / "data"
    data.mkdir()
    write_hcpe3(data / "train.hcpe3", games * 3, seed=300)

    def run(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*TORCHRUN, "-m", "tideborn.trainer", "train", *settings_args(
                tmp_path / name, f"paths.data_root={str(data)!r}", 'data.train=["train.hcpe3"]', "data.test=[]",
                'data.kind="auto"', "data.workers=0", "optim.batch_size=16", "runtime.max_steps=4",
                "runtime.checkpoint_every=4", "runtime.log_every=1", 'runtime.progress="plain"',
                config=TEACHER_CONFIG)],
            cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)

    first = run("first")
    assert first.returncode == 0, describe(first)
    output = first.stdout + first.stderr
    assert output.count("hcpe3: decoding") == 1, output
    assert cache_path(data / "train.hcpe3").is_file()
    second = run("second")
    assert second.returncode == 0, describe(second)
    assert "hcpe3: decoding" not in second.stdout + second.stderr
    one, two = (parameters(tmp_path / name / "step-000000004.pt") for name in ("first", "second"))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
