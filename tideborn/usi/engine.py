"""The USI protocol of `tideborn usi`: commands read on the main thread, thinking in a worker thread, so stdin is
always read (a `stop` or `quit` is heard while the engine thinks), and every line written whole under one lock.

What the engine does with each command, its options and its time rule: docs/match.md, "In a shogi GUI (USI)".
A command it cannot use (an unknown command, a bad `position`, an unknown option or value) is answered with one
`info string error: ...` line (also on stderr) and otherwise ignored: a GUI has no way to hear an exit status.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, TextIO

import cshogi

from tideborn import __version__
from tideborn.errors import UserError
from tideborn.usi.thinking import Clock, Limits, Thinker, Thought, move_budget_ms

DEFAULT_NETWORK_DELAY_MS = 100
"""What the engine keeps back from every deadline for the GUI and the pipes (the NetworkDelay option)."""
MAX_PLAYOUTS = 100_000_000


@dataclass
class Option:
    name: str
    kind: str
    """USI's option types used here: `check` or `spin`."""
    default: int | bool
    low: int = 0
    high: int = 0

    def declaration(self) -> str:
        if self.kind == "check":
            return f"option name {self.name} type check default {'true' if self.default else 'false'}"
        return f"option name {self.name} type spin default {self.default} min {self.low} max {self.high}"

    def parse(self, text: str) -> int | bool:
        if self.kind == "check":
            if text not in ("true", "false"):
                raise UserError(f"option {self.name}: {text!r} is not true or false")
            return text == "true"
        try:
            value = int(text)
        except ValueError:
            raise UserError(f"option {self.name}: {text!r} is not a whole number") from None
        if not self.low <= value <= self.high:
            raise UserError(f"option {self.name}: {value} is outside {self.low}..{self.high}")
        return value


@dataclass(frozen=True)
class Go:
    clock: Clock
    nodes: int | None = None
    infinite: bool = False
    ponder: bool = False


_GO_NUMBERS = ("btime", "wtime", "binc", "winc", "byoyomi", "nodes")


def parse_go(tokens: list[str]) -> Go:
    """The `go` command's limits; `UserError` for a field it cannot read (the engine then answers at once)."""
    numbers: dict[str, int] = {}
    flags = set()
    index = 0
    while index < len(tokens):
        word = tokens[index]
        if word in _GO_NUMBERS:
            if index + 1 >= len(tokens):
                raise UserError(f"go: {word} without a number")
            try:
                numbers[word] = int(tokens[index + 1])
            except ValueError:
                raise UserError(f"go: {word} {tokens[index + 1]!r} is not a whole number") from None
            index += 2
            continue
        if word in ("infinite", "ponder"):
            flags.add(word)
        elif word == "mate":
            raise UserError("go mate: this engine does not search for mates (no `go mate`)")
        else:
            raise UserError(f"go: unknown field {word!r}")
        index += 1
    clock = Clock(**{key: numbers[key] for key in ("btime", "wtime", "binc", "winc", "byoyomi") if key in numbers})
    return Go(clock, numbers.get("nodes"), "infinite" in flags, "ponder" in flags)


