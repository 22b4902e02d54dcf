"""The JSONL event stream: one JSON object per line, each appended with a single write.

Writers (the trainer's rank 0) append; readers (status, watch, the TUI) follow the file from a byte
offset, hold back a torn last line until its newline arrives, and skip lines they cannot parse while
counting them. Non-finite floats are written as the strings "nan", "inf" and "-inf" so every line
stays strict JSON (`jq` reads it); `kinds.as_float` turns them back. Schema: docs/events.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import typing
from pathlib import Path

from tideborn.errors import UserError
from tideborn.rundir.kinds import EventRecord, RunWarning
from tideborn.safefile import NotARegularFile, no_such_file, open_regular, open_run_file, trust_problem, whose

SCHEMA_VERSION = 1


def jsonable(value: object) -> object:
    """Plain JSON data; non-finite floats become "nan"/"inf"/"-inf", as events.jsonl writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def encode_event(kind: str, fields: typing.Mapping[str, object], now: float | None = None) -> bytes:
    record = {"v": SCHEMA_VERSION, "time": time.time() if now is None else now, "kind": kind}
    record.update(fields)
    return (json.dumps(jsonable(record), separators=(",", ":"), allow_nan=False, default=str) + "\n").encode()


def held_path(fd: int) -> str | None:
    """Where an open file is now, as the OS names it (`/run/events.jsonl.1`, `... (deleted)`); None without /proc."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _say(text: str) -> None:
    """One line on stderr (train.log) with a plain write(2): the writer may be called from a signal handler."""
    try:
        os.write(2, f"{text}\n".encode())
    except OSError:
        pass  # stderr gone or full: nothing else can be told


def _ends_mid_line(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


class EventWriter:
    """Appends events to `path`; each event is one `os.write` of one line (O_APPEND), so it is flushed
    when `emit` returns and a concurrent reader sees whole lines or a torn tail, never interleaving.

    Before each event it checks that `path` still names the file it holds (an fstat and an lstat): a file
    moved away or deleted under the run (`mv events.jsonl events.jsonl.1`, logrotate without copytruncate)
    would otherwise take every later event where no reader looks. It then starts a new file at `path`, which
    opens with a `warning` saying where the earlier events went; a link, a FIFO or another user's file put
    there is never written to (the events go on in the file held, and stderr says why, once)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = open_run_file(self.path, os.O_RDWR | os.O_APPEND)  # never through a symlink
        # A writer that died mid-line (a full disk cut its write short) left a torn last line: start on a
        # line of our own, so the fragment stays one malformed line and our first event is not glued to it.
        self._torn = _ends_mid_line(self._fd)
        self._following = False
        """Inside `_follow_path`: a stop signal's event emitted meanwhile (from the handler) must not reopen too."""
        self._refused: str | None = None
        """Why the path was last not reopened (said once on stderr, not at every event)."""

    def emit(self, record: type[EventRecord], **fields: object) -> dict:
        """Write one event of `record`'s kind (a record class of `rundir.kinds`: the kind is its `KIND`, so no kind
        is written without the record that reads it) and return it as written."""
        if not (isinstance(record, type) and issubclass(record, EventRecord) and record.KIND):
            raise TypeError(f"emit takes an event record class (tideborn.rundir.kinds), not {record!r}")
        if self._fd is None:
            raise ValueError(f"event writer for {self.path} is closed")
        if not self._following:
            self._following = True
            try:
                self._follow_path(fields.get("step"))
            finally:
                self._following = False
        data = encode_event(record.KIND, fields)
        self._write(data)
        return json.loads(data)

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(b"\n" + data if self._torn else data)
        started = False
        try:
            while view:
                written = os.write(self._fd, view)
                started = started or written > 0
                view = view[written:]
        except OSError:
            self._torn = self._torn or started  # part of the line is in the file: the next event starts anew
            raise
        self._torn = False

    def _follow_path(self, step: object) -> None:
        assert self._fd is not None
        held = os.fstat(self._fd)
        try:
            there: os.stat_result | None = os.stat(self.path, follow_symlinks=False)
        except OSError:
            there = None  # gone (or its directory is): a new file is made below, if it can be
        if there is not None and (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino):
            return
        moved_to = held_path(self._fd) or "a file no longer named here (moved or deleted)"
        try:
            fd = open_run_file(self.path, os.O_RDWR | os.O_APPEND | os.O_NONBLOCK)  # NONBLOCK: a FIFO put there
        except (OSError, UserError) as exc:
            self._refuse(str(exc) if isinstance(exc, UserError) else f"{exc.strerror or exc}", moved_to)
            return
        # what `check_run_dir` refuses at start, and a second name that would carry our writes elsewhere
        problem = trust_problem(os.fstat(fd), single_link=True)
        if problem is not None:
            os.close(fd)
            self._refuse(f"{self.path} {problem}", moved_to)
            return
        old, self._fd, self._refused = self._fd, fd, None
        os.close(old)
        self._torn = _ends_mid_line(fd)
        text = (f"{self.path.name} was moved or deleted under the run (log rotation by rename?): this file continues "
                f"it; the events before this one, this session's run_started among them, are in {moved_to}")
        note = {"step": step} if isinstance(step, int) else {}
        self._write(encode_event(RunWarning.KIND, {**note, "message": text, "events_moved_to": moved_to,
                                                   "pid": os.getpid()}))
        _say(f"warning: {text}")

    def _refuse(self, why: str, moved_to: str) -> None:
        if why != self._refused:
            self._refused = why
            _say(f"warning: {self.path.name} was moved or replaced under the run, and no new one can be started "
                 f"there ({why}): events go on in {moved_to}")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


