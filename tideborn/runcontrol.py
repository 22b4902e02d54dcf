"""Starting a detached training run and signalling it: what `train_run start|stop` and the TUI call.

No torch. The trainer is launched as an argv list (never a shell string) in its own session, so it
survives the terminal and the SSH connection closing; `train.pid` records which process it is, so a
later stop never signals a pid that has since been given to another process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tideborn.anomaly import same_process
from tideborn.config import load_settings
from tideborn.errors import UserError
from tideborn.humanize import clock
from tideborn.rundir import (
    EVENTS_FILE,
    LAUNCH_FILE,
    LOG_FILE,
    PID_FILE,
    TRAINER_LOCK_FILE,
    check_run_dir,
    make_dirs,
    open_run_file,
    os_error_text,
    run_dir_of,
    write_atomically,
)
from tideborn.runfiles import LAUNCH_MARK, PidRecord, process_facts, read_pid_record, this_host
from tideborn.trainer.cli import build_parser
from tideborn.trainer.preflight import preflight


@dataclass(frozen=True)
class LaunchRequest:
    """What `start` was asked for; launch.json keeps it so the run can be started again as it was."""

    config: str | None = None
    overrides: tuple[str, ...] = ()
    flags: dict[str, str | None] = field(default_factory=dict)
    """`--type`, `--network`, `--mode` (None: not given)."""
    trainer_args: tuple[str, ...] = ()
    """Trainer options that are not settings: `--fresh`, `--resume PATH`, `--stop-at-step N`."""
    nproc_per_node: int = 1
    """More than 1: launch through torchrun (`--standalone`), one trainer process per GPU."""

    def trainer_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "tideborn.trainer", "train"]
        if self.nproc_per_node > 1:
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(self.nproc_per_node), "-m", "tideborn.trainer", "train"]
        if self.config is not None:
            argv += ["--config", self.config]
        for item in self.overrides:
            argv += ["--set", item]
        for name, value in self.flags.items():
            if value is not None:
                argv += [f"--{name}", value]
        return argv + list(self.trainer_args)


@dataclass(frozen=True)
class Launched:
    run_dir: Path
    record: PidRecord
    process: subprocess.Popen
    """The trainer; a long-lived caller (the TUI) should `poll()` it now and then to reap it."""


def live_holder(run_dir: Path) -> str | None:
    """Why a new trainer must not start in `run_dir` now (a live run holds it), or None."""
    record = read_pid_record(run_dir)
    if record is not None:
        if record.host != this_host():
            facts = None
        else:
            facts = process_facts(record.pid)
        if facts is not None and same_process(facts, record.start_time):
            return f"pid {record.pid} (started {_clock(record.started_at)}, recorded in {run_dir / PID_FILE})"
    lock = run_dir / TRAINER_LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released at once: only asks whether a trainer holds it
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        return f"pid {holder} (a trainer started outside train_run holds {lock.name})"
    finally:
        os.close(fd)
    return None


def _clock(when: float) -> str:
    return clock(when, "%Y-%m-%d %H:%M:%S")


@contextlib.contextmanager
def _directory_lock(run_dir: Path) -> typing.Iterator[None]:
    """Two `start`s racing for one directory: the second waits, then sees the first's run and refuses."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_text_atomically(path: Path, text: str) -> None:
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))


