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
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from tideborn.config.load import load_settings
from tideborn.config.schema import Settings
from tideborn.errors import UserError
from tideborn.humanize import clock
from tideborn.rundir.access import check_run_dir
from tideborn.rundir.anomaly import ProcessFacts, identity_mismatch, same_process
from tideborn.rundir.files import (
    LAUNCH_MARK,
    PidRecord,
    boot_relative_start,
    find_first_run_started,
    process_facts,
    read_pid_record,
    this_host,
)
from tideborn.rundir.kinds import RunStarted
from tideborn.rundir.layout import EVENTS_FILE, LAUNCH_FILE, LOG_FILE, PID_FILE, TRAINER_LOCK_FILE, run_dir_of
from tideborn.rundir.lock import LAUNCH_ENV, held, orphaned_holder, read_holder
from tideborn.safefile import (
    make_dirs,
    open_run_file,
    open_run_file_for_reading,
    os_error_text,
    user_text,
    write_atomically,
)
from tideborn.trainer.options import build_parser
from tideborn.trainer.preflight import check_start_step, preflight

LAUNCH_WAIT_SECONDS = 300.0
"""How long `start` waits for its trainer to write run_started (importing torch, building the network,
loading a checkpoint) before it reports the trainer as still starting."""


ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""For torchrun's elastic agent: a new store for the workers at every rendezvous round. The agent's shared store
(torch's default) keeps the old workers' addresses across restarts, and a restarted worker may read them and fail
to connect (pytorch/pytorch#135712), so every restart risks costing another."""


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
    nnodes: str | None = None
    """`MIN:MAX` (or `N`): launch this node's part of an elastic job through torchrun's elastic agent, which
    restarts the workers after a failure or a change of nodes (docs/training.md, "Several nodes")."""
    max_restarts: int = 3
    """With `nnodes`: torchrun's `--max-restarts`."""
    rdzv_endpoint: str | None = None
    """With `nnodes`: the c10d rendezvous `HOST:PORT`, the same on every node."""
    rdzv_id: str | None = None
    """With `nnodes`: the job's rendezvous id, the same on every node."""

    def trainer_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "tideborn.trainer", "train"]
        if self.nnodes is not None:
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", self.nnodes,
                    "--nproc-per-node", str(self.nproc_per_node), "--max-restarts", str(self.max_restarts),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", str(self.rdzv_endpoint),
                    "--rdzv-id", str(self.rdzv_id), "-m", "tideborn.trainer", "train"]
        elif self.nproc_per_node > 1:
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
    outcome: str = "launched"
    """"launched" (not waited for), "running" (it wrote run_started), "starting" (no run_started when
    the wait ran out; it is alive), or "ended" (it wrote run_started and has exited since)."""
    started_step: int | None = None
    """The step its run_started names (where it resumed)."""
    exit_code: int | None = None
    """Its exit status, for "ended"."""


class TrainerExited(Exception):
    """The launched trainer exited before it began training, not for bad input (a crash): the message
    quotes its last line in train.log. Bad input it refused is a `UserError` with its own message."""


@dataclass(frozen=True)
class CheckedLaunch:
    """A request that passed every check `start` makes before launching."""

    settings: Settings
    run_dir: Path
    resumes_from: tuple[Path, int] | None
    """The checkpoint (and its step) the trainer will resume from, where that can be told without torch."""
    fresh: bool = False


