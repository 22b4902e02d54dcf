"""An engine's output readers end quietly when `EngineProcess.kill` closes the pipe under them.

`kill` closes the engine's pipes once it is dead; a reader thread still iterating over stdout or stderr then met a
closed file (ValueError, or "PyMemoryView_FromBuffer(): info->buf must not be NULL" mid-read), an unhandled
exception in a thread that pytest reported and a user's terminal would print."""

from __future__ import annotations

import os
import queue
import types

from tideborn.match.external import EngineProcess


def closed_pipe():
    read, write = os.pipe()
    os.close(write)
    pipe = os.fdopen(read, "rb")
    pipe.close()
    return pipe


def test_a_closed_stdout_is_the_end_of_the_engines_output() -> None:
    lines: queue.Queue = queue.Queue()
    EngineProcess._read_stdout(types.SimpleNamespace(stdout=closed_pipe()), lines)
    assert lines.get_nowait() is None and lines.empty()


def test_a_closed_stderr_ends_its_reader() -> None:
    engine = EngineProcess.__new__(EngineProcess)  # the reader needs only its tail of stderr lines
    engine.stderr_tail = []
    engine._read_stderr(types.SimpleNamespace(stderr=closed_pipe()))
    assert engine.stderr_tail == []
