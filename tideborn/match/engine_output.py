"""An external engine's output, read so that whatever it writes costs bounded memory, and its text as it may be
shown: `tideborn.match.external` reads its engines' stdout and stderr through these.

Each pipe is read a line at a time with `readline(limit)`: at most `LINE_BYTES` of a line is kept, the rest of a
longer one read and dropped (cut, not refused: a USI line that long is an `info` line, and the head of any other is
what USI reads of it). At most `QUEUED_LINES` stdout lines (as bytes) wait for the match, whose reader then waits
for room, and the engine on its full pipe. Stderr is drained as it comes, its last `STDERR_TAIL_LINES` kept as
`engine_text`. So an engine costs `QUEUED_LINES` x `LINE_BYTES` (4 MiB) and a few lines in flight (each at most
`LINE_BYTES`, a pipe buffer of `PIPE_BUFFER_BYTES`, and one line decoded) whatever it writes. (Read a line whole
at a time, 2.4 GB of stderr without a newline once took `tideborn match` to a 7.4 GB peak.)

An engine's own text reaches a terminal, a report or a saved game only through `engine_text`: escape sequences
removed, other characters that are not printable made spaces, cut to `ENGINE_TEXT_CHARS`.
"""

from __future__ import annotations

import collections
import queue
import re
import threading

LINE_BYTES = 64 * 1024
"""The most of one line of an engine's output (stdout or stderr) that is kept: far more than any USI line (a long
`info ... pv`, an `option` of type combo); a longer line is cut to this, the rest read and dropped."""
QUEUED_LINES = 64
"""The most stdout lines read ahead of the match; the reader waits for room, and the engine for the reader."""
STDERR_TAIL_LINES = 3
"""The last lines of an engine's stderr kept (as `engine_text`) to say why it died."""
ENGINE_TEXT_CHARS = 100
"""The most characters of an engine's own text (a name, a quoted line, its last words) that a report, a message or
a saved game shows."""
PIPE_BUFFER_BYTES = 64 * 1024
"""The engine's pipes are read through a buffer as large as a Linux pipe: a flood is drained in few reads."""
_TERMINAL_CODES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI (colours, cursor moves, clearing the screen) to its final byte
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC (a window title), DCS,
    # SOS, PM, APC strings, to BEL or ST
    r"|\x1b[ -/]*[0-~]?")  # any other escape sequence
"""Terminal escape sequences, removed whole from an engine's text (their control characters alone would leave
their parameters behind as noise)."""


def engine_text(text: str, limit: int = ENGINE_TEXT_CHARS) -> str:
    """An engine's text as it may be shown or saved: escape sequences removed, every other character that is not
    printable (control characters, format characters such as bidi overrides, line breaks) a space, runs of spaces
    one, and at most `limit` characters (a longer text ends in `...`). Only its first 8 x `limit` characters are
    looked at: a 64 KiB line costs no more than a short one."""
    head = text[:8 * limit]
    clean = " ".join("".join(ch if ch.isprintable() else " " for ch in _TERMINAL_CODES.sub("", head)).split())
    return clean if len(clean) <= limit and len(head) == len(text) else clean[:limit - 3] + "..."


def read_lines(pipe):
    """Each line `pipe` (a binary file) gives, without its line break, as (at most `LINE_BYTES` bytes, whether it
    was cut): the rest of a longer line is read and dropped, so a line without end costs `LINE_BYTES` and a pipe's
    buffer, never more. Ends at the end of the output, or when `EngineProcess.kill` closes the pipe under it."""
    try:
        while True:
            raw = pipe.readline(LINE_BYTES + 1)
            if not raw:
                return
            if raw.endswith(b"\n") or len(raw) <= LINE_BYTES:  # whole (the last may lack its newline)
                yield raw.rstrip(b"\r\n"), False
                continue
            yield raw[:LINE_BYTES], True
            while (rest := pipe.readline(LINE_BYTES)) and not rest.endswith(b"\n"):
                pass  # dropped: the line's head was all that is kept
    except ValueError:  # `kill` closed the pipe while this thread read it: the end of the output too
        return


class LineQueue:
    """An engine's stdout lines between its reader thread and the match: at most `QUEUED_LINES` at once. The reader
    waits for room (so an engine that writes more than the match reads waits on its pipe), until `close`d."""

    def __init__(self):
        self._items: collections.deque = collections.deque()
        self._changed = threading.Condition()
        self._closed = False

    def put(self, item) -> bool:
        """Add `item` once there is room; False (and nothing added) once the queue is closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or len(self._items) < QUEUED_LINES)
            if self._closed:
                return False
            self._items.append(item)
            self._changed.notify_all()
            return True

    def get(self, timeout: float):
        """The oldest item; `queue.Empty` when none came within `timeout` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._items, timeout):
                raise queue.Empty
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)

    def close(self) -> None:
        """Let a waiting reader go: its engine is gone, and so is any line still to come."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
