"""What the tests share: the trainer run as a real process, its events, and checks on what a command printed
or wrote. Fixtures are in tests/conftest.py; these are plain functions, imported as `tests.helpers.common`.

Trainer processes run with one CPU thread (`OMP_NUM_THREADS=1`): on a small shared machine that is
both the fastest setting for the tiny test networks and the one that gives bit-identical results
run after run. Nothing here mocks torch or the filesystem; every run writes real files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing
import warnings
from pathlib import Path

import pytest

from tideborn.rundir.events import read_events
from tideborn.rundir.kinds import TERMINAL_KINDS
from tideborn.rundir.layout import EVENTS_FILE

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE_CONFIG = REPO_ROOT / "configs" / "smoke.toml"
TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"
TRAINER_MODULE = [sys.executable, "-m", "tideborn.trainer"]
RUN_TIMEOUT_SECONDS = 600
"""A hung trainer fails the test instead of hanging the suite; never a performance threshold. Generous, as are the
other waits of the suite: beside CPU hogs (a load of about 13 on 2 cores) a two-step torch.compile run took 170 s."""

# The template run every copy-based test starts from: the smoke network, 4 steps, a checkpoint at 2 and 4.
TEMPLATE_SETS = ("runtime.max_steps=4", "runtime.checkpoint_every=2", "runtime.log_every=1",
                 "runtime.keep_checkpoints=5", "optim.batch_size=16", "runtime.progress=plain")


def console_script() -> Path:
    """The installed `tideborn` console script, next to the interpreter running the tests."""
    script = Path(sys.executable).parent / "tideborn"
    if not script.exists():
        pytest.fail(f"{script} is missing: install the project first (pip install --no-deps -e .)")
    return script


CHILD_ENV_REMOVED = ("TIDEBORN_PROJECT_FILE", "WORLD_SIZE", "RANK", "LOCAL_RANK")


def child_env(extra: typing.Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for name in CHILD_ENV_REMOVED:
        env.pop(name, None)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def out_dir_set(run_dir: Path) -> str:
    """`--set runtime.out_dir=...` with the path as a TOML string (JSON quoting is TOML-compatible)."""
    return f"runtime.out_dir={json.dumps(str(run_dir))}"


def settings_args(run_dir: Path | None = None, *sets: str, config: Path = SMOKE_CONFIG) -> list[str]:
    args = ["--config", str(config)]
    if run_dir is not None:
        args += ["--set", out_dir_set(run_dir)]
    for item in sets:
        args += ["--set", item]
    return args


def run_trainer(*args: str, cwd: Path, script: bool = False, timeout: float = RUN_TIMEOUT_SECONDS,
                env: typing.Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m tideborn.trainer ARGS` (or the `tideborn` console script) to completion."""
    command = [str(console_script()), *args] if script else [*TRAINER_MODULE, *args]
    return subprocess.run(command, cwd=cwd, env=child_env(env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def trainer_in_process(*args: str, cwd: Path, console: bool = False) -> subprocess.CompletedProcess:
    """`python -m tideborn.trainer ARGS` run to completion in this process, as `run_trainer` would run it in a
    child: in `cwd`, on one CPU thread, with what it writes to stdout and stderr (file descriptors 1 and 2
    too) captured. It saves the child's start-up (Python and torch imported again, seconds each time) where a
    test reads only the outputs, events and exit status; signals, kills and environments need a real process.
    An exception the trainer does not turn into an exit status fails the test with its traceback.
    `console`: `tideborn ARGS` instead, through the console script's own `main` (any command, named `tideborn`)."""
    import torch

    from tideborn.cli import main as console_main
    from tideborn.data.cache.cachefile import take_cache_warnings
    from tideborn.trainer.cli import main as trainer_main

    main = console_main if console else trainer_main

    saved_env = {name: os.environ.get(name) for name in CHILD_ENV_REMOVED + ("OMP_NUM_THREADS",)}
    saved_threads, saved_cwd = torch.get_num_threads(), os.getcwd()
    saved_streams, saved_fds = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    streams: list[typing.TextIO] = []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            for name in CHILD_ENV_REMOVED:
                os.environ.pop(name, None)
            os.environ["OMP_NUM_THREADS"] = "1"  # as child_env sets it: the trainer keeps torch's one thread
            torch.set_num_threads(1)
            # A child starts with no cache warnings: those other tests' data reads left in this process would
            # become this run's `warning` events.
            take_cache_warnings()
            os.chdir(cwd)
            for stream in saved_streams:
                stream.flush()
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            streams = [open(fd, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False) for fd in (1, 2)]
            sys.stdout, sys.stderr = streams
            # Python's warnings go to stderr as a real process would print them (pytest would keep them)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                try:
                    code = main(list(args))
                except SystemExit as exit_:  # argparse's refusals, as the process would end
                    code = exit_.code if isinstance(exit_.code, int) else 1
            for warning in caught:
                sys.stderr.write(warnings.formatwarning(warning.message, warning.category, warning.filename,
                                                        warning.lineno, warning.line))
        finally:
            for stream in streams:
                stream.close()  # flushed; descriptors 1 and 2 stay open (closefd=False)
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            os.chdir(saved_cwd)
            torch.set_num_threads(saved_threads)
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        out.seek(0)
        err.seek(0)
        command = [str(console_script())] if console else TRAINER_MODULE
        return subprocess.CompletedProcess([*command, *args], code, out.read().decode("utf-8", "replace"),
                                           err.read().decode("utf-8", "replace"))


def train(run_dir: Path, *sets: str, cwd: Path, extra: typing.Sequence[str] = (),
          expect_rc: int | None = 0, process: bool = False) -> subprocess.CompletedProcess:
    """`train` with the smoke config in `run_dir`, in this process (`trainer_in_process`) unless `process`;
    fails the test, with its output, on another exit status."""
    args = ("train", *settings_args(run_dir, *sets), *extra)
    result = run_trainer(*args, cwd=cwd) if process else trainer_in_process(*args, cwd=cwd)
    if expect_rc is not None:
        assert result.returncode == expect_rc, describe(result)
    return result


def describe(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


class Trainer:
    """A trainer started in the background, its output in files (a pipe nobody reads could block it)."""

    def __init__(self, args: typing.Sequence[str], cwd: Path, log_dir: Path,
                 env: typing.Mapping[str, str] | None = None):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_dir / f"stdout-{time.monotonic_ns()}.txt"
        self.stderr_path = self.stdout_path.with_name(self.stdout_path.name.replace("stdout", "stderr"))
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen([*TRAINER_MODULE, *args], cwd=cwd, env=child_env(env),
                                            stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = RUN_TIMEOUT_SECONDS) -> int:
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return (f"exit {self.process.returncode}\n--- stdout\n{self.stdout_path.read_text()}\n"
                f"--- stderr\n{self.stderr_path.read_text()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)


def wait_until(condition: typing.Callable[[], object], trainer: Trainer, what: str,
               timeout: float = RUN_TIMEOUT_SECONDS, interval: float = 0.01):
    """Poll `condition` until it is truthy; fail if the trainer exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if trainer.poll() is not None:
            value = condition()
            if value:
                return value
            pytest.fail(f"trainer exited before {what}:\n{trainer.output()}")
        time.sleep(interval)
    pytest.fail(f"timed out waiting for {what}:\n{trainer.output()}")


def events_of(run_dir: Path) -> list[dict]:
    return read_events(run_dir / EVENTS_FILE)


def terminal_events(events: list[dict]) -> list[dict]:
    return [event for event in events if event["kind"] in TERMINAL_KINDS]


def step_events(events: list[dict]) -> list[dict]:
    return [event for event in events if event["kind"] == "step"]


def assert_user_error(stderr: str, pattern: str) -> str:
    """One line on stderr that matches `pattern`, and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert re.search(pattern, lines[0]), f"{pattern!r} not in {lines[0]!r}"
    return lines[0]


def tree(path: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and directory (None) under `path`: to check that nothing was written."""
    if not path.exists():
        return {}
    found: dict[str, bytes | None] = {}
    for item in sorted(path.rglob("*")):
        found[str(item.relative_to(path))] = item.read_bytes() if item.is_file() else None
    return found


def copy_run(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


async def until(pilot, condition, what: str, timeout: float = 120.0):
    """Pause a Textual pilot until `condition()` is true (its value is returned), failing the test after
    `timeout` seconds with `what` it waited for. The one helper of the TUI tests (Pilot)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await pilot.pause(0.02)


def holds_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open or memory-mapped (it is reading it)."""
    target = str(path)
    try:
        if any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in os.listdir(f"/proc/{pid}/fd")):
            return True
        return target in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def truncated_while_read(command: list[str], path: Path, cwd: Path, keep: int = 4000) -> subprocess.CompletedProcess:
    """Run `command` (a data tool reading `path`) and cut `path` to `keep` bytes in the middle of its read:
    once the process has held the file open twice in a row (reading it, not the moment's open that checks
    its type and size), it is held still (SIGSTOP) while the file is cut, so that the cut lands before it has
    read everything whatever the machine's load. Its result, once it has ended; killed if the test fails."""
    process = subprocess.Popen(command, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + 120
        seen = 0
        while seen < 2:
            seen = seen + 1 if holds_open(process.pid, path) else 0
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"the command never opened {path}"
            time.sleep(0.005)
        os.kill(process.pid, signal.SIGSTOP)
        os.truncate(path, keep)
        os.kill(process.pid, signal.SIGCONT)
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def assert_same_tensors(a: object, b: object, where: str) -> None:
    """Nested state (dicts, lists, tensors, numbers) equal exactly, tensors by `torch.equal`."""
    import torch  # here, not at the top: conftest imports this module, and the TUI tests need no torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


EXPLODING = ("optim.lr=100", "optim.warmup_steps=0", 'optim.schedule="constant"', "runtime.max_steps=8",
             "runtime.checkpoint_every=2", "runtime.log_every=1", "optim.batch_size=32", "watchdog.warmup_steps=1")
