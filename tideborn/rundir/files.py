"""Reading the pieces of a run directory and asking the OS about its process (no torch, no writes).

train.pid, the numbered lines of train.log, the `run_started` a long events.jsonl began its session
with, and whether a pid is (still) the process we mean. `tideborn.rundir.state` puts them together.
"""

from __future__ import annotations

import functools
import os
import socket
import stat
import typing
from dataclasses import dataclass
from pathlib import Path

import psutil

from tideborn.errors import UserError
from tideborn.rundir.anomaly import ProcessFacts
from tideborn.rundir.events import FollowingReader, LineFollower, loads_bounded, well_formed
from tideborn.rundir.layout import PID_FILE
from tideborn.safefile import NotARegularFile, no_such_file, open_regular, whose

RUN_STARTED_SEARCH_BYTES = 64 * 1024 * 1024
"""Without train.pid (a run started in a terminal), how far back a tail read looks for the session's
`run_started` before taking the file's first one."""
LAUNCH_MARK = "=== "
"""`start` opens each launch's part of train.log with a line that begins so."""
_RUN_STARTED_NEEDLE = b'"kind":"run_started"'
PID_FILE_MAX_BYTES = 1024 * 1024
"""train.pid is a few hundred bytes (its argv aside); anything past this is not one."""


@dataclass(frozen=True)
class PidRecord:
    """train.pid: the process `train_run start` launched, and how to tell it from a reused pid."""

    pid: int
    start_time: float
    """The process's start time as psutil reports it (`create_time()`): wall clock, so it moves when the
    clock is stepped; it identifies the process only where `start_ticks` is missing (an older train.pid)."""
    host: str
    argv: list[str]
    started_at: float
    """Unix time `start` launched it."""
    cwd: str = ""
    log_offset: int = 0
    """Size of train.log before this launch: its output starts here."""
    events_offset: int = 0
    """Size of events.jsonl before this launch: its `run_started` is the first one after this offset..."""
    events_inode: int | None = None
    """...if events.jsonl is still this file (`--fresh` moves it to the archive and starts a new one)."""
    start_ticks: int | None = None
    """The process's start in clock ticks since boot (`process_start_ticks`): what identifies it, since
    no clock step moves it. None in a train.pid written before this field existed."""
    boot_id: str | None = None
    """The boot the ticks count from (`boot_id()`); None where the OS does not say."""

    def to_dict(self) -> dict:
        return {"v": 1, "pid": self.pid, "start_time": self.start_time, "host": self.host, "argv": self.argv,
                "started_at": self.started_at, "cwd": self.cwd, "log_offset": self.log_offset,
                "events_offset": self.events_offset, "events_inode": self.events_inode,
                "start_ticks": self.start_ticks, "boot_id": self.boot_id}

    def identity(self) -> dict:
        """Keyword arguments of `tideborn.rundir.anomaly.same_process` (and `vanished`) for this process."""
        return {"start_time": self.start_time, "start_ticks": self.start_ticks, "boot_id": self.boot_id}


def read_pid_record(run_dir: Path) -> PidRecord | None:
    path = run_dir / PID_FILE
    try:
        with open_regular(path) as handle:  # a FIFO would block the reader for good: never opened
            raw = handle.read(PID_FILE_MAX_BYTES + 1)
        if len(raw) > PID_FILE_MAX_BYTES:
            raise ValueError(f"longer than {PID_FILE_MAX_BYTES:,} bytes")
        data = loads_bounded(raw)
        return PidRecord(pid=int(data["pid"]), start_time=float(data["start_time"]), host=str(data["host"]),
                         argv=[str(a) for a in data.get("argv", [])], started_at=float(data["started_at"]),
                         cwd=str(data.get("cwd", "")), log_offset=int(data.get("log_offset", 0)),
                         events_offset=int(data.get("events_offset", 0)),
                         events_inode=None if data.get("events_inode") is None else int(data["events_inode"]),
                         start_ticks=None if data.get("start_ticks") is None else _whole(data["start_ticks"]),
                         boot_id=None if data.get("boot_id") is None else str(data["boot_id"]))
    except NotARegularFile as exc:
        raise UserError(f"{exc} (train.pid is a file written by train_run start)") from None
    except OSError as exc:
        if no_such_file(exc):
            return None
        if isinstance(exc, PermissionError):  # another user's run: say whose, not that the file is not one
            raise UserError(f"{path}: cannot read it: permission denied ({whose(path)})") from None
        raise UserError(f"{path}: not a train.pid written by train_run start ({type(exc).__name__}: {exc})") from None
    except (KeyError, TypeError, ValueError) as exc:  # ValueError: bad JSON or UTF-8, nested too deeply
        raise UserError(f"{path}: not a train.pid written by train_run start ({type(exc).__name__}: {exc})") from None


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"start_ticks must be a whole number >= 0, not {value!r}")
    return value