def launch_run(request: LaunchRequest, cwd: Path | None = None,
               env: typing.Mapping[str, str] | None = None) -> Launched:
    """Validate the settings (a `UserError` leaves nothing launched or written), then start the trainer
    detached with its output appended to train.log, and write train.pid and launch.json."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    resolved = load_settings(request.config, request.overrides, request.flags, cwd=cwd,
                             environ=os.environ if env is None else env)
    # The trainer's own torch-free checks, on the trainer's own parsing of the options it will get.
    options = build_parser().parse_args(["train", *request.trainer_args])
    preflight(resolved.settings, options.resume, options.fresh, options.stop_at_step,
              environ=os.environ if env is None else env, cwd=cwd)
    run_dir = run_dir_of(resolved.settings)
    run_dir = run_dir if run_dir.is_absolute() else cwd / run_dir
    if run_dir.is_dir() and (holder := live_holder(run_dir)):
        raise UserError(f"{run_dir}: a run is already going there: {holder}; stop it first "
                        f"(train_run stop --out-dir {run_dir}) or choose another runtime.out_dir")
    try:
        make_dirs(run_dir)
    except OSError as exc:  # preflight's probe passed, and then the filesystem changed its mind
        raise UserError(f"runtime.out_dir: cannot create {run_dir}: {os_error_text(exc)}") from None
    check_run_dir(run_dir)  # again, now that it exists: ours, and no links planted in it meanwhile
    with _directory_lock(run_dir):
        if holder := live_holder(run_dir):
            raise UserError(f"{run_dir}: a run is already going there: {holder}; stop it first")
        return _launch(request, run_dir, cwd, env)


def _launch(request: LaunchRequest, run_dir: Path, cwd: Path, env: typing.Mapping[str, str] | None) -> Launched:
    argv = request.trainer_argv()
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"  # tracebacks and progress reach train.log as they happen
    log_path = run_dir / LOG_FILE
    try:
        events = (run_dir / EVENTS_FILE).stat()
        events_offset, events_inode = events.st_size, events.st_ino
    except FileNotFoundError:
        events_offset, events_inode = 0, None
    started_at = time.time()
    try:
        log_fd = open_run_file(log_path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        raise UserError(f"runtime.out_dir: cannot write {log_path}: {os_error_text(exc)}") from None
    with os.fdopen(log_fd, "ab") as log:
        if log.tell() and _last_byte(log_path) != b"\n":
            log.write(b"\n")  # an earlier process died mid-line: start this launch on a line of its own
        log_offset = log.tell()
        log.write(f"{LAUNCH_MARK}{_clock(started_at)} train_run start: {shlex.join(argv)} (cwd {cwd}) ===\n".encode())
        log.flush()
        process = subprocess.Popen(argv, cwd=cwd, env=child_env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    try:
        start_time = psutil.Process(process.pid).create_time()
        record = PidRecord(pid=process.pid, start_time=start_time, host=this_host(), argv=argv,
                           started_at=started_at, cwd=str(cwd), log_offset=log_offset,
                           events_offset=events_offset, events_inode=events_inode)
        write_text_atomically(run_dir / PID_FILE, json.dumps(record.to_dict(), indent=2) + "\n")
        launch = {"v": 1, "config": request.config,
                  "config_path": str((cwd / request.config).resolve()) if request.config else None,
                  "overrides": list(request.overrides),
                  "flags": {k: v for k, v in request.flags.items() if v is not None},
                  "trainer_args": list(request.trainer_args), "nproc_per_node": request.nproc_per_node,
                  "cwd": str(cwd), "argv": argv,
                  "started_at": started_at, "run_dir": str(run_dir)}
        write_text_atomically(run_dir / LAUNCH_FILE, json.dumps(launch, indent=2) + "\n")
    except OSError as exc:  # a disk that filled up since the probe: one line, and no run left behind
        process.kill()
        process.wait()
        raise UserError(f"runtime.out_dir: cannot write {PID_FILE} and {LAUNCH_FILE} in {run_dir}: "
                        f"{os_error_text(exc)}; the trainer was stopped") from None
    except BaseException:
        process.kill()  # a run nobody can find or stop must not be left behind
        process.wait()
        raise
    return Launched(run_dir, record, process)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


class NotRunning(Exception):
    """There is no live process of ours to signal in that directory; the message says what there is."""


def recorded_process(run_dir: Path) -> PidRecord:
    """train.pid's process, checked to be alive, on this host, and the very process `start` launched."""
    record = read_pid_record(run_dir)
    if record is None:
        raise NotRunning(f"{run_dir}: no {PID_FILE} (the run was not started with train_run start, or never "
                         "started); a trainer in a terminal stops with Ctrl-C")
    if record.host != this_host():
        raise NotRunning(f"{run_dir}: the run was started on host {record.host}; stop it there")
    facts = process_facts(record.pid)
    if not facts.running:
        raise NotRunning(f"{run_dir}: the run is not running (pid {record.pid} has exited)")
    if not same_process(facts, record.start_time):
        raise NotRunning(f"{run_dir}: the run is not running: pid {record.pid} now belongs to another process "
                         f"({facts.name}, started {_clock(facts.create_time or 0)}, not {_clock(record.start_time)}); "
                         "nothing was signalled")
    return record


def signal_run(run_dir: Path, signum: int = signal.SIGTERM) -> PidRecord:
    """Send `signum` to the recorded trainer after checking it is still the same process."""
    record = recorded_process(run_dir)
    try:
        os.kill(record.pid, signum)
    except ProcessLookupError:
        raise NotRunning(f"{run_dir}: the run is not running (pid {record.pid} exited just now)") from None
    return record


def is_alive(record: PidRecord) -> bool:
    return same_process(process_facts(record.pid), record.start_time)
