"""External USI engines as players of a match: a side named `usi:PATH` is the engine at PATH, run as a subprocess.

Written on `subprocess` with a reader thread rather than on cshogi's USI client (`cshogi.usi.Engine`): that client
reads the engine's output with a blocking `readline` and no timeout, so a hung engine would hang the match, and it
never sees the end of output (it compares bytes with `''`), so a crashed one would spin for ever. Here every wait
has a deadline, and a line read is a line whole (its first 64 KiB: a longer one is cut, not refused).

Whatever an engine writes, the memory it costs is bounded (`tideborn.match.engine_output`: its lines, at most
64 KiB of each, 64 of them queued, and a short tail of stderr; with the options it declares, `MAX_OPTIONS` names of
at most `MAX_OPTION_NAME_CHARS`, under 5 MiB an engine), and its text (its `id name`, a line or a move quoted in a
message, its last words on stderr) is shown and saved only through `engine_text`: printable, at most 100 characters.

Before any game each engine is started and checked (`usi` answered with `id`/`option` lines and `usiok`, the
options it is given among those it declares, `isready` answered `readyok`): anything else is a `UserError` naming
the engine, one line and exit status 2. During a game an engine that exits, gives no `bestmove` within its limit,
resigns or plays an illegal move loses that game (a `Forfeit` with the reason); a dead or killed engine is started
again for its next move, and the match goes on. docs/match.md, "Your engine itself: `usi:PATH`".
"""

from __future__ import annotations

import collections
import os
import queue
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import cshogi

from tideborn.errors import UserError
from tideborn.match.engine_output import (
    ENGINE_TEXT_CHARS,
    PIPE_BUFFER_BYTES,
    STDERR_TAIL_LINES,
    LineQueue,
    engine_text,
    read_lines,
)
from tideborn.match.play import Forfeit, Game

USI_PREFIX = "usi:"
DEFAULT_BYOYOMI_MS = 1000
GRACE_MS = 1000
"""How long past its byoyomi an engine may take before it loses on time (the default --engine-timeout)."""
NODES_ONLY_TIMEOUT_MS = 30_000
"""The default --engine-timeout when engines get `go nodes N` and no clock."""
DEFAULT_START_TIMEOUT_MS = 30_000
"""From start to `readyok`: a net's engine loads its model first (torch alone takes seconds on a busy machine)."""
QUIT_WAIT_SECONDS = 2.0
MAX_OPTIONS = 1000
"""An engine that declares more options than this is refused: far past any real engine's, and each is kept."""
MAX_OPTION_NAME_CHARS = 256
"""An engine that declares an option with a longer name is refused too: 1,000 such names are 256 KiB at most."""

_USI_MOVE = re.compile(r"[1-9][a-i][1-9][a-i]\+?|[PLNSGBR]\*[1-9][a-i]")
_START_LINES = ("id ", "option ", "info ")
"""What an engine may say before `usiok` or `readyok`; anything else is not USI."""


@dataclass(frozen=True)
class EngineSettings:
    byoyomi_ms: int | None = None
    nodes: int | None = None
    timeout_ms: int | None = None
    """The most a move may take; None: the byoyomi + GRACE_MS, or NODES_ONLY_TIMEOUT_MS with nodes alone."""
    start_timeout_ms: int = DEFAULT_START_TIMEOUT_MS
    options: tuple[tuple[int | None, str, str], ...] = ()
    """(player number as named, from 1, or None for every engine; option name; value)."""

    def go_command(self) -> str:
        parts = ["go"]
        byoyomi = self.byoyomi_ms if self.byoyomi_ms is not None or self.nodes is not None else DEFAULT_BYOYOMI_MS
        if byoyomi is not None:
            parts += ["btime", "0", "wtime", "0", "byoyomi", str(byoyomi)]
        if self.nodes is not None:
            parts += ["nodes", str(self.nodes)]
        return " ".join(parts)

    def move_timeout_ms(self) -> int:
        if self.timeout_ms is not None:
            return self.timeout_ms
        if self.byoyomi_ms is None and self.nodes is not None:
            return NODES_ONLY_TIMEOUT_MS
        return (self.byoyomi_ms if self.byoyomi_ms is not None else DEFAULT_BYOYOMI_MS) + GRACE_MS

    def options_for(self, number: int) -> list[tuple[str, str]]:
        return [(name, value) for who, name, value in self.options if who is None or who == number]

    def as_dict(self) -> dict:
        return {"go": self.go_command(), "timeout_ms": self.move_timeout_ms(),
                "start_timeout_ms": self.start_timeout_ms}


