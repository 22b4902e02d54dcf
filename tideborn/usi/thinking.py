"""What the USI engine thinks with, behind one small interface (`Thinker.think`), and how long it may think.

`PolicyThinker` plays the net's policy alone (`--playouts 0` or `1`): the legal move with the largest policy
logit, its value as the score; a mate in one (`mate_in_one`: cshogi's `mate_move_in_1ply`, out of check) is
always taken. `SearchThinker` runs the PUCT search of `tideborn.match.search` (`--playouts N` > 1).
`move_budget_ms` is the time rule the engine keeps to (docs/match.md, "In a shogi GUI (USI)"); a thinker's
`warm_up`, run at `isready` on the thread that thinks, measures the latency the rule keeps back.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import cshogi
import numpy as np
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_input_features, make_move_label

from tideborn.match.tree import mate_in_one

EVAL_COEF = 756.0
"""dlshogi's scale between a value logit and centipawns: value = sigmoid(cp / 756), as its engine reports."""
MAX_CP = 30000
"""Scores are clipped here, below what GUIs read as a mate score."""
MOVES_TO_GO = 40
"""The main time is spread as if this many moves were left (a fixed share of what remains: never runs out)."""


def value_to_cp(logit: float) -> int:
    """The side to move's value logit as centipawns on dlshogi's scale."""
    if not math.isfinite(logit):
        return MAX_CP if logit > 0 else -MAX_CP
    return int(max(-MAX_CP, min(MAX_CP, round(EVAL_COEF * logit))))


@dataclass(frozen=True)
class Thought:
    move: int
    """cshogi's move."""
    score_cp: int
    nodes: int
    depth: int
    pv: tuple[int, ...]
    mate: int | None = None
    """Plies to a mate the engine found (1: this move mates), else None."""


@dataclass(frozen=True)
class Limits:
    deadline: float | None = None
    """`time.monotonic()` by which the answer must be ready; None: no clock (nodes, infinite, ponder)."""
    playouts: int | None = None
    """The most playouts (`go nodes`); the Playouts option caps them too, unless `until_stopped`."""
    until_stopped: bool = False
    """`go infinite` and `go ponder`: search until `stop` (or the search's node limit), not the Playouts option."""


class Thinker(Protocol):
    name: str
    latency_ms: float | None
    """What one step of thinking costs (`measure_latency_ms`), kept back from each deadline; None until `warm_up`."""

    def warm_up(self) -> None:
        """Run the net until the backends' lazy set-up is paid, then measure `latency_ms` (once), on the calling
        thread: backends set up per thread, so it must be the thread that will think."""

    def think(self, board: cshogi.Board, limits: Limits, stop: threading.Event,
              on_info: Callable[[Thought], None]) -> Thought:
        """The move to play in `board` (which has a legal move and is not a won declaration), within `limits`
        or until `stop` is set; `on_info` hears progress (a search's best line so far)."""


@dataclass
class PolicyThinker:
    player: object
    """A `tideborn.match.players.Player`."""
    latency_ms: float | None = None
    """One move's measured time (`measure_latency_ms`), kept back from each deadline; None until `warm_up`."""
    name: str = "policy"
    features1: np.ndarray = field(default_factory=lambda: np.zeros((1, FEATURES1_NUM, 9, 9), dtype=np.float32))
    features2: np.ndarray = field(default_factory=lambda: np.zeros((1, FEATURES2_NUM, 9, 9), dtype=np.float32))

    def warm_up(self) -> None:
        if self.latency_ms is None:
            self.latency_ms = measure_latency_ms(self.player)

    def evaluate(self, board: cshogi.Board) -> tuple[np.ndarray, float]:
        make_input_features(board, self.features1[0], self.features2[0])
        policy, value = self.player.evaluate(self.features1, self.features2)
        return policy[0], float(value[0])

    def think(self, board, limits, stop, on_info) -> Thought:
        mate = mate_in_one(board)
        policy, value = self.evaluate(board)
        if mate:
            return Thought(mate, MAX_CP, 1, 1, (mate,), mate=1)
        moves = list(board.legal_moves)
        labels = [make_move_label(move, board.turn) for move in moves]
        best = moves[int(np.argmax(policy[labels]))]
        return Thought(best, value_to_cp(value), 1, 1, (best,))


