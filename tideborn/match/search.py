"""PUCT tree search guided by a player's policy and value: `Searcher.think` for one position (the USI engine)
and `Searcher.search_many` for many at once (match's search mode: one forward pass for the leaves of every
game in flight). dlshogi's UctSearch is the reference (docs/match.md, "Search", says where this one differs);
the tree itself is `tideborn.match.tree`.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

import cshogi
import numpy as np

from tideborn.match.players import Player, as_player
from tideborn.match.tree import DISCARDED, Batch, PuctSettings, Tree

DEFAULT_BATCH = 16
"""Leaves per forward pass in `think`: small, so a deadline or a stop is seen soon on a CPU."""
MATCH_BATCH = 256
"""Leaves per forward pass in `search_many`, spread over the trees (virtual loss within each)."""
MAX_LEAVES_PER_TREE = 8
"""Within one tree, leaves per pass: more widens the batch but spends playouts on virtual-loss guesses."""
INFO_SECONDS = 0.5
NODE_LIMIT = 2_000_000
"""Tree nodes after which a search stops (dlshogi's UCT_NodeLimit): a Python node is about a kilobyte."""


@dataclass(frozen=True)
class SearchInfo:
    """The search so far, for USI `info` lines."""

    nodes: int
    """Playouts done (evaluated leaves and positions the rules end), not counting the root's evaluation."""
    depth: int
    """Length of the best line (`pv`)."""
    seldepth: int
    """The deepest playout."""
    value: float
    """The side to move's win probability after the best move."""
    pv: list[int]
    """The best line, cshogi moves."""
    seconds: float


@dataclass(frozen=True)
class SearchResult(SearchInfo):
    move: int = 0
    """A legal move (cshogi's int); 0 only where there is none (the side to move is mated)."""
    decision: str | None = None
    """"resign": no legal move, or the value fell below the searcher's `resign_value`; "win": the side to move
    can declare an entering-king win (USI `bestmove win`); None: play `move`. `move` is legal either way."""


class Searcher:
    """PUCT search with `player`'s policy and value (a `Player`, or a bare network on `device`)."""

    def __init__(self, player: Player, *, c_puct: float = PuctSettings.c_init,
                 c_puct_root: float = PuctSettings.c_init_root, seed: int = 0, temperature: float = 0.0,
                 batch_size: int = DEFAULT_BATCH, resign_value: float | None = None,
                 settings: PuctSettings | None = None, device="cpu", node_limit: int = NODE_LIMIT) -> None:
        self.player = as_player(player, device)
        self.settings = replace(settings or PuctSettings(), c_init=c_puct, c_init_root=c_puct_root)
        self.rng = np.random.default_rng(seed)
        self.temperature = temperature
        """0: the most visited move; T > 0: drawn with probability visits ** (1/T) (dlshogi's random moves)."""
        self.batch_size = max(1, batch_size)
        self.resign_value = resign_value
        self.node_limit = node_limit

    def think(self, board: cshogi.Board, *, playouts: int | None = None, deadline: float | None = None,
              stop: threading.Event | None = None, on_info: Callable[[SearchInfo], None] | None = None,
              plies_to_draw: int | None = None) -> SearchResult:
        """Search `board` (left as it was) until `playouts`, the `deadline` (a `time.monotonic()` value) or
        `stop`, whichever comes first; the root is always evaluated, so a move comes even past the deadline.
        `on_info` gets the figures at most every half second. With none of the three limits, it searches until
        the node limit."""
        start = time.monotonic()
        tree = Tree(board, self.settings, plies_to_draw)
        batch = Batch(self.batch_size)
        if tree.queue_root(batch):
            batch.evaluate_and_backup(self.player, self.settings)
        last_info = start
        while not tree.decided and tree.nodes < self.node_limit:
            if playouts is not None and tree.playouts >= playouts:
                break
            if (stop is not None and stop.is_set()) or (deadline is not None and time.monotonic() >= deadline):
                break
            wanted = self.batch_size if playouts is None else min(self.batch_size, playouts - tree.playouts)
            for _ in range(wanted):
                if tree.select(batch) == DISCARDED or tree.decided:
                    break  # the rest would meet the same waiting leaf
            batch.evaluate_and_backup(self.player, self.settings)
            now = time.monotonic()
            if on_info is not None and now - last_info >= INFO_SECONDS:
                last_info = now
                on_info(_info(tree, now - start))
        return self._result(tree, board, time.monotonic() - start, self.rng)

    def search_many(self, boards: list[cshogi.Board], *, playouts: int, plies_to_draw: list[int | None] | None = None,
                    rngs: list[np.random.Generator] | None = None, batch_size: int = MATCH_BATCH) -> list[SearchResult]:
        """`playouts` for each of `boards`, every forward pass holding leaves of all the trees still searching.
        `rngs`: one per board for the move drawn with a temperature (a game's own, so that it does not depend on
        the games beside it)."""
        start = time.monotonic()
        draws = plies_to_draw or [None] * len(boards)
        trees = [Tree(board, self.settings, plies) for board, plies in zip(boards, draws)]
        batch = Batch(min(batch_size, max(len(trees), 1)))
        for tree in trees:
            tree.queue_root(batch)
        batch.evaluate_and_backup(self.player, self.settings)
        active = [tree for tree in trees if not tree.decided and len(tree.root.moves) > 1]
        while active:
            per_tree = max(1, min(MAX_LEAVES_PER_TREE, batch_size // len(active)))
            for tree in active:
                for _ in range(min(per_tree, playouts - tree.playouts)):
                    if tree.select(batch) == DISCARDED or tree.decided:
                        break
            batch.evaluate_and_backup(self.player, self.settings)
            active = [tree for tree in active if tree.playouts < playouts and not tree.decided
                      and tree.nodes < self.node_limit]
        seconds = time.monotonic() - start
        return [self._result(tree, board, seconds, rng)
                for tree, board, rng in zip(trees, boards, rngs or [self.rng] * len(boards))]

    def _result(self, tree: Tree, board: cshogi.Board, seconds: float, rng: np.random.Generator) -> SearchResult:
        info = _info(tree, seconds)
        if not tree.root.moves:
            return SearchResult(**vars(info), move=0, decision="resign")
        move = tree.best_move()
        if self.temperature > 0 and not tree.root.mate_move:
            move = _drawn(tree, self.temperature, rng)
        decision = None
        if board.is_nyugyoku():
            decision = "win"
        elif self.resign_value is not None and info.value < self.resign_value:
            decision = "resign"
        return SearchResult(**vars(info), move=move, decision=decision)


def _info(tree: Tree, seconds: float) -> SearchInfo:
    pv = tree.pv() if tree.root.moves else []
    return SearchInfo(nodes=tree.playouts, depth=len(pv), seldepth=max(tree.max_depth, len(pv)),
                      value=tree.value(), pv=pv, seconds=seconds)


def _drawn(tree: Tree, temperature: float, rng: np.random.Generator) -> int:
    """A root move drawn with probability visits ** (1 / T) among the visited (the best where none is)."""
    root = tree.root
    visits = root.visits.astype(np.float64)
    if not visits.any():
        return tree.best_move()
    weights = np.where(visits > 0, np.power(np.maximum(visits, 1.0), 1.0 / temperature), 0.0)
    if not math.isfinite(weights.sum()):  # a tiny T: as good as the most visited
        return tree.best_move()
    return root.moves[int(rng.choice(len(weights), p=weights / weights.sum()))]