class Engine:
    """One USI session. `think_with(playouts)` returns the thinker for a Playouts value: 0 or 1 the policy,
    more a search."""

    def __init__(self, name: str, think_with: Callable[[int], Thinker], *, playouts: int,
                 out: TextIO = sys.stdout, err: TextIO = sys.stderr):
        self.name = name
        self.think_with = think_with
        self.out, self.err = out, err
        self.options = {option.name.lower(): option for option in (
            Option("USI_Ponder", "check", False),
            Option("USI_Hash", "spin", 256, 1, 1 << 20),  # GUIs send it to every engine; there is no hash table
            Option("Playouts", "spin", playouts, 0, MAX_PLAYOUTS),
            Option("NetworkDelay", "spin", DEFAULT_NETWORK_DELAY_MS, 0, 60_000),
        )}
        self.values: dict[str, int | bool] = {key: option.default for key, option in self.options.items()}
        self.thinker = think_with(playouts)
        self.board: cshogi.Board | None = cshogi.Board()
        self.write_lock = threading.Lock()
        self.worker: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.ponderhit_event = threading.Event()
        self.ponderhit_time: float | None = None

    # output -------------------------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        with self.write_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def complain(self, message: str) -> None:
        """A command the engine could not use: one line to the GUI and the same on stderr."""
        message = " ".join(message.split())
        self.say(f"info string error: {message}")
        print(f"tideborn usi: {message}", file=self.err, flush=True)

    # the loop -----------------------------------------------------------------------------------------------

    def run(self, lines) -> int:
        """Read commands until `quit` or the end of input; 0 either way."""
        try:
            for line in lines:
                if not self.handle(line):
                    break
        finally:
            self.finish_thinking()
        return 0

    def handle(self, line: str) -> bool:
        tokens = line.split()
        if not tokens:
            return True
        command, rest = tokens[0], tokens[1:]
        if command == "quit":
            return False
        handler = {
            "usi": self.on_usi, "isready": self.on_isready, "setoption": self.on_setoption,
            "usinewgame": self.on_usinewgame, "position": self.on_position, "go": self.on_go,
            "stop": self.on_stop, "ponderhit": self.on_ponderhit, "gameover": self.on_gameover,
        }.get(command)
        if handler is None:
            self.complain(f"unknown command {command!r}")
            return True
        try:
            handler(rest, line)
        except UserError as exc:
            self.complain(str(exc))
        return True

    def on_usi(self, rest, line) -> None:
        self.say(f"id name tideborn {__version__} ({self.name})")
        self.say("id author the tideborn authors")
        for option in self.options.values():
            self.say(option.declaration())
        self.say("usiok")

    def on_isready(self, rest, line) -> None:
        self.finish_thinking()
        self.say(f"info string {self.thinker.name}, measured latency {self.thinker.latency_ms:.1f} ms")
        self.say("readyok")

    def on_setoption(self, rest, line) -> None:
        if len(rest) < 2 or rest[0] != "name":
            raise UserError(f"setoption: expected 'setoption name NAME value VALUE'; got {line.strip()!r}")
        cut = rest.index("value") if "value" in rest else len(rest)
        name, value = " ".join(rest[1:cut]), " ".join(rest[cut + 1:])
        option = self.options.get(name.lower())
        if option is None:
            known = ", ".join(option.name for option in self.options.values())
            raise UserError(f"setoption: no option {name!r} (options: {known})")
        parsed = option.parse(value)
        if option.name == "Playouts":
            self.finish_thinking()
            self.thinker = self.think_with(int(parsed))  # refused before the value is kept
        self.values[option.name.lower()] = parsed

    def on_usinewgame(self, rest, line) -> None:
        self.finish_thinking()

    def on_gameover(self, rest, line) -> None:
        self.finish_thinking()

    def on_position(self, rest, line) -> None:
        from tideborn.match.openings import board_of_position

        self.finish_thinking()
        self.board = None  # a position that cannot be read leaves none: `go` then resigns rather than guess
        self.board = board_of_position(" ".join(rest), "position")

    def on_stop(self, rest, line) -> None:
        self.stop_event.set()

    def on_ponderhit(self, rest, line) -> None:
        self.ponderhit_time = time.monotonic()
        self.ponderhit_event.set()

    def on_go(self, rest, line) -> None:
        received = time.monotonic()
        self.finish_thinking()
        try:
            go = parse_go(rest)
        except UserError as exc:
            self.complain(str(exc))
            go = Go(Clock(byoyomi=0))
        self.stop_event = threading.Event()
        self.ponderhit_event = threading.Event()
        self.ponderhit_time = None
        board = self.board.copy() if self.board is not None else None
        self.worker = threading.Thread(target=self._think, args=(board, go, received), name="usi-think",
                                       daemon=True)
        self.worker.start()

    def finish_thinking(self) -> None:
        """Stop a search in progress and wait for its `bestmove` (sent, as USI asks, even when stopped)."""
        if self.worker is not None:
            self.stop_event.set()
            self.ponderhit_event.set()
            self.worker.join()
            self.worker = None

    # thinking (the worker thread) ---------------------------------------------------------------------------

    def _limits(self, go: Go, turn: int, started: float) -> Limits:
        playouts = go.nodes
        budget = move_budget_ms(go.clock, turn, self.values["networkdelay"] + 2 * self.thinker.latency_ms)
        deadline = None if budget is None else started + budget / 1000
        return Limits(deadline=deadline, playouts=playouts)

    def _think(self, board: cshogi.Board | None, go: Go, received: float) -> None:
        try:
            answer = self._bestmove(board, go, received)
        except BrokenPipeError:
            self.stop_event.set()  # the GUI is gone; the main thread sees the end of input
            return
        except Exception:  # noqa: BLE001 - a bug: its traceback on stderr, and still a bestmove so the GUI is not left waiting
            traceback.print_exc(file=self.err)
            self.complain("thinking failed (a bug: the traceback is on stderr); resigning")
            answer = "bestmove resign"
        try:
            self.say(answer)
        except BrokenPipeError:
            self.stop_event.set()

    def _bestmove(self, board: cshogi.Board | None, go: Go, received: float) -> str:
        if board is None:
            self._wait_for_release(go)
            return "bestmove resign"
        if board.is_nyugyoku():
            self._wait_for_release(go)
            return "bestmove win"
        if board.is_game_over():
            self._wait_for_release(go)
            return "bestmove resign"
        started = time.monotonic()
        if go.ponder:
            # Ponder until the GUI says which: `stop` (the guess was wrong; any answer will do) or `ponderhit`
            # (think again on the real clock, which starts now).
            either = _Either(self.stop_event, self.ponderhit_event)
            thought = self._run(board, Limits(playouts=go.nodes, until_stopped=True), either, started)
            either.wait()
            if self.stop_event.is_set() or self.ponderhit_time is None:
                return self._answer(thought)
            started = self.ponderhit_time
            go = Go(go.clock, go.nodes)
        limits = (Limits(playouts=go.nodes, until_stopped=True) if go.infinite
                  else self._limits(go, board.turn, received))
        thought = self._run(board, limits, self.stop_event, started)
        if go.infinite:
            self.stop_event.wait()  # USI: after `go infinite`, bestmove only once `stop` comes
        return self._answer(thought)

    def _wait_for_release(self, go: Go) -> None:
        if go.infinite:
            self.stop_event.wait()
        elif go.ponder:
            _Either(self.stop_event, self.ponderhit_event).wait()

    def _run(self, board, limits: Limits, stop, started: float) -> Thought:
        def info(thought: Thought) -> None:
            self.say(self._info_line(thought, started))

        thought = self.thinker.think(board, limits, stop, info)
        self.say(self._info_line(thought, started))
        return thought

    @staticmethod
    def _info_line(thought: Thought, started: float) -> str:
        elapsed_ms = max(0, int((time.monotonic() - started) * 1000))
        nps = int(thought.nodes * 1000 / elapsed_ms) if elapsed_ms else thought.nodes
        score = f"mate {thought.mate}" if thought.mate else f"cp {thought.score_cp}"
        pv = " ".join(cshogi.move_to_usi(move) for move in thought.pv)
        return (f"info depth {thought.depth} seldepth {thought.depth} time {elapsed_ms} nodes {thought.nodes} "
                f"nps {nps} score {score} pv {pv}")

    @staticmethod
    def _answer(thought: Thought) -> str:
        return f"bestmove {cshogi.move_to_usi(thought.move)}"


class _Either:
    """Set when either of two events is: what a ponder search stops on. Polls (threading has no wait-any)."""

    def __init__(self, first: threading.Event, second: threading.Event):
        self.first, self.second = first, second

    def is_set(self) -> bool:
        return self.first.is_set() or self.second.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if end is not None and time.monotonic() >= end:
                return False
            self.first.wait(0.01)
        return True