@dataclass
class SearchThinker:
    """The PUCT search (`tideborn.match.search.Searcher`), playouts bounded by the limits."""
    searcher: object
    playouts: int
    latency_ms: float | None = None
    """One batch of the search's leaves, measured: a search looks at the clock between batches; None until
    `warm_up`."""
    name: str = "search"

    def warm_up(self) -> None:
        if self.latency_ms is None:
            self.latency_ms = measure_latency_ms(self.searcher.player, self.searcher.batch_size)

    def think(self, board, limits, stop, on_info) -> Thought:
        mate = mate_in_one(board)
        if mate:
            return Thought(mate, MAX_CP, 1, 1, (mate,), mate=1)

        def relay(info) -> None:
            if info.pv:
                on_info(_thought_of(info, info.pv[0]))

        if limits.until_stopped:
            playouts = limits.playouts
        else:
            playouts = self.playouts if limits.playouts is None else min(self.playouts, limits.playouts)
        result = self.searcher.think(board.copy(), playouts=playouts, deadline=limits.deadline, stop=stop,
                                     on_info=relay)
        return _thought_of(result, result.move)


def _thought_of(info, move: int) -> Thought:
    """A search's figures (`tideborn.match.search.SearchInfo` or `SearchResult`) as the engine reports them."""
    pv = tuple(info.pv) or (move,)
    return Thought(move, value_to_cp(_as_logit(info.value)), int(info.nodes), max(1, int(info.depth)), pv)


def _as_logit(value: float) -> float:
    """A search's value is a win probability in [0, 1] for the side to move."""
    p = min(max(float(value), 1e-7), 1 - 1e-7)
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class Clock:
    """The time fields of a `go` command, in milliseconds (None where the command has none)."""
    btime: int | None = None
    wtime: int | None = None
    binc: int | None = None
    winc: int | None = None
    byoyomi: int | None = None


def move_budget_ms(clock: Clock, turn: int, margin_ms: float) -> float | None:
    """How long the side to move may think, or None when the command sets no clock.

    The rule: a share of the main time (1/40 of what is left) plus the increment plus the byoyomi, never more than
    all the time left (main + increment + byoyomi), less `margin_ms` (the GUI's and the pipe's delay, and the
    engine's own latency from reading `go` to writing `bestmove`); never below 0, where the engine answers from
    one evaluation at once."""
    left = clock.btime if turn == cshogi.BLACK else clock.wtime
    inc = clock.binc if turn == cshogi.BLACK else clock.winc
    if left is None and inc is None and clock.byoyomi is None:
        return None
    left, inc, byoyomi = max(left or 0, 0), max(inc or 0, 0), max(clock.byoyomi or 0, 0)
    budget = min(left / MOVES_TO_GO + inc + byoyomi, left + inc + byoyomi)
    return max(0.0, budget - margin_ms)


def measure_latency_ms(player, batch: int = 1, repeats: int = 5) -> float:
    """One forward pass of `batch` start positions with their features made (what a move costs the policy, or
    what a search may overrun its deadline by: it looks at the clock between batches), warm, in milliseconds:
    the median of a few, since a shared machine's odd slow run says little about the next. Run it on the thread
    that will think: torch sets up its OpenMP team per thread, and on a busy 2-core machine a 2x32's batch of 16
    took 80-500 ms on the main thread (two torch threads) against 8-10 ms on another."""
    board = cshogi.Board()
    features1 = np.zeros((batch, FEATURES1_NUM, 9, 9), dtype=np.float32)
    features2 = np.zeros((batch, FEATURES2_NUM, 9, 9), dtype=np.float32)
    for size in sorted({1, batch}):  # a search's root is one position, its leaves a batch
        for _ in range(2):  # the first runs pay for allocations and the backends' lazy initialisation
            player.evaluate(features1[:size], features2[:size])
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for row in range(batch):
            make_input_features(board, features1[row], features2[row])
        player.evaluate(features1, features2)
        times.append((time.perf_counter() - started) * 1000)
    return sorted(times)[len(times) // 2]
