"""Teacher data under change and the data tools' outputs: what a user is left with when things go wrong.

A teacher file truncated while training reads it; `export`, `data convert` and `data split` writing
over things that are not regular files, under a permissive umask, onto a full disk, interrupted with
Ctrl-C or SIGKILL; a split interrupted between its two files; paths that name the same file twice.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    REPO_ROOT,
    child_env,
    console_script,
    describe,
    events_of,
    settings_args,
    terminal_events,
    wait_until,
)
from test_data_support import hcpe_records, random_positions, write_records
from test_data_tools import random_csa_games

from tideborn.data.convert import convert_games
from tideborn.data.records import RECORD_DTYPES
from tideborn.data.split import split_games

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
"""Test-only (tests/test_reliability_data_outputs.py), loaded through PYTHONPATH:
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


def run_tool(command: list[str], cwd: Path, env: dict[str, str] | None = None, umask: int | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """`command` as a real process. A tool that hangs (a FIFO opened for reading waits for a writer for
    ever) fails the test instead of hanging the suite."""
    extra = {} if umask is None else {"umask": umask}
    try:
        return subprocess.run(command, cwd=cwd, env=child_env(env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, **extra)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s (hung?)")


def run_data(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return run_tool([sys.executable, "-m", "tideborn.data", *args], cwd, **kwargs)


def run_export(checkpoint: Path, out: Path, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return run_tool([str(console_script()), "export", "--checkpoint", str(checkpoint), "--out", str(out)], cwd,
                    **kwargs)


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
def test_data_outputs_refuse_to_replace_what_is_not_a_regular_file(games_hcpe, tmp_path, kind):
    make_special(tmp_path / "special.hcpe", kind)
    done = run_data("convert", str(games_hcpe.parent / "games"), "--output", "special.hcpe", cwd=tmp_path)
    assert done.returncode == 2, describe(done)
    one_line(done, rf"--output special\.hcpe: is a {'directory' if kind == 'directory' else ''}")
    for flag in ("--train", "--test"):
        other = "--test" if flag == "--train" else "--train"
        done = run_data("split", str(games_hcpe), flag, "special.hcpe", other, "other.hcpe", cwd=tmp_path)
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


def test_data_outputs_are_0o644_and_their_directories_0o755_under_umask_000(games_hcpe, tmp_path):
    games = str(games_hcpe.parent / "games")
    assert run_data("convert", games, "--output", "new/dir/all.hcpe", "--quiet", cwd=tmp_path, umask=0).returncode == 0
    done = run_data("split", "new/dir/all.hcpe", "--train", "a/train.hcpe", "--test", "b/test.hcpe", "--quiet",
                    "--test-fraction", "0.3", cwd=tmp_path, umask=0)
    assert done.returncode == 0, describe(done)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert modes == {"new": 0o755, "new/dir": 0o755, "new/dir/all.hcpe": 0o644, "new/dir/all.games.csv": 0o644,
                     "a": 0o755, "a/train.hcpe": 0o644, "a/train.games.csv": 0o644,
                     "b": 0o755, "b/test.hcpe": 0o644, "b/test.games.csv": 0o644}


def test_export_writes_0o644_under_umask_000_and_removes_a_killed_exports_temp_file(template_run, tmp_path):
    # A temp file of an export that was SIGKILLed (its process is gone), and one of an export still running.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed = tmp_path / f".model.onnx.tmp-{gone.pid}"
    running = tmp_path / f".model.onnx.tmp-{os.getpid()}"
    killed.write_bytes(b"half a model")
    running.write_bytes(b"another export's model, being written")

    done = run_export(template_run / "step-000000004.pt", tmp_path / "model.onnx", cwd=tmp_path, umask=0)
    assert done.returncode == 0, describe(done)
    assert stat.S_IMODE((tmp_path / "model.onnx").stat().st_mode) == 0o644
    assert not killed.exists(), "the killed export's temp file was left behind"
    assert running.exists(), "a running export's temp file was removed"