def check_launch(request: LaunchRequest, cwd: Path | None = None,
                 env: typing.Mapping[str, str] | None = None) -> CheckedLaunch:
    """Every check `start` makes before launching, writing nothing: the settings, the trainer's own
    torch-free checks (on the trainer's own parsing of its options), whether there is anything left to
    train, and whether a live run holds the directory. A refusal is a `UserError`."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    environ = os.environ if env is None else env
    resolved = load_settings(request.config, request.overrides, request.flags, cwd=cwd, environ=environ)
    options = build_parser().parse_args(["train", *request.trainer_args])
    # the trainer decodes hcpe3 files (and names a malformed one) when it starts
    preflight(resolved.settings, options.resume, options.fresh, options.stop_at_step, cwd=cwd)
    run_dir = run_dir_of(resolved.settings)
    run_dir = run_dir if run_dir.is_absolute() else cwd / run_dir
    if run_dir.is_dir() and (holder := live_holder(run_dir)):
        stop = shlex.join(["python", "-m", "tideborn.tools.train_run", "stop", "--out-dir", str(run_dir)])
        raise UserError(f"{run_dir}: a run is already going there: {holder}; stop it first ({stop}) or choose "
                        "another runtime.out_dir")
    resume = None if options.resume is None else cwd / options.resume
    resumes_from = check_start_step(resolved.settings, run_dir, resume, options.fresh, options.stop_at_step)
    return CheckedLaunch(resolved.settings, run_dir, resumes_from, options.fresh)


def live_holder(run_dir: Path) -> str | None:
    """Why a new trainer must not start in `run_dir` now (a live run holds it), or None."""
    record = read_pid_record(run_dir)
    if record is not None:
        if record.host != this_host():
            facts = None
        else:
            facts = process_facts(record.pid)
        if facts is not None and same_process(facts, **record.identity()):
            return f"pid {record.pid} (started {_clock(record.started_at)}, recorded in {run_dir / PID_FILE})"
    lock = run_dir / TRAINER_LOCK_FILE
    if not held(run_dir):
        return None
    holder = read_holder(lock)
    if holder is None:
        return f"unknown (a process holds {lock.name})"
    if holder.alive() is False:
        # The trainer is gone; what holds the lock is a child it forked (trainers from before the lock was
        # closed in children), which exits once it notices: no run to stop, only a moment to wait.
        raise UserError(f"{run_dir}: {holder.describe(lock)}")
    return holder.describe(lock)


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


def launch_run(request: LaunchRequest, cwd: Path | None = None, env: typing.Mapping[str, str] | None = None,
               wait_seconds: float = LAUNCH_WAIT_SECONDS) -> Launched:
    """Check the request (`check_launch`: a `UserError` leaves nothing launched or written), start the
    trainer detached with its output appended to train.log, write train.pid and launch.json, then wait
    up to `wait_seconds` (0: not at all) for the trainer to write run_started.

    A trainer that exits before it writes run_started is reported with what it said: a `UserError` for
    a refusal (exit status 2, or 0 with "nothing to train"), else `TrainerExited`. One that refused
    before it took the run directory (another trainer got there first, a file only it could judge)
    changed nothing there, so train.pid and launch.json are put back as they were: only train.log keeps
    a trace of the attempt."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    run_dir = check_launch(request, cwd, env).run_dir
    try:
        make_dirs(run_dir)
    except OSError as exc:  # preflight's probe passed, and then the filesystem changed its mind
        raise UserError(f"runtime.out_dir: cannot create {run_dir}: {os_error_text(exc)}") from None
    check_run_dir(run_dir)  # again, now that it exists: ours, and no links planted in it meanwhile
    with _directory_lock(run_dir):
        if holder := live_holder(run_dir):
            raise UserError(f"{run_dir}: a run is already going there: {holder}; stop it first")
        before = {name: _read_or_none(run_dir / name) for name in (PID_FILE, LAUNCH_FILE)}
        launched = _launch(request, run_dir, cwd, env)
        if wait_seconds <= 0:
            return launched
        return _await_start(launched, before, wait_seconds)


