"""One trainer per run directory: an advisory `flock` held for the trainer's lifetime, and who holds it.

The kernel drops the lock when the last descriptor of it closes, so a crash never leaves a stale lock,
as long as no other process shares the descriptor: a forked child (a DataLoader worker) would, and keep
the directory locked for seconds after its trainer was SIGKILLed, so every child closes it at fork.
The lock file names its holder (JSON: pid, host, start time, and the pid `train_run start` launched),
so a second trainer is told who holds the directory, `train_run start` can see its own trainer take
it, and a holder that died is told apart from the child it left behind. No torch here: `train_run`
reads the holder through this module.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import psutil

from tideborn.errors import UserError
from tideborn.rundir.anomaly import same_process
from tideborn.rundir.files import PidRecord, boot_relative_start, process_facts, read_pid_record, this_host
from tideborn.rundir.layout import LAUNCH_FILE, PID_FILE, TRAINER_LOCK_FILE
from tideborn.safefile import open_run_file, os_error_text, write_atomically

LAUNCH_ENV = "TIDEBORN_LAUNCH"
"""Set by `train_run start` for the trainer it launches: JSON with what train.pid and launch.json record
but the pid (`pid_record`, `launch`), so the trainer can write them if that start was killed first."""

_held_fds: set[int] = set()


def _close_in_child() -> None:
    # Closing (not unlocking) a copy leaves the parent's lock in place: a flock is released only when
    # every descriptor of its open file is closed, or by LOCK_UN on any of them.
    for fd in _held_fds:
        try:
            os.close(fd)
        except OSError:
            pass  # already closed by the child's own cleanup: nothing of the lock is left in it
    _held_fds.clear()


os.register_at_fork(after_in_child=_close_in_child)


@dataclass(frozen=True)
class LockHolder:
    """What the lock file says about the trainer that took it last."""

    pid: int
    host: str | None = None
    start_time: float | None = None
    """psutil `create_time()` of `pid`."""
    launched_pid: int | None = None
    """The process `train_run start` launched (the trainer, or torchrun above it); None: started otherwise."""
    start_ticks: int | None = None
    """`pid`'s start in clock ticks since boot, which no wall-clock step moves (None: an older lock file)."""
    boot_id: str | None = None
    workers: tuple[LockHolder, ...] = ()
    """Under torchrun: every rank's process on rank 0's host (rank 0's among them), so that workers which outlive
    their agent can be found and stopped; empty for a trainer launched alone."""

    def alive(self) -> bool | None:
        """Whether the holder is still running (None: it ran on another host, or the file named nobody)."""
        if self.host is not None and self.host != this_host():
            return None
        return same_process(process_facts(self.pid), self.start_time, start_ticks=self.start_ticks,
                            boot_id=self.boot_id)

    def describe(self, lock: Path) -> str:
        """Who holds the lock, for a refusal: the trainer, or what a dead trainer left holding it."""
        alive = self.alive()
        if alive is False:
            return (f"a leftover child of dead trainer pid {self.pid} (a DataLoader worker, say, that has not "
                    f"noticed yet) still holds {lock.name}; it lets go within seconds, try again then")
        where = f" on {self.host}" if alive is None and self.host else ""
        how = "a trainer started outside train_run" if self.launched_pid is None else "a trainer"
        return f"pid {self.pid}{where} ({how} holds {lock.name})"


def read_holder(lock: Path) -> LockHolder | None:
    """The holder the lock file names (also the plain pid older trainers wrote), or None."""
    try:
        text = lock.read_bytes()[:65536].decode(errors="replace").strip()
    except FileNotFoundError:
        return None
    if text.isdigit():
        return LockHolder(int(text))
    try:
        data = json.loads(text)
        workers = tuple(LockHolder(int(w["pid"]), w.get("host"), w.get("start_time"), None, w.get("start_ticks"),
                                   w.get("boot_id")) for w in data.get("workers") or ())
        return LockHolder(int(data["pid"]), data.get("host"), data.get("start_time"), data.get("launched_pid"),
                          data.get("start_ticks"), data.get("boot_id"), workers)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None  # empty (being written this moment) or not ours


