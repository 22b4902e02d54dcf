"""Teacher data under change and the data tools' outputs: what a user is left with when things go wrong.

A teacher file truncated while training reads it; `export`, `data convert` and `data split` writing
over things that are not regular files, under a permissive umask, onto a full disk, interrupted with
Ctrl-C or SIGKILL; a split interrupted between its two files; paths that name the same file twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import typing
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.common import (
    REPO_ROOT,
    child_env,
    console_script,
    describe,
    events_of,
    settings_args,
    terminal_events,
    train,
    trainer_in_process,
    truncated_while_read,
    wait_until,
)
from tests.helpers.data import hcpe_records, random_csa_games, random_positions, write_records
from tideborn.data.formats.records import RECORD_DTYPES
from tideborn.data.tools.convert import convert_games
from tideborn.data.tools.split import split_games

TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"
HCPE_SIZE = RECORD_DTYPES["hcpe"].itemsize


# -- a teacher file truncated during training ----------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 1])
def test_a_teacher_file_truncated_during_training_fails_the_run_naming_it(tmp_path, start_trainer, workers):
    train_file = write_records(tmp_path / "data" / "train.hcpe", hcpe_records(random_positions(3000)))
    run_dir = tmp_path / "run"
    trainer = start_trainer("train", *settings_args(
        run_dir, f"paths.data_root={str(tmp_path / 'data')!r}", 'data.train=["train.hcpe"]', "data.test=[]",
        f"data.workers={workers}", "optim.batch_size=32", "runtime.max_steps=100000", "runtime.log_every=1",
        "runtime.eval_every=100000", "runtime.checkpoint_every=100000", 'runtime.progress="plain"',
        config=TEACHER_CONFIG))
    wait_until(lambda: any(e["kind"] == "step" for e in events_of(run_dir)), trainer, "the first step")
    # What a `cp other.hcpe train.hcpe` or a disk cleanup does under a running trainer: the file shrinks.
    os.truncate(train_file, 40 * HCPE_SIZE)

    status = trainer.wait()
    assert status == 2, trainer.output()  # a user error: one line, no traceback, no "Bus error"
    ended = terminal_events(events_of(run_dir))
    assert [e["kind"] for e in ended] == ["run_failed"], trainer.output()
    error = ended[0]["error"]
    assert str(train_file) in error and "changed while training read it" in error, error
    assert "1,520 bytes now" in error and "3,000 records" in error
    assert "Bus error" not in trainer.output() and "Traceback" not in trainer.output()


# -- helpers ---------------------------------------------------------------------------------------------------

FAULT_SITE = r'''
"""Test-only (tests/e2e/test_reliability_data_outputs.py), loaded through PYTHONPATH (or run in the test
process for the disk-full fault, `fault_in_process`):
TIDEBORN_FAULT_OUTPUT="NAME:sigint": this process gets a real SIGINT once the temp file of output NAME is
fsynced (complete, not yet published), as if Ctrl-C was pressed then.
TIDEBORN_FAULT_OUTPUT="NAME:enospc:BYTES": writes to that temp file fail with ENOSPC after BYTES bytes, as
a disk filling up does.
"""
import errno
import os
import signal

_spec = os.environ.get("TIDEBORN_FAULT_OUTPUT")
if _spec:
    _name, _action, *_rest = _spec.split(":")

    def _is_target(fd):
        try:
            return os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(f".{_name}.tmp-")
        except OSError:
            return False

    if _action == "sigint":
        _real_fsync = os.fsync

        def fsync(fd):
            _real_fsync(fd)
            if _is_target(fd if isinstance(fd, int) else fd.fileno()):
                os.kill(os.getpid(), signal.SIGINT)

        os.fsync = fsync
    elif _action == "enospc":
        _limit = int(_rest[0])
        _real_fdopen = os.fdopen

        class _Full:
            def __init__(self, handle):
                self.handle, self.written = handle, 0

            def write(self, data):
                data = memoryview(data).cast("B")
                room = _limit - self.written
                if len(data) > room:
                    if room > 0:
                        self.handle.write(data[:room])
                        self.handle.flush()
                        self.written = _limit
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.written += len(data)
                return self.handle.write(data)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.handle.close()

            def __getattr__(self, name):
                return getattr(self.handle, name)

        def fdopen(fd, *args, **kwargs):
            handle = _real_fdopen(fd, *args, **kwargs)
            return _Full(handle) if _is_target(fd) else handle

        os.fdopen = fdopen
'''


def fault_env(tmp_path: Path, spec: str) -> dict[str, str]:
    site = tmp_path / "fault-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(FAULT_SITE)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)]), "TIDEBORN_FAULT_OUTPUT": spec}


@contextlib.contextmanager
def fault_in_process(monkeypatch: pytest.MonkeyPatch, spec: str) -> typing.Iterator[None]:
    """FAULT_SITE's fault in this process for the block: the patch a process would get at its start, undone
    after. For the disk-full fault only; a SIGINT is sent to a process of its own (`fault_env`)."""
    assert ":enospc:" in spec, spec
    with monkeypatch.context() as patch:
        patch.setattr(os, "fdopen", os.fdopen)  # FAULT_SITE replaces it; the context puts the real one back
        patch.setenv("TIDEBORN_FAULT_OUTPUT", spec)
        exec(compile(FAULT_SITE, "sitecustomize.py", "exec"), {"__name__": "sitecustomize"})
        yield


def run_tool(command: list[str], cwd: Path, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """`command` as a real process. A tool that hangs (a FIFO opened for reading waits for a writer for
    ever) fails the test instead of hanging the suite."""
    try:
        return subprocess.run(command, cwd=cwd, env=child_env(env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s (hung?)")


def run_data(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return run_tool([sys.executable, "-m", "tideborn.data", *args], cwd, **kwargs)


def run_export(checkpoint: Path, out: Path, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return run_tool([str(console_script()), "export", "--checkpoint", str(checkpoint), "--out", str(out)], cwd,
                    **kwargs)


def in_process(main: typing.Callable[[list[str]], int], argv: list[str], cwd: Path,
               capfd: pytest.CaptureFixture[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """A command's `main(argv)` run in this process, in `cwd`, as its process would end: what it writes to file
    descriptors 1 and 2 and Python's warnings on stderr, argparse's refusals as exit statuses. It saves a
    process's start (torch, onnx and onnxruntime imported again, for an export) where a test reads only the
    exit status, the message and the files; Ctrl-C, a file cut under a running command and a FIFO given as
    an input keep a real process. A command that blocks (a FIFO opened for writing waits for a reader for
    ever) fails the test after `timeout` seconds instead of hanging the suite."""
    def expired(signum, frame):
        raise TimeoutError(f"{' '.join(argv)} did not finish in {timeout} s (blocked?)")

    capfd.readouterr()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(timeout)
    try:
        with contextlib.chdir(cwd), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    printed, said = capfd.readouterr()
    said += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    return subprocess.CompletedProcess(argv, code, printed, said)


def data_in_process(*args: str, cwd: Path, capfd: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    """`python -m tideborn.data ARGS` in this process (`in_process`)."""
    from tideborn.data.tools.cli import main

    return in_process(main, list(args), cwd, capfd)


def export_in_process(checkpoint: Path, out: Path, cwd: Path,
                      capfd: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    """`tideborn export` through the console script's own entry point (`tideborn.cli.main`), in this process."""
    from tideborn.cli import main

    return in_process(main, ["export", "--checkpoint", str(checkpoint), "--out", str(out)], cwd, capfd)