OVERSIZED_LINE = b"[line longer than the read limit: skipped]"
"""What `LineFollower` returns for a line too long to hold (never JSON: an event reader counts it malformed)."""
FINGERPRINT_BYTES = 4096
"""How much of a followed file's beginning is kept to recognise the file: an append-only file never changes
its first bytes, so different ones mean it was truncated or replaced (log rotation), whatever its size now."""
MAX_JSON_DEPTH = 100
"""Deepest nesting a reader parses. The trainer writes at most 4 levels; 100,000 `[` would make json's
recursion raise RecursionError, and anything near the recursion limit would break whatever walks the value
later (status's report, watch's output, the TUI's copies)."""


_NOT_OPENERS = bytes(b for b in range(256) if b not in b"[{\n")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENER_RUN = re.compile(rb"[\[{]{%d}" % (MAX_JSON_DEPTH + 1))
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def nested_too_deeply(data: bytes) -> bool:
    """Does this JSON text nest arrays and objects deeper than MAX_JSON_DEPTH (brackets in strings aside)?"""
    depth = 0
    for byte in _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        else:
            depth -= 1
    return False


def loads_bounded(data: bytes) -> object:
    """`json.loads` for a run directory's files: text nested deeper than MAX_JSON_DEPTH is a ValueError, like
    any other malformed JSON (json.JSONDecodeError and UnicodeDecodeError are ValueErrors too)."""
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and nested_too_deeply(data):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return json.loads(data)


def _crowded_lines(block: bytes) -> set[int]:
    """Indexes of the lines of `block` with more than MAX_JSON_DEPTH opening brackets: the only ones that
    can nest that deep. One pass over the whole block in C, instead of a count per line on the hot path."""
    openers = block.translate(None, _NOT_OPENERS)  # only `[`, `{` and newlines are left
    found: set[int] = set()
    position = line = counted_to = 0
    while match := _OPENER_RUN.search(openers, position):
        line += openers.count(b"\n", counted_to, match.start())
        counted_to = match.start()
        found.add(line)
        position = openers.find(b"\n", match.end()) + 1
        if position == 0:
            break
    return found


