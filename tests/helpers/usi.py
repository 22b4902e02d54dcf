"""USI engines for tests: a tiny net's checkpoint, `tideborn usi` behind an executable script (what GUIs and
`tideborn match usi:PATH` start), small Python engines that crash, hang or speak garbage, and a pipe to talk to
an engine line by line with a deadline on every wait; `InProcessEngine` talks the same way to the engine object
in the test process."""

from __future__ import annotations

import io
import queue
import shlex
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from tests.helpers.common import child_env, settings_args, trainer_in_process

WAIT_SECONDS = 600.0
"""A wait for an engine's line that fails the test rather than hanging the suite; not a speed threshold (an
engine's start imports torch, seconds on a busy machine)."""


def tiny_checkpoint(root: Path) -> Path:
    """A 1x8 net trained one step on synthetic data, in this process: a checkpoint as the trainer writes it."""
    run_dir = root / "tiny"
    result = trainer_in_process("train", *settings_args(run_dir, "model.blocks=1", "model.channels=8",
                                                        "runtime.max_steps=1", "runtime.checkpoint_every=1",
                                                        'runtime.progress="plain"'), cwd=root)
    assert result.returncode == 0, result.stderr
    return run_dir / "step-000000001.pt"


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def engine_script(path: Path, model: Path, *args: str) -> Path:
    """An executable that runs `tideborn usi MODEL ARGS` on one CPU thread, as a GUI would be told to run it."""
    env = child_env()
    command = " ".join(shlex.quote(part) for part in (sys.executable, "-m", "tideborn", "usi", str(model), *args))
    return _executable(path, textwrap.dedent(f"""\
        #!/bin/sh
        export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH={shlex.quote(env["PYTHONPATH"])}
        exec {command} "$@"
        """))


FAKE_ENGINE = '''\
import os, sys, time
import cshogi

BEHAVIOUR, ARGUMENT, MARKER = sys.argv[1], int(sys.argv[2]), sys.argv[3]
first = not os.path.exists(MARKER)  # only the first process misbehaves in a game: its restart plays on
if first and BEHAVIOUR in ("crash", "hang", "illegal"):
    open(MARKER, "w").close()


def say(line):
    sys.stdout.write(line + "\\n")
    sys.stdout.flush()


def flood(stream, mebibytes):
    """`mebibytes` MiB of one line with no newline, written a MiB at a time (the writer holds no more)."""
    blob = b"x" * (1 << 20)
    for _ in range(mebibytes):
        stream.write(blob)
    stream.flush()


HOSTILE = "\\x1b[2J\\x1b]0;pwned\\x07\\x1b[31mred\\x9b1m\\r\\x08\\x00"  # clear screen, title, colour, C1 CSI


board, goes = cshogi.Board(), 0
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "usi":
        if BEHAVIOUR == "garbage":
            say("Welcome to my chess program!")
        if BEHAVIOUR == "silent":
            time.sleep(3600)
        if BEHAVIOUR == "flood":
            flood(sys.stderr.buffer, ARGUMENT)
        if BEHAVIOUR == "hostile":
            say("info string " + HOSTILE + "i" * 5000)
        say("id name " + (HOSTILE + "n" * 5000 if BEHAVIOUR == "hostile" else "fake-" + BEHAVIOUR))
        say("option name Depth type spin default 1 min 1 max 9")
        if BEHAVIOUR == "options":
            for number in range(1001):
                say(f"option name Knob{number} type check default false")
        if BEHAVIOUR == "nousiok":
            sys.exit(1)
        say("usiok")
    elif words[0] == "isready":
        say("readyok")
    elif words[0] == "position":
        if words[1] == "startpos":
            board.set_position(" ".join(words[1:]))
        else:
            cut = words.index("moves") if "moves" in words else len(words)
            board.set_sfen(" ".join(words[2:cut]))
            for move in words[cut + 1:]:
                board.push_usi(move)
    elif words[0] == "go":
        goes += 1
        if BEHAVIOUR == "flood" and goes == 1:
            sys.stdout.write("info string ")
            sys.stdout.flush()
            flood(sys.stdout.buffer, ARGUMENT)
            say("")
        if BEHAVIOUR == "hostile" and first and goes == 2:
            open(MARKER, "w").close()
            sys.stderr.write("dying " + HOSTILE + "w" * 5000 + "\\n")
            sys.exit(3)
        if first and goes == ARGUMENT:
            if BEHAVIOUR == "crash":
                sys.stderr.write("fake engine: crashing as told\\n")
                sys.exit(3)
            if BEHAVIOUR == "hang":
                time.sleep(3600)
            if BEHAVIOUR == "illegal":
                say("bestmove 5e5d")
                continue
        moves = list(board.legal_moves)
        say("bestmove " + (cshogi.move_to_usi(moves[0]) if moves else "resign"))
    elif words[0] == "quit":
        break
'''


