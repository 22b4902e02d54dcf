"""The USI protocol of `tideborn usi`: commands read on the main thread, the net run on one thinking thread for the
whole session (its warm-up at `isready` and every search), so stdin is always read (a `stop` or `quit` is heard
while the engine thinks), and every line written whole under one lock.

What the engine does with each command, its options and its time rule: docs/match.md, "In a shogi GUI (USI)".
A command it cannot use (an unknown command, a bad `position`, an unknown option or value, a negative limit) is
answered with one `info string error: ...` line (also on stderr) and otherwise ignored: a GUI has no way to hear an
exit status. The GUI's words are quoted there cut short and without control characters.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from typing import Callable, TextIO

import cshogi

from tideborn import __version__
from tideborn.errors import UserError
from tideborn.usi.commands import REFUSED_GO, Go, Option, echo, error_text, parse_go
from tideborn.usi.thinking import Limits, Thinker, Thought, move_budget_ms

DEFAULT_NETWORK_DELAY_MS = 100
"""What the engine keeps back from every deadline for the GUI and the pipes (the NetworkDelay option)."""
MAX_PLAYOUTS = 100_000_000
class _ThinkingThread:
    """The one thread that runs the net in a session: the warm-up at `isready` and every `go`, one at a time.
    A backend keeps state per thread (torch's OpenMP team and thread count are set up by a thread's first forward
    pass), so the thread that paid for that set-up, and whose latency was measured, is the thread that searches."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="usi-think", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job, done = self.jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # noqa: BLE001 - a bug in a job: its traceback, and the thread serves the next
                traceback.print_exc(file=self.err)
            finally:
                done.set()

    def submit(self, job: Callable[[], None]) -> threading.Event:
        """Run `job` on the thread after those before it; the event is set when it is done."""
        done = threading.Event()
        self.jobs.put((job, done))
        return done

    def close(self) -> None:
        self.jobs.put((None, None))
        self.thread.join()


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
        self.thinking_thread: _ThinkingThread | None = None
        self.search_done: threading.Event | None = None
        """Set when the `go` in progress has written its `bestmove`; None when none was started since."""
        self.search_ends_itself = True
        """Whether that `go` ends without a `stop` (a clock, a node limit), unlike `go infinite` and `go ponder`."""
        self.stop_event = threading.Event()
        self.ponderhit_event = threading.Event()
        self.ponderhit_time: float | None = None

    # output -------------------------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        with self.write_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def complain(self, message: str) -> None:
        """A command the engine could not use: one line to the GUI and the same on stderr, its words cut short and
        without control characters (the words quoted are the GUI's: they may be anything)."""
        message = error_text(message)
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
            if self.thinking_thread is not None:
                self.thinking_thread.close()
                self.thinking_thread = None
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
            self.complain(f"unknown command {echo(command)}")
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
        """Warm the net up and measure its latency on the thinking thread (once per thinker: USI lets `isready` take
        its time); while a search runs, `readyok` at once and the search goes on, as USI asks."""
        if self._thinking():
            self.say("readyok")
            return
        thinker = self.thinker
        self._thinking_thread().submit(lambda: self._warm_up(thinker)).wait()
        if thinker.latency_ms is not None:
            self.say(f"info string {thinker.name}, measured latency {thinker.latency_ms:.1f} ms")
        self.say("readyok")

    def _warm_up(self, thinker: Thinker) -> None:
        try:
            thinker.warm_up()
        except Exception:  # noqa: BLE001 - a bug: its traceback on stderr; the GUI still hears readyok
            traceback.print_exc(file=self.err)
            self.complain("warming the net up failed (a bug: the traceback is on stderr)")

    def on_setoption(self, rest, line) -> None:
        if len(rest) < 2 or rest[0] != "name":
            raise UserError(f"setoption: expected 'setoption name NAME value VALUE'; got {echo(line.strip())}")
        cut = rest.index("value") if "value" in rest else len(rest)
        name, value = " ".join(rest[1:cut]), " ".join(rest[cut + 1:])
        option = self.options.get(name.lower())
        if option is None:
            known = ", ".join(option.name for option in self.options.values())
            raise UserError(f"setoption: no option {echo(name)} (options: {known})")
        parsed = option.parse(value)
        if option.name == "Playouts":
            self.settle_thinking()
            self.thinker = self.think_with(int(parsed))  # refused before the value is kept
        self.values[option.name.lower()] = parsed

    def on_usinewgame(self, rest, line) -> None:
        self.finish_thinking()

    def on_gameover(self, rest, line) -> None:
        self.finish_thinking()

    def on_position(self, rest, line) -> None:
        from tideborn.match.openings import board_of_position

        self.settle_thinking()
        self.board = None  # a position that cannot be read leaves none: `go` then resigns rather than guess
        self.board = board_of_position(" ".join(rest), "position")

    def on_stop(self, rest, line) -> None:
        self.stop_event.set()

    def on_ponderhit(self, rest, line) -> None:
        self.ponderhit_time = time.monotonic()
        self.search_ends_itself = True  # it thinks on the clock from now
        self.ponderhit_event.set()

    def on_go(self, rest, line) -> None:
        self.settle_thinking()
        received = time.monotonic()  # the clock starts once the engine can think (a previous go has answered)
        try:
            go = parse_go(rest)
        except UserError as exc:
            self.complain(str(exc))
            go = REFUSED_GO
        self.stop_event = threading.Event()
        self.ponderhit_event = threading.Event()
        self.ponderhit_time = None
        board = self.board.copy() if self.board is not None else None
        thinker = self.thinker
        self.search_ends_itself = not (go.infinite or go.ponder)
        self.search_done = self._thinking_thread().submit(lambda: self._think(thinker, board, go, received))

    def _thinking_thread(self) -> _ThinkingThread:
        if self.thinking_thread is None:
            self.thinking_thread = _ThinkingThread(self.err)
        return self.thinking_thread

    def _thinking(self) -> bool:
        return self.search_done is not None and not self.search_done.is_set()

    def finish_thinking(self) -> None:
        """Stop a search in progress and wait for its `bestmove` (sent, as USI asks, even when stopped): `quit`,
        the end of input, `usinewgame`, `gameover`."""
        if self.search_done is not None:
            self.stop_event.set()
            self.ponderhit_event.set()
            self.search_done.wait()
            self.search_done = None

    def settle_thinking(self) -> None:
        """Before a command that changes what the engine thinks about (`position`, `go`, `setoption Playouts`):
        a search that ends by itself (its clock, its node limit) is waited for, never cut short, so a GUI or a script
        that sends its next commands early still gets the search it asked for; `go infinite` and `go ponder`,
        which would wait for a `stop` that cannot be read meanwhile, are stopped."""
        if self.search_done is not None and self.search_ends_itself:
            self.search_done.wait()
        self.finish_thinking()

    # thinking (the worker thread) ---------------------------------------------------------------------------

    def _limits(self, thinker: Thinker, go: Go, turn: int, started: float) -> Limits:
        playouts = go.nodes
        budget = move_budget_ms(go.clock, turn, self.values["networkdelay"] + 2 * (thinker.latency_ms or 0.0))
        deadline = None if budget is None else started + budget / 1000
        return Limits(deadline=deadline, playouts=playouts)

    def _think(self, thinker: Thinker, board: cshogi.Board | None, go: Go, received: float) -> None:
        try:
            self._warm_up(thinker)  # nothing to do after isready; without one, this move pays for it
            answer = self._bestmove(thinker, board, go, received)
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

    def _bestmove(self, thinker: Thinker, board: cshogi.Board | None, go: Go, received: float) -> str:
        if board is None:
            self._wait_for_release(go)
            return "bestmove resign"
        if board.is_nyugyoku():
            self._wait_for_release(go)
            return "bestmove win"
        if board.is_game_over():
            self._wait_for_release(go)
            return "bestmove resign"
        started = received  # `info time` counts from the go, as the deadline does
        if go.ponder:
            # Ponder until the GUI says which: `stop` (the guess was wrong; any answer will do) or `ponderhit`
            # (think again on the real clock, which starts now).
            either = _Either(self.stop_event, self.ponderhit_event)
            thought = self._run(thinker, board, Limits(playouts=go.nodes, until_stopped=True), either, started)
            either.wait()
            if self.stop_event.is_set() or self.ponderhit_time is None:
                return self._answer(thought)
            started = self.ponderhit_time
            go = Go(go.clock, go.nodes)
        limits = (Limits(playouts=go.nodes, until_stopped=True) if go.infinite
                  else self._limits(thinker, go, board.turn, started))
        thought = self._run(thinker, board, limits, self.stop_event, started)
        if go.infinite:
            self.stop_event.wait()  # USI: after `go infinite`, bestmove only once `stop` comes
        return self._answer(thought)

    def _wait_for_release(self, go: Go) -> None:
        if go.infinite:
            self.stop_event.wait()
        elif go.ponder:
            _Either(self.stop_event, self.ponderhit_event).wait()

    def _run(self, thinker: Thinker, board, limits: Limits, stop, started: float) -> Thought:
        def info(thought: Thought) -> None:
            self.say(self._info_line(thought, started))

        thought = thinker.think(board, limits, stop, info)
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