def _launch(request: LaunchRequest, run_dir: Path, cwd: Path, env: typing.Mapping[str, str] | None) -> Launched:
    argv = request.trainer_argv()
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"  # tracebacks and progress reach train.log as they happen
    if request.nnodes is not None:
        child_env.update(ELASTIC_ENV)
    log_path = run_dir / LOG_FILE
    try:
        events = (run_dir / EVENTS_FILE).stat()
        events_offset, events_inode = events.st_size, events.st_ino
    except FileNotFoundError:
        events_offset, events_inode = 0, None
    started_at = time.time()
    launch = {"v": 1, "config": request.config,
              "config_path": str((cwd / request.config).resolve()) if request.config else None,
              "overrides": list(request.overrides),
              "flags": {k: v for k, v in request.flags.items() if v is not None},
              "trainer_args": list(request.trainer_args), "nproc_per_node": request.nproc_per_node,
              "nnodes": request.nnodes, "max_restarts": request.max_restarts,
              "rdzv_endpoint": request.rdzv_endpoint, "rdzv_id": request.rdzv_id,
              "cwd": str(cwd), "argv": argv,
              "started_at": started_at, "run_dir": str(run_dir)}
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
        # All of train.pid but the pid, for the trainer to write itself should this process die before it does.
        child_env[LAUNCH_ENV] = json.dumps({"pid_record": {
            "argv": argv, "started_at": started_at, "cwd": str(cwd), "log_offset": log_offset,
            "events_offset": events_offset, "events_inode": events_inode}, "launch": launch})
        process = subprocess.Popen(argv, cwd=cwd, env=child_env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    try:
        start_time = psutil.Process(process.pid).create_time()
        record = PidRecord(pid=process.pid, start_time=start_time, host=this_host(), argv=argv,
                           started_at=started_at, cwd=str(cwd), log_offset=log_offset,
                           events_offset=events_offset, events_inode=events_inode,
                           **boot_relative_start(process.pid))
        write_text_atomically(run_dir / PID_FILE, json.dumps(record.to_dict(), indent=2) + "\n")
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


def _await_start(launched: Launched, before: dict[str, bytes | None], wait_seconds: float) -> Launched:
    """Wait for the trainer to write run_started, to exit, or for `wait_seconds` to pass."""
    process, run_dir = launched.process, launched.run_dir
    deadline = time.monotonic() + wait_seconds
    while True:
        code = process.poll()  # the run_started check after it: an exit right after writing it still counts
        started = _run_started_of(launched)
        if started is not None:
            outcome = "running" if code is None else "ended"
            return replace(launched, outcome=outcome, started_step=started.step, exit_code=code)
        if code is not None:
            if code in (0, 2) and not _took_directory(launched):
                # It refused before it held the run directory, so it changed nothing there: neither may
                # its records (a crash keeps them: status then reports it vanished, quoting train.log).
                for name, content in before.items():
                    _put_back(run_dir / name, content)
            raise _exit_report(launched, code)
        if time.monotonic() >= deadline:
            return replace(launched, outcome="starting")
        time.sleep(0.05)


def _run_started_of(launched: Launched) -> RunStarted | None:
    """This launch's run_started (written by the trainer, or by rank 0 under torchrun), or None yet."""
    path = launched.run_dir / EVENTS_FILE
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return None
    offset = launched.record.events_offset if inode == launched.record.events_inode else 0
    pid = launched.record.pid
    while (found := find_first_run_started(path, offset)) is not None:
        at, event = found
        started = RunStarted.parse(event)
        if started.written_by(pid):
            return started
        offset = at + 1  # another trainer's (one started in a terminal that won the directory): look on
    return None


def _took_directory(launched: Launched) -> bool:
    holder = read_holder(launched.run_dir / TRAINER_LOCK_FILE)
    return (holder is not None and holder.launched_pid == launched.record.pid
            and (holder.start_time or 0) >= launched.record.start_time - 1)


def _exit_report(launched: Launched, code: int) -> Exception:
    """What the trainer said before it exited (its last line in this launch's part of train.log)."""
    log = launched.run_dir / LOG_FILE
    lines = _log_lines(log, launched.record.log_offset)
    last = lines[-1] if lines else "(no output)"
    if code == 0:
        # `train` exits 0 when there is nothing to train (checked here already, unless only torch could tell)
        return UserError(next((line for line in reversed(lines) if line.startswith("nothing to train")), last))
    if code == 2:
        said = next((line for line in reversed(lines) if ": error: " in line), last)
        return UserError(f"{said.split(': error: ', 1)[-1]} (the trainer refused to start; see {log})")
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return TrainerExited(f"the trainer {how} before it started training: {last} (see {log})")


def _log_lines(path: Path, offset: int) -> list[str]:
    """This launch's lines of train.log (after its opening line), at most its last 64 KiB."""
    with os.fdopen(open_run_file_for_reading(path), "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(offset, size - 64 * 1024))
        text = handle.read().decode(errors="replace")
    return [line for line in text.splitlines() if line.strip() and not line.startswith(LAUNCH_MARK)]


def _read_or_none(path: Path) -> bytes | None:
    try:
        fd = open_run_file_for_reading(path)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _put_back(path: Path, content: bytes | None) -> None:
    if content is None:
        path.unlink(missing_ok=True)
    else:
        write_atomically(path, lambda handle: handle.write(content))


def _last_byte(path: Path) -> bytes:
    with os.fdopen(open_run_file_for_reading(path), "rb") as handle:
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
    if not same_process(facts, **record.identity()):
        raise NotRunning(f"{run_dir}: the run is not running: pid {record.pid} now belongs to another process "
                         f"({facts.name or 'unnamed'}, {not_recorded(facts, record)}); nothing was signalled. "
                         f"{by_pid(record.pid)}")
    return record


def not_recorded(facts: ProcessFacts, record: PidRecord) -> str:
    """How a live pid differs from train.pid's record: both starts, wall clock and since boot."""
    why = identity_mismatch(facts, record.start_time, record.start_ticks, record.boot_id)
    ticks = (f"; since boot: {facts.start_ticks} ticks, recorded {record.start_ticks}"
             if facts.start_ticks is not None and record.start_ticks is not None else "")
    return (f"{why}; started {_clock(facts.create_time or 0)}, recorded {_clock(record.start_time)}{ticks}")


def by_pid(pid: int) -> str:
    """How to stop a process by hand, for when it cannot be identified as the run's."""
    return (f"If you know pid {pid} is the trainer (ps -o pid,lstart,args -p {pid}), stop it by pid: kill -TERM {pid} "
            f"(it saves a checkpoint and exits; send it once) or, losing the steps since the last checkpoint, "
            f"kill -KILL {pid}")


class NotPermitted(UserError):
    """This user may not signal the run's process (another user's trainer): the message says whose it is."""


def not_permitted(run_dir: Path, pid: int, signum: int) -> NotPermitted:
    try:
        owner = user_text(psutil.Process(pid).uids().real)
    except psutil.Error:
        owner = "another user"
    you = user_text(os.geteuid())
    return NotPermitted(f"{run_dir}: the trainer, pid {pid}, belongs to {owner}, and you are {you}: "
                        f"you cannot stop it (no permission to send it {signal.Signals(signum).name}); nothing was "
                        f"signalled; stop it as {owner.split(' (')[0]}, or ask them to")


def send_signal(run_dir: Path, record: PidRecord, signum: int) -> None:
    """`os.kill` of the recorded trainer: `NotRunning` if it exited meanwhile, `NotPermitted` if it is another
    user's process. Signal 0 sends nothing: it only asks whether a signal could be sent."""
    try:
        os.kill(record.pid, signum)
    except ProcessLookupError:
        raise NotRunning(f"{run_dir}: the run is not running (pid {record.pid} exited just now)") from None
    except PermissionError:
        raise not_permitted(run_dir, record.pid, signum or signal.SIGTERM) from None


def signal_run(run_dir: Path, signum: int = signal.SIGTERM) -> PidRecord:
    """Send `signum` to the recorded trainer after checking it is still the same process."""
    record = recorded_process(run_dir)
    send_signal(run_dir, record, signum)
    return record


def orphaned_workers(run_dir: Path) -> list[PidRecord]:
    """The live workers of a torchrun job whose agent (train.pid's process) died while they train on, rank 0
    (the lock's holder) first, as records to signal and wait for; empty where nothing outlived the agent."""
    record = read_pid_record(run_dir)
    if record is None or record.host != this_host():
        return []
    holder = orphaned_holder(run_dir, record.pid)
    if holder is None:
        return []
    others = [worker for worker in holder.workers if worker.pid != holder.pid and worker.alive() is True]
    return [PidRecord(pid=worker.pid, start_time=worker.start_time or 0.0, host=this_host(), argv=[],
                      started_at=worker.start_time or 0.0, start_ticks=worker.start_ticks, boot_id=worker.boot_id)
            for worker in (holder, *others)]


def is_alive(record: PidRecord) -> bool:
    return same_process(process_facts(record.pid), **record.identity())
