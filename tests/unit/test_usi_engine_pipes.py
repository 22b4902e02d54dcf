"""An external engine's output as `tideborn match` reads it (`tideborn.match.engine_output`): the readers end quietly
when `EngineProcess.kill` closes the pipe under them; a line without end is cut, never held whole; stdout lines wait
in a queue that never holds more than `QUEUED_LINES`; an engine's text is shown without its escape sequences.

`kill` closes the engine's pipes once it is dead; a reader thread still iterating over stdout or stderr then met a
closed file (ValueError, or "PyMemoryView_FromBuffer(): info->buf must not be NULL" mid-read), an unhandled
exception in a thread that pytest reported and a user's terminal would print. A line read whole took an engine's
2.4 GB of stderr without a newline to a 7.4 GB peak in `tideborn match` (tests/e2e/test_usi_match.py runs it)."""

from __future__ import annotations

import os
import threading
import time
import types

from tideborn.match.engine_output import (
    ENGINE_TEXT_CHARS,
    LINE_BYTES,
    PIPE_BUFFER_BYTES,
    QUEUED_LINES,
    LineQueue,
    engine_text,
    read_lines,
)
from tideborn.match.external import EngineProcess

WAIT_SECONDS = 60.0
"""A wait for a reader that fails the test rather than hanging the suite; not a speed threshold."""


def closed_pipe():
    read, write = os.pipe()
    os.close(write)
    pipe = os.fdopen(read, "rb")
    pipe.close()
    return pipe


def fed_pipe(*chunks: bytes):
    """The read end of a pipe that a thread fills with `chunks`, then closes (it stops early if the reader goes)."""
    read, write = os.pipe()

    def feed() -> None:
        with os.fdopen(write, "wb") as out:
            try:
                for chunk in chunks:
                    out.write(chunk)
            except BrokenPipeError:
                pass  # the test closed its end: what was read is what it checks

    threading.Thread(target=feed, daemon=True).start()
    return os.fdopen(read, "rb", buffering=PIPE_BUFFER_BYTES)


def test_a_closed_stdout_is_the_end_of_the_engines_output() -> None:
    lines = LineQueue()
    EngineProcess._read_stdout(types.SimpleNamespace(stdout=closed_pipe()), lines)
    assert lines.get(timeout=0) is None and len(lines) == 0


def test_a_closed_stderr_ends_its_reader() -> None:
    engine = EngineProcess.__new__(EngineProcess)  # the reader needs only its tail of stderr lines
    engine.stderr_tail = []
    engine._read_stderr(types.SimpleNamespace(stderr=closed_pipe()))
    assert engine.stderr_tail == []


def test_a_line_without_end_is_cut_and_the_next_line_read_whole() -> None:
    blob = b"x" * (1 << 20)
    with fed_pipe(b"info string ", *[blob] * 48, b"\r\nbestmove 7g7f\n", b"y" * (3 * LINE_BYTES)) as pipe:
        got = list(read_lines(pipe))
    assert [len(raw) for raw, _ in got] == [LINE_BYTES, len(b"bestmove 7g7f"), LINE_BYTES]
    assert [cut for _, cut in got] == [True, False, True]
    assert got[0][0].startswith(b"info string xxx") and got[1][0] == b"bestmove 7g7f"


def test_stderr_keeps_a_short_clean_tail_of_a_flood() -> None:
    engine = EngineProcess.__new__(EngineProcess)
    engine.stderr_tail = []
    flood = b"\x1b]0;pwned\x07" + b"e" * (16 << 20)  # 16 MiB without a newline
    engine._read_stderr(types.SimpleNamespace(stderr=fed_pipe(flood, b"\n", b"last \x1b[2Jwords\n")))
    assert engine.stderr_tail == ["e" * (ENGINE_TEXT_CHARS - 3) + "...", "last words"]


def test_stdout_lines_wait_in_a_bounded_queue_and_a_kill_lets_the_reader_go() -> None:
    lines = LineQueue()
    pipe = fed_pipe(*[b"info depth 1\n"] * (50 * QUEUED_LINES))
    reader = threading.Thread(target=EngineProcess._read_stdout, args=(types.SimpleNamespace(stdout=pipe), lines),
                              daemon=True)
    reader.start()
    deadline = time.monotonic() + WAIT_SECONDS
    while len(lines) < QUEUED_LINES and reader.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # waiting for a state: the queue full, the reader waiting for room
    assert reader.is_alive() and len(lines) == QUEUED_LINES
    assert lines.get(timeout=0) == (b"info depth 1", False)
    lines.close()  # what `kill` does: the reader stops waiting for room, and ends
    reader.join(WAIT_SECONDS)
    assert not reader.is_alive() and len(lines) <= QUEUED_LINES
    pipe.close()


def test_engine_text_is_printable_and_short() -> None:
    hostile = "\x1b[2J\x1b]0;pwned\x07\x1b[31mred\x1b[0m\x9b1m \u202eevil\r\n\x08\x00tab\there " + "n" * 5000
    text = engine_text(hostile)
    assert text.startswith("red evil tab here nnn") and text.endswith("...") and len(text) == ENGINE_TEXT_CHARS
    assert text.isprintable()
    assert engine_text("やねうら王 NNUE 8.50") == "やねうら王 NNUE 8.50"
    assert engine_text("\x1b]2;title without end") == ""  # a terminal would swallow it too
    assert engine_text("x" * 5000, 40) == "x" * 37 + "..."