@functools.cache
def _ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


@functools.cache
def boot_id() -> str | None:
    """This boot of the host (Linux); None elsewhere. Start ticks are only comparable within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot: field 22 of /proc/PID/stat, a constant of the process
    that no change of the wall clock moves (unlike psutil's `create_time()`, which adds the boot time the
    kernel derives from the current clock). None without /proc (not Linux) or for a pid that is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # Field 2, the command name, is in parentheses and may itself hold spaces and parentheses: count the
    # fields from the last ")"; the first after it is field 3, so field 22 is the 20th.
    fields = stat[stat.rfind(b")") + 1:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_facts(pid: int) -> ProcessFacts:
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            create_time, status, name = process.create_time(), process.status(), process.name()
            # Without /proc, the start relative to boot from psutil's two wall-clock times read together: a
            # clock step moves both alike; the boot time is in whole seconds, hence a second's slack.
            ticks, slack, boot = process_start_ticks(pid), 0, boot_id()
            if ticks is None:
                ticks = round((create_time - psutil.boot_time()) * _ticks_per_second())
                slack, boot = _ticks_per_second(), None
    except psutil.NoSuchProcess:
        return ProcessFacts(pid, running=False)
    except psutil.AccessDenied:
        return ProcessFacts(pid, running=psutil.pid_exists(pid))
    # An exited child its parent has not reaped yet is a zombie: gone, as far as a run is concerned.
    return ProcessFacts(pid, running=status != psutil.STATUS_ZOMBIE, create_time=create_time, name=name,
                        start_ticks=ticks, boot_id=boot, start_ticks_slack=slack, status=status)


def files_written(pid: int, name: str,
                  known: typing.Collection[tuple[int, int]] = ()) -> list[tuple[str, tuple[int, int]]] | None:
    """The files process `pid` holds open for writing that are named `name`-something (`events.jsonl`,
    `events.jsonl.1`, `events.jsonl (deleted)`) or are one of `known` (device, inode): each as (where the OS
    says it is now, (device, inode)). None where the OS will not say (no /proc, another user's process)."""
    folder = f"/proc/{pid}/fd"
    try:
        descriptors = os.listdir(folder)
    except OSError:
        return None
    found = []
    for fd in descriptors:
        try:
            target = os.readlink(f"{folder}/{fd}")
            info = os.stat(f"{folder}/{fd}")
            identity = (info.st_dev, info.st_ino)
            if not (os.path.basename(target).startswith(name) or identity in known):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as handle:
                flags = next((int(line.split()[1], 8) for line in handle if line.startswith("flags:")), os.O_RDONLY)
        except (OSError, ValueError, IndexError):
            continue  # closed meanwhile, or not a file (a socket, a pipe): not a run file it writes
        if flags & os.O_ACCMODE != os.O_RDONLY:
            found.append((target, identity))
    return found


def boot_relative_start(pid: int) -> dict:
    """`start_ticks` and `boot_id` of `pid`, as train.pid and `run_started` record them to recognise the
    process later whatever the wall clock does (None each where the OS does not say)."""
    facts = process_facts(pid)
    return {"start_ticks": facts.start_ticks, "boot_id": facts.boot_id}


def this_host() -> str:
    return socket.gethostname()


def file_size(path: Path) -> int:
    """The size of a regular file; 0 for anything else (absent, a directory, a FIFO: nothing to read)."""
    try:
        info = path.stat()
    except OSError:  # absent, under a file, a symlink loop: nothing to read
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def file_mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:  # absent, or a symlink loop: no time to go by (the reader reports the loop)
        return None


def line_start_at_or_after(path: Path, offset: int) -> int:
    """The offset of the first line that starts at or after `offset` (so a reader never starts mid-line)."""
    if offset <= 0:
        return 0
    try:
        handle = open_regular(path)
    except OSError:
        return 0  # not readable as a file: the reader that follows it says why
    with handle:
        position = offset - 1
        handle.seek(position)
        while chunk := handle.read(1024 * 1024):
            newline = chunk.find(b"\n")
            if newline >= 0:
                return position + newline + 1
            position += len(chunk)
    return position


def find_last_run_started(path: Path, before: int, budget: int = RUN_STARTED_SEARCH_BYTES) -> dict | None:
    """The last `run_started` event that starts before byte `before`, searching back `budget` bytes,
    then the file's first few MiB (a single session longer than the budget)."""
    chunk_size = 4 * 1024 * 1024
    with open_regular(path) as handle:
        end = before
        while end > 0 and before - end < budget:
            start = max(0, end - chunk_size)
            handle.seek(start)
            data = handle.read(end - start + len(_RUN_STARTED_NEEDLE))  # overlap: a needle across the edge
            hit = data.rfind(_RUN_STARTED_NEEDLE)
            while hit >= 0 and start + hit < before:
                event = _event_around(handle, start + hit)
                if event is not None:
                    return event
                hit = data.rfind(_RUN_STARTED_NEEDLE, 0, hit)
            end = start
        if end > 0:
            handle.seek(0)
            data = handle.read(chunk_size)
            hit = data.find(_RUN_STARTED_NEEDLE)
            if hit >= 0:
                return _event_around(handle, hit)
    return None


def find_first_run_started(path: Path, after: int, limit: int = 4 * 1024 * 1024) -> tuple[int, dict] | None:
    """The first `run_started` at or after byte `after` (within `limit` bytes), with its offset."""
    with open_regular(path) as handle:
        handle.seek(after)
        data = handle.read(limit)
        hit = data.find(_RUN_STARTED_NEEDLE)
        while hit >= 0:
            event = _event_around(handle, after + hit)
            if event is not None:
                return after + data.rfind(b"\n", 0, hit) + 1, event
            hit = data.find(_RUN_STARTED_NEEDLE, hit + 1)
    return None


def first_event(path: Path, limit: int = 1024 * 1024) -> dict | None:
    """The first well-formed event in the file's first `limit` bytes (None if there is none, or the file
    cannot be read). The trainer begins every events.jsonl with `run_started`; one that begins otherwise
    lost its head (log rotation: copytruncate)."""
    try:
        with open_regular(path) as handle:
            data = handle.read(limit)
    except OSError:
        return None
    start = 0
    while (end := data.find(b"\n", start)) >= 0:  # complete lines only, and mostly just the first
        try:
            event = loads_bounded(data[start:end])
        except ValueError:
            event = None
        if well_formed(event):
            return event
        start = end + 1
    return None


def _event_around(handle: typing.BinaryIO, position: int) -> dict | None:
    back = max(0, position - 1024 * 1024)
    handle.seek(back)
    data = handle.read(position - back)
    line_start = back + data.rfind(b"\n") + 1
    handle.seek(line_start)
    line = handle.readline()
    try:
        event = loads_bounded(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and event.get("kind") == "run_started" else None


class LogReader(FollowingReader):
    """New complete lines of train.log since the last call, numbered; a truncated or replaced log is
    read again from its start. A reader that starts mid-file counts the lines before it only when
    asked (`line_base`), which status needs only when it has something to report."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = path
        self._lines = LineFollower(path, offset)
        self._origin = offset
        self._base: int | None = 0 if offset == 0 else None
        self._relative = 0

    def read_new(self, max_bytes: int = 8 * 1024 * 1024) -> list[tuple[int, str]]:
        raw_lines, restarted = self._lines.read_lines(max_bytes)
        if restarted:
            self._origin = self._relative = 0
            self._base = 0
        lines = []
        for raw in raw_lines:
            self._relative += 1
            lines.append((self._relative, raw.decode("utf-8", errors="replace").rstrip("\r")))
        return lines

    def line_base(self) -> int:
        if self._base is None:
            count = 0
            try:
                handle = open_regular(self.path)
            except OSError:
                return 0  # gone or no longer a file since its lines were read: number them from here
            with handle:
                remaining = self._origin
                while remaining > 0 and (chunk := handle.read(min(remaining, 8 * 1024 * 1024))):
                    count += chunk.count(b"\n")
                    remaining -= len(chunk)
            self._base = count
        return self._base