def held(run_dir: Path) -> bool:
    """Whether some process holds the run directory's trainer lock now (asks, and lets go at once)."""
    try:
        fd = os.open(run_dir / TRAINER_LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def orphaned_holder(run_dir: Path, launcher_pid: int) -> LockHolder | None:
    """The live rank 0 of a torchrun job whose agent, `launcher_pid` (train.pid's), is gone: it holds the run
    directory and names that agent as its launcher. None where nothing outlived the launcher."""
    if not held(run_dir):
        return None
    holder = read_holder(run_dir / TRAINER_LOCK_FILE)
    if holder is None or holder.launched_pid != launcher_pid or holder.pid == launcher_pid:
        return None
    return holder if holder.alive() is True else None


def busy(lock: Path) -> UserError:
    """The refusal of a trainer whose run directory another process holds, naming the holder."""
    holder = read_holder(lock)
    who = holder.describe(lock) if holder is not None else f"another process holds {lock.name}"
    return UserError(f"{lock.parent}: another trainer is using this run directory: {who}; "
                     "stop it first or choose another runtime.out_dir")


def refuse_if_held(run_dir: Path) -> None:
    """Refuse as `RunDirLock` would, where some process holds the run directory now: the trainer asks before
    torch loads, so a second trainer is turned away in a moment rather than after seconds of imports. The
    lock itself stays the authority: a trainer that takes the directory between this and `RunDirLock` still
    wins, and the later one is refused there."""
    if held(run_dir):
        raise busy(run_dir / TRAINER_LOCK_FILE)


class RunDirLock:
    def __init__(self, run_dir: Path, launched_pid: int | None = None,
                 environ: typing.Mapping[str, str] | None = None, workers: typing.Sequence[dict] = ()):
        """`launched_pid`: the process `train_run start` would have launched (torchrun above the ranks);
        by default this process. It counts only when this trainer was launched so (`LAUNCH_ENV`). `workers`:
        under torchrun, every rank's pid, host and start (`LockHolder.workers`)."""
        self.path = run_dir / TRAINER_LOCK_FILE
        # Only this host's: workers elsewhere are signalled on their own host, never from here.
        self.workers = [dict(worker) for worker in workers if worker.get("host") == this_host()]
        self.environ = os.environ if environ is None else environ
        self.launch = _launch_info(self.environ)
        self.launched_pid = (launched_pid or os.getpid()) if self.launch is not None else None
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        try:
            fd = open_run_file(self.path, os.O_RDWR)  # never through a link (O_NOFOLLOW)
        except OSError as exc:
            raise UserError(f"runtime.out_dir: cannot open {self.path}: {os_error_text(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise busy(self.path) from None
        _held_fds.add(fd)
        self._fd = fd
        me = psutil.Process()
        record = {"pid": me.pid, "host": this_host(), "start_time": me.create_time(),
                  "launched_pid": self.launched_pid, **boot_relative_start(me.pid)}
        if self.workers:
            record["workers"] = self.workers
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError as exc:
            self.__exit__()
            raise UserError(f"runtime.out_dir: cannot write {self.path}: {os_error_text(exc)}") from None
        if self.launch is not None:
            try:
                self._claim_launch()
            except OSError as exc:  # a full disk, say: the run can go on; only finding it by train.pid suffers
                print(f"could not record this trainer in {PID_FILE}: {exc}", file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            _held_fds.discard(self._fd)
            os.close(self._fd)
            self._fd = None

    def _claim_launch(self) -> None:
        """Write train.pid (and launch.json) for the launch this trainer is, unless train.pid names it
        already: the `start` that launched it may have been killed before it wrote them, and a run that
        train.pid does not name can be neither stopped nor told from a vanished one."""
        assert self.launch is not None and self.launched_pid is not None
        run_dir = self.path.parent
        try:
            recorded = read_pid_record(run_dir)
        except UserError:
            recorded = None  # unreadable: replace it with the truth
        if recorded is not None and recorded.pid == self.launched_pid and recorded.host == this_host():
            return
        fields = dict(self.launch["pid_record"])
        record = PidRecord(pid=self.launched_pid, start_time=psutil.Process(self.launched_pid).create_time(),
                           host=this_host(), argv=[str(a) for a in fields.get("argv", [])],
                           started_at=float(fields["started_at"]), cwd=str(fields.get("cwd", "")),
                           log_offset=int(fields.get("log_offset", 0)),
                           events_offset=int(fields.get("events_offset", 0)),
                           events_inode=fields.get("events_inode"),
                           **boot_relative_start(self.launched_pid))
        _write_json(run_dir / PID_FILE, record.to_dict())
        if self.launch.get("launch") is not None:
            _write_json(run_dir / LAUNCH_FILE, self.launch["launch"])


def _launch_info(environ: typing.Mapping[str, str]) -> dict | None:
    text = environ.get(LAUNCH_ENV)
    if not text:
        return None
    try:
        info = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{LAUNCH_ENV}: not what train_run start sets ({exc})") from None
    if not isinstance(info, dict) or not isinstance(info.get("pid_record"), dict):
        raise UserError(f"{LAUNCH_ENV}: not what train_run start sets (no pid_record)")
    return info


def _write_json(path: Path, data: dict) -> None:
    write_atomically(path, lambda handle: handle.write((json.dumps(data, indent=2) + "\n").encode()))