class LineFollower:
    """Complete lines appended to a file since the last call, followed from a byte offset.

    A torn last line waits for its newline. A file that was replaced (another inode), shrank below the
    offset, or whose first bytes changed (truncated and written again, even past the old offset: copytruncate
    log rotation) is followed again from its start; `restarts` counts those. A path that is not a regular
    file (a directory, a FIFO) or cannot be read is not read: `problem` says why, until it can be read.
    Event and log readers both build on it.
    """

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset
        self.restarts = 0
        self.problem: str | None = None
        self._identity: tuple[int, int] | None = None
        self._head = b""
        """The file's first bytes as last seen (at most FINGERPRINT_BYTES, never past `offset`)."""
        self._oversized = False

    def read_block(self, max_bytes: int) -> tuple[bytes | None, bool]:
        """(the new complete lines as one block, without the last newline, or None when there is no new
        line; whether the file was read again from its start).

        A line longer than `max_bytes` is not waited for (that would stall the reader for good): its bytes
        are skipped as they come, and it is returned as the line OVERSIZED_LINE."""
        try:
            handle = open_regular(self.path)
        except OSError as exc:  # a directory, FIFO, socket or device; no permission; a symlink loop
            if not isinstance(exc, NotARegularFile) and no_such_file(exc):  # not written yet
                self.problem = None
                return None, False
            if isinstance(exc, NotARegularFile):
                self.problem = exc.what
            elif isinstance(exc, PermissionError):
                self.problem = f"permission denied ({whose(self.path)})"
            else:
                self.problem = f"unreadable ({exc.strerror or exc})"
            return None, False
        self.problem = None
        with handle:
            fd = handle.fileno()
            restarted = self._check_same_file(fd)
            handle.seek(self.offset)
            chunk = handle.read(max_bytes)
            if self._head and os.pread(fd, len(self._head), 0) != self._head:
                # rewritten between the check and the read: the chunk may straddle old and new bytes
                self._restart()
                return None, True
            end = chunk.rfind(b"\n")
            if end < 0:
                if chunk and len(chunk) >= max_bytes:
                    self.offset += len(chunk)
                    self._oversized = True
                self._remember_head(fd)
                return None, restarted  # nothing complete yet: a torn line waits for its newline
            self.offset += end + 1
            self._remember_head(fd)
        block = chunk[:end]
        if self._oversized:
            cut = block.find(b"\n")
            block, self._oversized = OVERSIZED_LINE + (block[cut:] if cut >= 0 else b""), False
        return block, restarted

    def read_lines(self, max_bytes: int) -> tuple[list[bytes], bool]:
        """(new complete lines without their newlines, whether the file was read again from its start)."""
        block, restarted = self.read_block(max_bytes)
        return ([] if block is None else block.split(b"\n")), restarted

    def _check_same_file(self, fd: int) -> bool:
        """Is this still the file read so far? If not, start over at its beginning (True)."""
        info = os.fstat(fd)
        identity, known = (info.st_dev, info.st_ino), self._identity
        self._identity = identity
        if known is None:
            return False
        if identity != known or info.st_size < self.offset or (
                self._head and os.pread(fd, len(self._head), 0) != self._head):
            self._restart()
            return True
        return False

    def _restart(self) -> None:
        self.offset, self._oversized, self._head = 0, False, b""
        self.restarts += 1

    def _remember_head(self, fd: int) -> None:
        wanted = min(FINGERPRINT_BYTES, self.offset)
        if len(self._head) < wanted:
            self._head = os.pread(fd, wanted, 0)


def well_formed(event: object) -> bool:
    """A JSON object with a string `kind`, and where present a finite number `time` and a whole-number
    `step` >= 0: the fields every reader relies on. Other fields are checked by whoever uses them."""
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
        return False
    when = event.get("time", 0.0)
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        return False
    step = event.get("step", 0)
    return isinstance(step, int) and not isinstance(step, bool) and step >= 0


class FollowingReader:
    """A reader built on a `LineFollower` (`self._lines`): where it is in the file and what it found."""

    _lines: LineFollower

    @property
    def offset(self) -> int:
        return self._lines.offset

    @property
    def restarts(self) -> int:
        """How often the file was found replaced, shrunk or rewritten, and read again from its start."""
        return self._lines.restarts

    @property
    def problem(self) -> str | None:
        """Why the file cannot be read now (a directory, a FIFO, no permission), or None."""
        return self._lines.problem

    @property
    def identity(self) -> tuple[int, int] | None:
        """(device, inode) of the file last read, or None before any."""
        return self._lines._identity


class EventReader(FollowingReader):
    """Reads new complete events from `path` since the last call, from a byte offset; lines that are not
    a well-formed event (`well_formed`), or nest deeper than MAX_JSON_DEPTH, are counted in `malformed`
    and skipped. `restarts` and `problem` are the `LineFollower`'s."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self._lines = LineFollower(self.path, offset)
        self.malformed = 0
        self._line_number = 0

    def read_new(self, max_bytes: int = 64 * 1024 * 1024) -> list[dict]:
        block, restarted = self._lines.read_block(max_bytes)
        if restarted:
            self._line_number = 0
        if block is None:
            return []
        crowded = _crowded_lines(block)
        first = self._line_number
        events = []
        for line in block.split(b"\n"):
            self._line_number += 1
            if not line.strip():
                continue
            try:
                if crowded and self._line_number - first - 1 in crowded and nested_too_deeply(line):
                    raise ValueError("nested too deeply")
                event = json.loads(line)
            except ValueError:  # json.JSONDecodeError, UnicodeDecodeError, or nested too deeply
                self.malformed += 1
                continue
            if not well_formed(event):
                self.malformed += 1
                continue
            event.setdefault("_line", self._line_number)
            events.append(event)
        return events


def read_events(path: str | os.PathLike) -> list[dict]:
    """Every complete event in the file (tests, tools that need the whole history)."""
    reader = EventReader(Path(path))
    events: list[dict] = []
    while batch := reader.read_new():
        events.extend(batch)
    return events