def is_engine_side(path: Path | str) -> bool:
    return str(path).startswith(USI_PREFIX)


class EngineError(Exception):
    """What went wrong with an engine, in words (at start: a UserError; in a game: the forfeit's detail)."""


class EngineProcess:
    """One engine subprocess and the lines it writes, each wait bounded by a deadline."""

    def __init__(self, path: Path, options: list[tuple[str, str]], settings: EngineSettings):
        self.path, self.options, self.settings = path, options, settings
        self.proc: subprocess.Popen | None = None
        self.lines = LineQueue()
        self.stderr_tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.name: str | None = None
        self.declared: dict[str, str] = {}

    # start --------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine and take it to `readyok` with its options set; EngineError otherwise (the process
        is then ended)."""
        self.kill()  # what is left of an engine that exited on its own: its pipes, a reader waiting for room
        try:
            self.proc = subprocess.Popen([str(self.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, cwd=self.path.parent, start_new_session=True,
                                         bufsize=PIPE_BUFFER_BYTES)
        except OSError as exc:
            raise EngineError(f"cannot start it ({exc.strerror or exc})") from None
        self.lines = LineQueue()
        self.stderr_tail.clear()
        threading.Thread(target=self._read_stdout, args=(self.proc, self.lines), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(self.proc,), daemon=True).start()
        try:
            self._handshake()
        except EngineError:
            self.kill()
            raise

    def _handshake(self) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_ms / 1000
        self.send("usi")
        self.declared = {}
        while True:
            line = self._next(deadline, "usiok")
            if line == "usiok":
                break
            if line.startswith("id name "):
                self.name = engine_text(line[len("id name "):]) or None
            elif line.startswith("option name "):
                words = line.split()
                cut = words.index("type") if "type" in words else len(words)
                option = " ".join(words[2:cut])
                if len(option) > MAX_OPTION_NAME_CHARS:
                    raise EngineError(f"not a USI engine: it declared an option named with {len(option):,} "
                                      f"characters (at most {MAX_OPTION_NAME_CHARS} expected)")
                self.declared[option.lower()] = option
                if len(self.declared) > MAX_OPTIONS:
                    raise EngineError(f"not a USI engine: it declared more than {MAX_OPTIONS:,} options")
            elif line.strip() and not line.startswith(_START_LINES):
                raise EngineError(f"not a USI engine: it answered {engine_text(line, 60)!r} to 'usi' (expected id, "
                                  "option and usiok lines)")
        for name, value in self.options:
            if name.lower() not in self.declared:
                known = engine_text(", ".join(self.declared.values()), 2 * ENGINE_TEXT_CHARS) or "none"
                raise EngineError(f"--engine-option {name}={value}: the engine has no option {name!r} "
                                  f"(its options: {known})")
            self.send(f"setoption name {self.declared[name.lower()]} value {value}")
        self.send("isready")
        while True:
            line = self._next(deadline, "readyok")
            if line == "readyok":
                break
            if line.strip() and not line.startswith("info"):
                raise EngineError(f"not a USI engine: it answered {engine_text(line, 60)!r} to 'isready' "
                                  "(expected readyok)")
        self.send("usinewgame")

    # lines --------------------------------------------------------------------------------------------------

    @staticmethod
    def _read_stdout(proc: subprocess.Popen, lines: LineQueue) -> None:
        for line in read_lines(proc.stdout):
            if not lines.put(line):
                return  # killed: nobody reads these lines any more
        lines.put(None)  # the end of its output: it exited or closed stdout

    def _read_stderr(self, proc: subprocess.Popen) -> None:
        # Drained so an engine that writes much there never blocks on a full pipe; the last lines say why it died.
        for raw, _ in read_lines(proc.stderr):
            text = engine_text(raw.decode("utf-8", "replace"))
            if text:
                self.stderr_tail.append(text)

    def send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode("utf-8") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it has exited; its end of output says so, with its exit status, on the next read

    def _next(self, deadline: float, waiting_for: str) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise EngineTimeout(f"no {waiting_for} within {self._limit_text(waiting_for)}") from None
        if line is None:
            raise EngineCrash(f"it exited before {waiting_for} ({self._exit_text()})")
        raw, cut = line
        try:
            # A cut line may end inside a character; its head is all that is read of it anyway.
            return raw.decode("utf-8", "replace" if cut else "strict")
        except UnicodeDecodeError:
            raise EngineError(f"it wrote bytes that are not text: {raw[:40]!r}") from None

    def _limit_text(self, waiting_for: str) -> str:
        seconds = (self.settings.move_timeout_ms() if waiting_for == "bestmove"
                   else self.settings.start_timeout_ms) / 1000
        return f"{seconds:g} s"

    def _exit_text(self) -> str:
        try:
            status = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            status = None
        said = f"; its last words on stderr: {self.stderr_tail[-1]!r}" if self.stderr_tail else ""
        return (f"exit status {status}" if status is not None else "its output closed") + said

    # moves --------------------------------------------------------------------------------------------------

    def bestmove(self, position: str) -> str:
        """The engine's `bestmove` word for `position` (a USI position command), within the move's time."""
        deadline = time.monotonic() + self.settings.move_timeout_ms() / 1000
        self.send(position)
        self.send(self.settings.go_command())
        while True:
            line = self._next(deadline, "bestmove")
            if line.startswith("bestmove"):
                words = line.split()
                return words[1] if len(words) > 1 else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        self.lines.close()  # a reader waiting for room ends: nothing reads this process's lines again
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)  # its own session: a wrapper script's children go with it
            except ProcessLookupError:
                pass  # it exited in the meantime
            self.proc.wait()
        self._close_pipes()
        self.proc = None

    def quit(self) -> None:
        if self.proc is None:
            return
        self.send("quit")
        try:
            self.proc.wait(timeout=QUIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            pass  # it does not leave when asked: killed below
        self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass  # a broken pipe to a dead engine: nothing left to flush


class EngineTimeout(EngineError):
    pass


class EngineCrash(EngineError):
    pass


@dataclass
class UsiPlayer:
    """A match side played by an external engine: asked for one move at a time (`choose`)."""
    process: EngineProcess
    info: dict
    name: str
    restarts: int = 0
    external: bool = field(default=True, init=False)

    def choose(self, game: Game) -> int | Forfeit:
        board = game.board
        if not self.process.alive():
            try:
                self.restarts += 1
                self.info["restarts"] = self.restarts
                self.process.start()
            except EngineError as exc:
                return Forfeit("engine crashed", f"{self.info['path']} could not be started again: {exc}")
        moves = " ".join(cshogi.move_to_usi(move) for move in game.moves)
        position = f"position sfen {game.sfen}" + (f" moves {moves}" if moves else "")
        try:
            word = self.process.bestmove(position)
        except EngineTimeout as exc:
            self.process.kill()  # a late bestmove must not answer the next position
            return Forfeit("engine timed out", f"{self.info['path']}: {exc}")
        except EngineError as exc:
            self.process.kill()
            return Forfeit("engine crashed", f"{self.info['path']}: {exc}")
        if word == "resign":
            return Forfeit("resign", f"{self.info['path']} resigned")
        if word == "win":  # the game would have ended already had the declaration been right (play._judge)
            return Forfeit("false win declaration", f"{self.info['path']} declared a win that the rules refuse")
        move = board.move_from_usi(word) if _USI_MOVE.fullmatch(word) else 0
        if not move or not board.is_legal(move):
            return Forfeit("illegal move", f"{self.info['path']} played {engine_text(word, 40)!r}, not a legal "
                                           f"move in {board.sfen()}")
        return move

    def close(self) -> None:
        self.process.quit()


def load_engine(side: str, number: int, settings: EngineSettings) -> UsiPlayer:
    """The engine a `usi:PATH` side names, started and ready; `UserError` naming it for anything else."""
    path = Path(side[len(USI_PREFIX):]).expanduser()
    if not str(path) or not side[len(USI_PREFIX):]:
        raise UserError(f"{side}: no engine path after 'usi:'")
    if not path.exists():
        raise UserError(f"{side}: no such engine")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UserError(f"{side}: not an executable file (a USI engine is a program; chmod +x, or a script "
                        "with a #! line)")
    options = settings.options_for(number)
    process = EngineProcess(path.absolute(), options, settings)
    try:
        process.start()
    except EngineError as exc:
        raise UserError(f"{side}: {exc}") from None
    info = {"path": side, "kind": "usi", "engine": process.name, "options": dict(options),
            **settings.as_dict(), "restarts": 0}
    return UsiPlayer(process, info, f"usi/{process.name or path.name}")