@contextlib.contextmanager
def umask_000() -> typing.Iterator[None]:
    """This process's umask is 000 for the block, and as it was after it, however the block ends."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if ".tmp" in p.name)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def games_hcpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted hcpe file of 40 random games, with its game index."""
    root = tmp_path_factory.mktemp("games")
    random_csa_games(root / "games", 40)
    convert_games([root / "games"], root / "all.hcpe", progress=False)
    return root / "all.hcpe"


def split_into(source: Path, directory: Path, seed: int) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    train, test = directory / "train.hcpe", directory / "test.hcpe"
    split_games(source, train, test, test_fraction=0.3, seed=seed, progress=False)
    return train, test


def one_line(result: subprocess.CompletedProcess, pattern: str) -> str:
    assert "Traceback" not in result.stderr, describe(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, describe(result)
    assert re.search(pattern, lines[0]), f"{pattern!r} not in {lines[0]!r}"
    return lines[0]


def make_special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
        except PermissionError:
            pytest.skip("creating a device node needs root (CAP_MKNOD)")
    else:
        path.mkdir()


def same_kind(path: Path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return {"fifo": stat.S_ISFIFO, "device": stat.S_ISCHR, "directory": stat.S_ISDIR}[kind](mode)


# -- outputs are regular files, 0o644 whatever the umask -------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_data_outputs_refuse_to_replace_what_is_not_a_regular_file(games_hcpe, tmp_path, capfd, kind):
    make_special(tmp_path / "special.hcpe", kind)
    done = data_in_process("convert", str(games_hcpe.parent / "games"), "--output", "special.hcpe", cwd=tmp_path,
                           capfd=capfd)
    assert done.returncode == 2, describe(done)
    one_line(done, rf"--output special\.hcpe: is a {'directory' if kind == 'directory' else ''}")
    for flag in ("--train", "--test"):
        other = "--test" if flag == "--train" else "--train"
        done = data_in_process("split", str(games_hcpe), flag, "special.hcpe", other, "other.hcpe", cwd=tmp_path,
                               capfd=capfd)
        assert done.returncode == 2, describe(done)
        one_line(done, rf"{flag} special\.hcpe: is a")
    assert same_kind(tmp_path / "special.hcpe", kind), "the special file was replaced"
    assert temp_files(tmp_path) == [] and not (tmp_path / "other.hcpe").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_export_refuses_to_replace_what_is_not_a_regular_file(template_run, tmp_path, kind):
    make_special(tmp_path / "model.onnx", kind)
    done = run_export(template_run / "step-000000004.pt", tmp_path / "model.onnx", cwd=tmp_path)
    assert done.returncode == 2, describe(done)
    one_line(done, r"^tideborn export: error: --out \S+/model\.onnx: is a (FIFO \(named pipe\)|character device); "
                   r"name a regular file")
    assert same_kind(tmp_path / "model.onnx", kind) and temp_files(tmp_path) == []


def test_data_outputs_are_0o644_and_their_directories_0o755_under_umask_000(games_hcpe, tmp_path, capfd):
    games = str(games_hcpe.parent / "games")
    with umask_000():
        converted = data_in_process("convert", games, "--output", "new/dir/all.hcpe", "--quiet", cwd=tmp_path,
                                    capfd=capfd)
        assert converted.returncode == 0
        done = data_in_process("split", "new/dir/all.hcpe", "--train", "a/train.hcpe", "--test", "b/test.hcpe",
                               "--quiet", "--test-fraction", "0.3", cwd=tmp_path, capfd=capfd)
    assert done.returncode == 0, describe(done)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert modes == {"new": 0o755, "new/dir": 0o755, "new/dir/all.hcpe": 0o644, "new/dir/all.games.csv": 0o644,
                     "a": 0o755, "a/train.hcpe": 0o644, "a/train.games.csv": 0o644,
                     "b": 0o755, "b/test.hcpe": 0o644, "b/test.games.csv": 0o644}


def test_export_writes_0o644_under_umask_000_and_removes_a_killed_exports_temp_file(template_run, tmp_path, capfd):
    # A temp file of an export that was SIGKILLed (its process is gone), and one of an export still running
    # (this process's parent stands for it: the export runs in this process, and its own temp file is this pid's).
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed = tmp_path / f".model.onnx.tmp-{gone.pid}"
    running = tmp_path / f".model.onnx.tmp-{os.getppid()}"
    killed.write_bytes(b"half a model")
    running.write_bytes(b"another export's model, being written")

    with umask_000():
        done = export_in_process(template_run / "step-000000004.pt", tmp_path / "model.onnx", tmp_path, capfd)
    assert done.returncode == 0, describe(done)
    assert stat.S_IMODE((tmp_path / "model.onnx").stat().st_mode) == 0o644
    assert not killed.exists(), "the killed export's temp file was left behind"
    assert running.exists(), "a running export's temp file was removed"



def test_the_model_a_run_exports_into_its_run_directory_is_0o644_under_umask_000(tmp_path):
    run_dir = tmp_path / "run"
    with umask_000():
        train(run_dir, "runtime.max_steps=2", "optim.batch_size=16", "runtime.export_onnx=true", cwd=tmp_path)
    model = run_dir / "step-000000002.onnx"
    assert model.is_file() and stat.S_IMODE(model.stat().st_mode) == 0o644

# -- split publishes its pair as a pair; a mixed pair is refused ----------------------------------------------

def teacher_sets(directory: Path, run_dir: Path) -> list[str]:
    return settings_args(run_dir, f"paths.data_root={str(directory)!r}", 'data.train=["train.hcpe"]',
                         'data.test=["test.hcpe"]', "runtime.max_steps=2", "optim.batch_size=16",
                         'runtime.progress="plain"', config=TEACHER_CONFIG)


def test_a_train_and_test_file_from_two_splits_are_refused_by_train_and_verify(games_hcpe, tmp_path, capfd):
    first_train, _ = split_into(games_hcpe, tmp_path / "first", seed=1)
    _, second_test = split_into(games_hcpe, tmp_path / "second", seed=2)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for path in (first_train, first_train.with_suffix(".games.csv"), second_test,
                 second_test.with_suffix(".games.csv")):
        shutil.copy2(path, mixed / path.name)

    trained = trainer_in_process("train", *teacher_sets(mixed, tmp_path / "run"), cwd=tmp_path)
    assert trained.returncode == 2, describe(trained)
    one_line(trained, rf"{mixed / 'train.hcpe'} and {mixed / 'test.hcpe'} come from different `data split` runs")
    assert not (tmp_path / "run").exists()

    verified = data_in_process("verify", "mixed/train.hcpe", "--quiet", cwd=tmp_path, capfd=capfd)
    assert verified.returncode == 1, describe(verified)
    assert "come from different `data split` runs" in verified.stdout

    # the same files from one split train
    ok = trainer_in_process("train", *teacher_sets(tmp_path / "first", tmp_path / "run"), cwd=tmp_path)
    assert ok.returncode == 0, describe(ok)
    assert data_in_process("verify", "first/train.hcpe", "first/test.hcpe", "--quiet", cwd=tmp_path,
                           capfd=capfd).returncode == 0


class _Killed(BaseException):
    """Stands for SIGKILL between two renames (the temp files it leaves are removed by the next writer)."""


@pytest.mark.parametrize("renames_done", [1, 2, 3])
def test_a_split_killed_between_its_renames_leaves_a_pair_that_is_refused(games_hcpe, tmp_path, monkeypatch,
                                                                          renames_done):
    from tideborn.data.formats.game_index import check_pairs
    from tideborn.data.tools.cli import main as data_main
    from tideborn.errors import UserError

    train, test = split_into(games_hcpe, tmp_path / "pair", seed=1)
    real_replace, done = os.replace, []

    def replace_then_die(source, target):
        if len(done) == renames_done:
            raise _Killed
        real_replace(source, target)
        done.append(Path(target).name)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(_Killed):
        split_games(games_hcpe, train, test, test_fraction=0.3, seed=2, progress=False)
    monkeypatch.undo()
    assert done == ["train.hcpe", "test.hcpe", "train.games.csv"][:renames_done]

    with pytest.raises(UserError, match="written for another version of|come from different `data split` runs"):
        check_pairs([train], [test])
    assert data_main(["verify", str(train), "--quiet"]) == 1


def test_ctrl_c_while_split_writes_keeps_the_old_pair_and_leaves_no_temp_file(games_hcpe, tmp_path):
    split_into(games_hcpe, tmp_path / "pair", seed=1)
    before = snapshot(tmp_path / "pair")
    # A real SIGINT once the new test file is complete, before anything is published.
    done = run_data("split", str(games_hcpe), "--train", "pair/train.hcpe", "--test", "pair/test.hcpe",
                    "--seed", "2", "--test-fraction", "0.3", cwd=tmp_path, env=fault_env(tmp_path, "test.hcpe:sigint"))
    assert done.returncode == 130, describe(done)
    one_line(done, r"^python -m tideborn\.data split: interrupted \(Ctrl-C\); nothing half-written is left$")
    assert snapshot(tmp_path / "pair") == before
    assert temp_files(tmp_path / "pair") == []


def big_split_source(games_hcpe: Path, path: Path, copies: int) -> Path:
    """`games_hcpe` repeated `copies` times, with a game index to match: a source `split` hashes for seconds."""
    from tideborn.data.formats.game_index import IndexHeader, index_path, read_index, write_index
    from tideborn.data.formats.records import records_fingerprint

    records = np.fromfile(games_hcpe, dtype=RECORD_DTYPES["hcpe"])
    games = read_index(index_path(games_hcpe), len(records))
    np.tile(records, copies).tofile(path)
    entries = [replace(game, first_record=game.first_record + copy * len(records))
               for copy in range(copies) for game in games]
    with open(index_path(path), "wb") as handle:
        write_index(handle, entries, IndexHeader(copies * len(records), records_fingerprint(path)))
    return path


def test_a_source_truncated_under_a_running_split_is_one_line_and_keeps_the_old_pair(games_hcpe, tmp_path):
    """A memory map of the source killed split with SIGBUS (exit -7, no message). Read in chunks: one line
    naming the file, exit 2, the old pair as it was and no temp file."""
    split_into(games_hcpe, tmp_path / "pair", seed=1)
    before = snapshot(tmp_path / "pair")
    source = big_split_source(games_hcpe, tmp_path / "big.hcpe", -(-700_000 // (games_hcpe.stat().st_size
                                                                                  // HCPE_SIZE)))
    done = truncated_while_read(
        [sys.executable, "-m", "tideborn.data", "split", str(source), "--train", "pair/train.hcpe",
         "--test", "pair/test.hcpe", "--seed", "2", "--quiet"], source, cwd=tmp_path)
    assert done.returncode == 2, describe(done)
    one_line(done, rf"{re.escape(str(source))}: changed while it was read")
    assert snapshot(tmp_path / "pair") == before
    assert temp_files(tmp_path / "pair") == []


def test_ctrl_c_while_convert_writes_leaves_no_temp_file(games_hcpe, tmp_path):
    done = run_data("convert", str(games_hcpe.parent / "games"), "--output", "out/all.hcpe", cwd=tmp_path,
                    env=fault_env(tmp_path, "all.hcpe:sigint"))
    assert done.returncode == 130, describe(done)
    one_line(done, r"^python -m tideborn\.data convert: interrupted \(Ctrl-C\); nothing half-written is left$")
    assert list((tmp_path / "out").iterdir()) == []


def test_ctrl_c_while_export_writes_keeps_the_old_model_and_leaves_no_temp_file(template_run, tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"the previous model")
    done = run_export(template_run / "step-000000004.pt", tmp_path / "model.onnx", cwd=tmp_path,
                      env=fault_env(tmp_path, "model.onnx:sigint"))
    assert done.returncode == 130, describe(done)
    one_line(done, r"^tideborn export: interrupted \(Ctrl-C\); nothing half-written is left$")
    assert (tmp_path / "model.onnx").read_bytes() == b"the previous model"
    assert temp_files(tmp_path) == []


# -- a full disk --------------------------------------------------------------------------------------------

def test_a_full_disk_while_split_writes_is_named_and_keeps_the_old_pair(games_hcpe, tmp_path, monkeypatch, capfd):
    split_into(games_hcpe, tmp_path / "pair", seed=1)
    before = snapshot(tmp_path / "pair")
    # the train file is written; the test file gets 1,000 bytes in, then the disk is full
    with fault_in_process(monkeypatch, "test.hcpe:enospc:1000"):
        done = data_in_process("split", str(games_hcpe), "--train", "pair/train.hcpe", "--test", "pair/test.hcpe",
                               "--seed", "2", "--test-fraction", "0.3", cwd=tmp_path, capfd=capfd)
    assert done.returncode == 2, describe(done)
    one_line(done, r"^python -m tideborn\.data split: error: disk full writing pair/test\.hcpe; nothing was replaced")
    assert snapshot(tmp_path / "pair") == before
    assert temp_files(tmp_path / "pair") == []


def test_a_full_disk_while_export_writes_is_named_and_keeps_the_old_model(template_run, tmp_path, monkeypatch, capfd):
    (tmp_path / "model.onnx").write_bytes(b"the previous model")
    with fault_in_process(monkeypatch, "model.onnx:enospc:4096"):
        done = export_in_process(template_run / "step-000000004.pt", tmp_path / "model.onnx", tmp_path, capfd)
    assert done.returncode == 2, describe(done)
    one_line(done, r"^tideborn export: error: disk full writing \S+/model\.onnx; nothing was replaced")
    assert (tmp_path / "model.onnx").read_bytes() == b"the previous model"
    assert temp_files(tmp_path) == []


@pytest.fixture
def nearly_full_filesystem(small_filesystem):
    """A real 1 MiB tmpfs (conftest's `small_filesystem`), filled but for 8 KiB."""
    mount_point, _ = small_filesystem
    free = os.statvfs(mount_point).f_bavail * os.statvfs(mount_point).f_frsize
    (mount_point / "filler").write_bytes(b"\0" * (free - 8192))
    return mount_point


def test_a_really_full_disk_is_named_by_convert_and_export(games_hcpe, template_run, tmp_path, nearly_full_filesystem,
                                                           capfd):
    done = data_in_process("convert", str(games_hcpe.parent / "games"), "--output",
                           str(nearly_full_filesystem / "all.hcpe"), "--quiet", cwd=tmp_path, capfd=capfd)
    assert done.returncode == 2, describe(done)
    one_line(done, r"^python -m tideborn\.data convert: error: disk full writing \S+/all\.hcpe; nothing was replaced")
    done = export_in_process(template_run / "step-000000004.pt", nearly_full_filesystem / "model.onnx", tmp_path, capfd)
    assert done.returncode == 2, describe(done)
    one_line(done, r"^tideborn export: error: disk full writing \S+/model\.onnx; nothing was replaced")
    assert sorted(p.name for p in nearly_full_filesystem.iterdir()) == ["filler"]


# -- paths that are one file; FIFOs as inputs ------------------------------------------------------------------

@pytest.mark.parametrize("train_name, test_name", [("a.hcpe", "a.HCPE"), ("a.hcpe", "sub/../a.hcpe"),
                                                   ("a.hcpe", "link.hcpe")])
def test_split_refuses_train_and_test_that_are_one_file(games_hcpe, tmp_path, capfd, train_name, test_name):
    # a.HCPE: one file on a case-insensitive file system, and one game index (a.games.csv) everywhere
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.hcpe").write_bytes(b"")
    os.link(tmp_path / "a.hcpe", tmp_path / "link.hcpe")
    done = data_in_process("split", str(games_hcpe), "--train", train_name, "--test", test_name, cwd=tmp_path,
                           capfd=capfd)
    assert done.returncode == 2, describe(done)
    one_line(done, r"--train a\.hcpe and --test \S+ name the same file")
    assert (tmp_path / "a.hcpe").read_bytes() == b""


@pytest.mark.parametrize("command", ["inspect", "verify", "convert", "train"])
def test_a_fifo_given_as_a_data_file_is_refused_not_waited_on(tmp_path, command):
    os.mkfifo(tmp_path / "pipe.hcpe")
    if command == "convert":
        os.mkfifo(tmp_path / "pipe.csa")
        done = run_data("convert", "pipe.csa", "--output", "out.hcpe", cwd=tmp_path, timeout=60)
        pattern = r"pipe\.csa: is a FIFO \(named pipe\)"
    elif command == "train":
        done = run_tool([sys.executable, "-m", "tideborn.trainer", "train", *settings_args(
            tmp_path / "run", f"paths.data_root={str(tmp_path)!r}", 'data.train=["pipe.hcpe"]', "data.test=[]",
            config=TEACHER_CONFIG)], tmp_path, timeout=60)
        pattern = r"pipe\.hcpe: is a FIFO \(named pipe\), not a hcpe file"
    else:
        done = run_data(command, "pipe.hcpe", cwd=tmp_path, timeout=60)
        pattern = r"pipe\.hcpe: is a FIFO \(named pipe\), not a hcpe file"
    assert done.returncode == 2, describe(done)
    one_line(done, pattern)
