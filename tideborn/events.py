"""The JSONL event stream: one JSON object per line, each appended with a single write.

Writers (the trainer's rank 0) append; readers (status, watch, the TUI) follow the file from a byte
offset, hold back a torn last line until its newline arrives, and skip lines they cannot parse while
counting them. Non-finite floats are written as the strings "nan", "inf" and "-inf" so every line
stays strict JSON (`jq` reads it); `as_float` turns them back. Schema: docs/events.md.
"""

from __future__ import annotations

import json
import math
import os
import time
import typing
from pathlib import Path

from tideborn.rundir import no_such_file, open_run_file

SCHEMA_VERSION = 1
TERMINAL_KINDS = ("run_finished", "run_stopped", "run_failed")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


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


def _ends_mid_line(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def as_float(value: object) -> float | None:
    """A loss or rate from an event as a float ("nan"/"inf"/"-inf" included); None if absent or not numeric."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _NONFINITE.get(value)
    return None


class EventWriter:
    """Appends events to `path`; each event is one `os.write` of one line (O_APPEND), so it is flushed
    when `emit` returns and a concurrent reader sees whole lines or a torn tail, never interleaving."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = open_run_file(self.path, os.O_RDWR | os.O_APPEND)  # never through a symlink
        # A writer that died mid-line (a full disk cut its write short) left a torn last line: start on a
        # line of our own, so the fragment stays one malformed line and our first event is not glued to it.
        self._torn = _ends_mid_line(self._fd)

    def emit(self, kind: str, **fields: object) -> dict:
        if self._fd is None:
            raise ValueError(f"event writer for {self.path} is closed")
        data = encode_event(kind, fields)
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
        return json.loads(data)

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


class LineFollower:
    """Complete lines appended to a file since the last call, followed from a byte offset.

    A torn last line waits for its newline. A file that shrank or was replaced (another inode) is
    followed again from its start, and `read_lines` says so. Event and log readers both build on it.
    """

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset
        self._inode: int | None = None
        self._oversized = False

    def read_lines(self, max_bytes: int) -> tuple[list[bytes], bool]:
        """(new complete lines without their newlines, whether the file was read again from its start).

        A line longer than `max_bytes` is not waited for (that would stall the reader for good): its bytes
        are skipped as they come, and it is returned as the line OVERSIZED_LINE."""
        restarted = False
        try:
            with open(self.path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                if self._inode is not None and (stat.st_ino != self._inode or stat.st_size < self.offset):
                    self.offset, restarted, self._oversized = 0, True, False
                self._inode = stat.st_ino
                handle.seek(self.offset)
                chunk = handle.read(max_bytes)
        except OSError as exc:
            if not no_such_file(exc):
                raise
            return [], False
        end = chunk.rfind(b"\n")
        if end < 0:
            if chunk and len(chunk) >= max_bytes:
                self.offset += len(chunk)
                self._oversized = True
            return [], restarted  # nothing complete yet: a torn line waits for its newline
        self.offset += end + 1
        lines = chunk[:end].split(b"\n")
        if self._oversized:
            lines[0], self._oversized = OVERSIZED_LINE, False
        return lines, restarted


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


class EventReader:
    """Reads new complete events from `path` since the last call, from a byte offset; lines that are not
    a well-formed event (`well_formed`) are counted in `malformed` and skipped."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self._lines = LineFollower(self.path, offset)
        self.malformed = 0
        self._line_number = 0

    @property
    def offset(self) -> int:
        return self._lines.offset

    def read_new(self, max_bytes: int = 64 * 1024 * 1024) -> list[dict]:
        lines, restarted = self._lines.read_lines(max_bytes)
        if restarted:
            self._line_number = 0
        events = []
        for line in lines:
            self._line_number += 1
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
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