def fake_engine(folder: Path, behaviour: str, on_go: int = 0) -> Path:
    """A small USI engine (first legal move) that misbehaves as told: `crash` (exit 3) or `hang` (no answer) or
    `illegal` (an illegal bestmove) on its `on_go`-th `go`, in its first process only; `garbage` (a banner
    before `id`), `nousiok` (exits before usiok) or `silent` (never answers) at start. `flood`: `on_go` MiB of one
    line on each pipe, stderr's after `usi` (never ended), stdout's an `info string` at its first `go` (then its
    bestmove). `hostile`: escape sequences and 5,000 characters in its `id name` and an `info string`, and in its
    last words on stderr as its first process exits (status 3) on its second `go`. `options`: 1,001 options."""
    script = folder / f"engine-{behaviour}.py"
    script.write_text(FAKE_ENGINE)
    marker = folder / f"engine-{behaviour}.first-done"
    command = " ".join(shlex.quote(part) for part in (sys.executable, str(script), behaviour, str(on_go),
                                                       str(marker)))
    return _executable(folder / f"engine-{behaviour}", f"#!/bin/sh\nexec {command}\n")


_PEAK_MEMORY = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
with open(sys.argv[1], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def run_with_peak_memory(command: list[str], cwd: Path, timeout: float = 300) -> tuple[subprocess.CompletedProcess,
                                                                                        int]:
    """`command` run to its end, and the peak resident memory in MiB of it or of any process it waited for (its
    engines): read from `getrusage(RUSAGE_CHILDREN)` in a small Python process that starts it and nothing else, so
    no earlier child of the test process counts."""
    report = cwd / "peak-rss-kib"
    result = subprocess.run([sys.executable, "-c", _PEAK_MEMORY, str(report), *command], cwd=cwd, env=child_env(),
                            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return result, int(report.read_text()) // 1024


class UsiPipe:
    """An engine process and the lines it writes, read by a thread so every wait has a deadline."""

    def __init__(self, command: list[str], cwd: Path):
        self.proc = subprocess.Popen(command, cwd=cwd, env=child_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str, seconds: float = WAIT_SECONDS) -> tuple[str, list[str]]:
        """The first line starting with `prefix`, and the lines before it."""
        return _expect(self.lines, prefix, seconds, lambda: self.proc.stderr.read())

    def nothing_for(self, seconds: float) -> list[str]:
        """The lines written in `seconds` (to check that no `bestmove` came too early)."""
        got, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            got.append(line)
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            pipe.close()


def _expect(lines: queue.Queue, prefix: str, seconds: float, stderr) -> tuple[str, list[str]]:
    """The first line on `lines` starting with `prefix`, and the lines before it; None on `lines` is the end."""
    before: list[str] = []
    end = time.monotonic() + seconds
    while True:
        try:
            line = lines.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {prefix!r} line within {seconds} s; got {before}") from None
        if line is None:
            raise AssertionError(f"the engine ended before {prefix!r}; got {before}; stderr {stderr()}")
        if line.startswith(prefix):
            return line, before
        before.append(line)


class _LineQueue(io.TextIOBase):
    """An engine's stdout in the test process: every whole line it writes, on a queue."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: queue.Queue = queue.Queue()
        self.partial = ""

    def write(self, text: str) -> int:
        *whole, self.partial = (self.partial + text).split("\n")
        for line in whole:
            self.lines.put(line)
        return len(text)

    def flush(self) -> None:
        pass


class InProcessEngine:
    """A `tideborn.usi.engine.Engine` reading its commands on a thread of the test process (its `run`, as the
    command-line reads stdin), its lines read back with a deadline on every wait, as `UsiPipe` does a process's.
    Its stderr is kept in `err`."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.out, self.err = _LineQueue(), io.StringIO()
        engine.out, engine.err = self.out, self.err
        self.commands: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=engine.run, args=(iter(self.commands.get, None),), name="usi-stdin",
                                       daemon=True)
        self.thread.start()

    def send(self, line: str) -> None:
        self.commands.put(line + "\n")

    def expect(self, prefix: str, seconds: float = WAIT_SECONDS) -> tuple[str, list[str]]:
        """The first line starting with `prefix`, and the lines before it."""
        return _expect(self.out.lines, prefix, seconds, self.err.getvalue)

    def close(self) -> None:
        """The end of input (the engine's `quit`); waits for its `run` to return."""
        self.commands.put(None)
        self.thread.join(WAIT_SECONDS)
        assert not self.thread.is_alive(), "the engine did not end at the end of its input"
