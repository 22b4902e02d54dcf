"""The PUCT tree behind `tideborn.match.search`: nodes, selection by dlshogi's formula, expansion with the
rules' terminal positions, and backup. No network here: a selection hands back a leaf whose planes the caller
evaluates (in a batch with other leaves, of this tree or of others), then `expand_evaluated` and `backup`.

Values are win probabilities in [0, 1]. An edge's `wins` is from the point of view of the side to move at the
node the edge leaves (the side that chooses it); a node's `proven` and `terminal` from its own side to move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cshogi
import numpy as np
from cshogi.dlshogi import make_input_features, make_move_label

UNPROVEN, WIN, LOSS = 0, 1, -1
REPETITION_PLIES = 16
"""How far back a repetition is looked for inside the tree (dlshogi's `isDraw(16)`)."""


@dataclass(frozen=True)
class PuctSettings:
    """dlshogi's defaults (its USI options C_init, C_base, C_fpu_reduction, their _root variants, Softmax_Temperature,
    Draw_Value_Black/White), as fractions rather than its per-cent integers."""

    c_init: float = 1.44
    c_base: float = 28288.0
    c_init_root: float = 1.16
    c_base_root: float = 25617.0
    fpu_reduction: float = 0.27
    fpu_reduction_root: float = 0.0
    softmax_temperature: float = 1.74
    draw_value: float = 0.5


class Node:
    """A position in the tree. Its children's statistics live in arrays here (one slot per legal move), the
    child `Node`s only where a selection has gone."""

    __slots__ = ("moves", "labels", "priors", "visits", "wins", "child_proven", "any_proven", "visited_prior",
                 "children", "n", "w",
                 "proven", "terminal", "mate_move", "evaluated")

    def __init__(self) -> None:
        self.moves: list[int] = []
        self.labels: np.ndarray | None = None
        self.priors: np.ndarray | None = None
        self.visits: np.ndarray | None = None
        self.wins: np.ndarray | None = None
        self.child_proven: np.ndarray | None = None
        self.any_proven = False
        """Whether a child is proven: selection looks for proven children only then."""
        self.visited_prior = 0.0
        """The priors of the children visited so far, for the FPU reduction."""
        self.children: list[Node | None] = []
        self.n = 0
        self.w = 0.0
        self.proven = UNPROVEN
        self.terminal: float | None = None
        """The value of a position the rules end (or a proven one), from its side to move."""
        self.mate_move = 0
        self.evaluated = False


@dataclass
class Leaf:
    """A new position to evaluate: its tree and node, the path to it, and its planes' row in the batch."""

    tree: Tree
    node: Node
    path: list[tuple[Node, int]]
    row: int = -1


class Batch:
    """Planes of the leaves waiting for one forward pass, and the leaves themselves."""

    def __init__(self, capacity: int = 64) -> None:
        self.features1 = np.zeros((capacity, cshogi.dlshogi.FEATURES1_NUM, 9, 9), dtype=np.float32)
        self.features2 = np.zeros((capacity, cshogi.dlshogi.FEATURES2_NUM, 9, 9), dtype=np.float32)
        self.leaves: list[Leaf] = []

    def add(self, board: cshogi.Board, leaf: Leaf) -> None:
        row = len(self.leaves)
        if row == len(self.features1):
            self.features1 = np.concatenate([self.features1, np.zeros_like(self.features1)])
            self.features2 = np.concatenate([self.features2, np.zeros_like(self.features2)])
        make_input_features(board, self.features1[row], self.features2[row])  # it clears the planes first
        leaf.row = row
        self.leaves.append(leaf)

    def evaluate(self, player, settings: PuctSettings) -> list[float]:
        """One forward pass for every leaf; sets each node's priors and returns each leaf's value (its side to
        move's win probability)."""
        count = len(self.leaves)
        policy, value = player.evaluate(self.features1[:count], self.features2[:count])
        values = []
        for leaf in self.leaves:
            expand_evaluated(leaf.node, policy[leaf.row], settings.softmax_temperature)
            values.append(_sigmoid(float(value[leaf.row])))
        return values

    def evaluate_and_backup(self, player, settings: PuctSettings) -> None:
        """Evaluate every leaf and back its value up its tree; the batch is then empty."""
        if self.leaves:
            for leaf, value in zip(self.leaves, self.evaluate(player, settings)):
                leaf.tree.backup(leaf, value)
        self.leaves = []


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def expand_evaluated(node: Node, logits: np.ndarray, temperature: float) -> None:
    """Priors: the softmax of the legal moves' logits / T (dlshogi's `softmax_temperature_with_normalize`)."""
    legal = logits[node.labels].astype(np.float64) / temperature
    legal = np.exp(legal - legal.max())
    node.priors = legal / legal.sum()
    node.evaluated = True


def new_node(board: cshogi.Board, plies_left: int | None, draw_value: float) -> Node:
    """The node of `board`'s position: terminal where the rules end the game there (in the order match's judge
    applies them), proven where its side to move mates in one, else waiting for its evaluation. A draw is worth
    `draw_value` to the side that moved into it."""
    node = Node()
    if board.is_game_over():  # no legal move: mated
        node.terminal, node.proven = 0.0, LOSS
        return node
    repetition = board.is_draw(REPETITION_PLIES)
    if repetition == cshogi.REPETITION_DRAW:
        node.terminal = 1.0 - draw_value
        return node
    if repetition in (cshogi.REPETITION_WIN, cshogi.REPETITION_LOSE):  # perpetual check: the checker loses
        won = repetition == cshogi.REPETITION_WIN
        node.terminal, node.proven = (1.0, WIN) if won else (0.0, LOSS)
        return node
    if board.is_nyugyoku():
        node.terminal, node.proven = 1.0, WIN
        return node
    if plies_left is not None and plies_left <= 0:
        node.terminal = 1.0 - draw_value
        return node
    mate = mate_in_one(board)
    if mate:
        node.terminal, node.proven, node.mate_move = 1.0, WIN, mate
        return node
    return _with_moves(node, board, list(board.legal_moves))


def _with_moves(node: Node, board: cshogi.Board, moves: list[int]) -> Node:
    """The node's slots for its legal moves, their policy labels for its evaluation."""
    turn, size = board.turn, len(moves)
    node.moves = moves
    node.labels = np.fromiter((make_move_label(move, turn) for move in moves), dtype=np.int64, count=size)
    node.visits = np.zeros(size, dtype=np.int64)
    node.wins = np.zeros(size, dtype=np.float64)
    node.child_proven = np.zeros(size, dtype=np.int8)
    node.children = [None] * size
    return node


def select_child(node: Node, root: bool, settings: PuctSettings) -> int:
    """dlshogi's `SelectMaxUcbChild`: q + c(N) * u * prior, a proven win taken at once, proven losses skipped.
    Marks `node` proven when its children decide it."""
    if node.any_proven:
        proven = node.child_proven
        winning = np.flatnonzero(proven == LOSS)  # the child's side to move loses: we win
        if winning.size:
            node.proven = WIN
            return int(winning[np.argmax(node.priors[winning])])
        losing = proven == WIN
        if losing.all():
            node.proven = LOSS
            return best_child(node)
    if root:
        c_init, c_base, fpu_reduction = settings.c_init_root, settings.c_base_root, settings.fpu_reduction_root
    else:
        c_init, c_base, fpu_reduction = settings.c_init, settings.c_base, settings.fpu_reduction
    total = node.n
    sqrt_total = math.sqrt(total)
    c = math.log((total + c_base + 1.0) / c_base) + c_init
    if total == 0 and not node.any_proven:  # every child unvisited: the same q and u for all
        return int(np.argmax(node.priors))
    visits = node.visits
    visited = visits > 0
    # FPU: the parent's mean less a reduction growing with the policy mass already visited (as lc0; dlshogi
    # adds the chosen child's prior on every selection, a sum that outgrows 1)
    reduction = fpu_reduction * math.sqrt(max(node.visited_prior, 0.0))  # a sum that went up and down may be -1e-17
    parent_q = max(0.0, node.w / total - reduction) if node.w > 0 else 0.0
    q = np.where(visited, node.wins / np.maximum(visits, 1), parent_q)
    u = np.where(visited, sqrt_total / (1.0 + visits), sqrt_total)
    ucb = q + c * u * node.priors
    if node.any_proven:
        ucb[node.child_proven == WIN] = -np.inf
    return int(np.argmax(ucb))


def set_child_proven(node: Node, index: int, proven: int) -> None:
    if proven != UNPROVEN:
        node.child_proven[index] = proven
        node.any_proven = True


def best_child(node: Node) -> int:
    """The move to play: a proven win first; else the most visited (ties to the larger prior), proven losses
    last (dlshogi's `compare_child_node_ptr_descending`)."""
    proven = node.child_proven
    winning = np.flatnonzero(proven == LOSS)
    if winning.size:
        return int(winning[np.argmax(node.priors[winning])])
    key = node.visits * 2.0 + node.priors  # priors < 1: they only break ties in visits
    key = np.where(proven == WIN, key - 1e12, key)
    return int(np.argmax(key))


def edge_value(node: Node, index: int) -> float:
    """The chooser's win probability after the move at `index`."""
    proven = node.child_proven[index]
    if proven == LOSS:
        return 1.0
    if proven == WIN:
        return 0.0
    visits = node.visits[index]
    if visits == 0:
        return float("nan")
    return float(node.wins[index] / visits)


QUEUED, DONE, DISCARDED = "queued", "done", "discarded"
"""What a selection did: a new leaf waits in the batch; a position the rules end was backed up at once; the
path met a leaf still waiting for its evaluation and was undone (dlshogi's DISCARDED)."""


class Tree:
    """The search from one position. `board` is copied (with its history, for repetitions before the root);
    `plies_to_draw`: plies after which the game is a draw (match's max moves), None for none."""

    def __init__(self, board: cshogi.Board, settings: PuctSettings, plies_to_draw: int | None = None) -> None:
        self.board = board.copy()
        self.settings = settings
        self.plies_to_draw = plies_to_draw
        self.root = _root_node(self.board)
        self.root_value = 0.5
        self.playouts = 0
        self.nodes = 1
        self.max_depth = 0

    def queue_root(self, batch: Batch) -> bool:
        """Queue the root's evaluation (its priors); False when it has no legal move to search."""
        if not self.root.moves:
            return False
        batch.add(self.board, Leaf(self, self.root, []))
        return True

    @property
    def decided(self) -> bool:
        """Nothing left to search: a mate in one at the root, or every move proven."""
        return self.root.proven != UNPROVEN or not self.root.moves

    def select(self, batch: Batch) -> str:
        """One descent by PUCT from the root, with a virtual loss on its path until its value is backed up."""
        board, settings = self.board, self.settings
        node, path = self.root, []
        try:
            while True:
                index = select_child(node, not path, settings)
                if node.proven != UNPROVEN:
                    node.terminal = 1.0 if node.proven == WIN else 0.0
                    if path:
                        parent, parent_index = path[-1]
                        set_child_proven(parent, parent_index, node.proven)
                node.n += 1
                if node.visits[index] == 0:
                    node.visited_prior += node.priors[index]
                node.visits[index] += 1
                path.append((node, index))
                board.push(node.moves[index])
                child = node.children[index]
                if child is None:
                    plies_left = None if self.plies_to_draw is None else self.plies_to_draw - len(path)
                    child = node.children[index] = new_node(board, plies_left, settings.draw_value)
                    self.nodes += 1
                    set_child_proven(node, index, child.proven)
                    if child.terminal is None:
                        self.max_depth = max(self.max_depth, len(path))
                        batch.add(board, Leaf(self, child, path))
                        return QUEUED
                if child.terminal is not None:
                    self._backup(path, child.terminal)
                    return DONE
                if not child.evaluated:
                    for parent, parent_index in path:
                        parent.n -= 1
                        parent.visits[parent_index] -= 1
                        if parent.visits[parent_index] == 0:
                            parent.visited_prior -= parent.priors[parent_index]
                    return DISCARDED
                node = child
        finally:
            for _ in path:
                board.pop()

    def backup(self, leaf: Leaf, value: float) -> None:
        if not leaf.path:
            self.root_value = value
            return
        self._backup(leaf.path, value)

    def _backup(self, path: list[tuple[Node, int]], value: float) -> None:
        """`value` is the leaf's, for its side to move; each edge gets it from its chooser's side."""
        result = 1.0 - value
        for node, index in reversed(path):
            node.wins[index] += result
            node.w += result
            result = 1.0 - result
        self.playouts += 1
        self.max_depth = max(self.max_depth, len(path))

    def best_index(self) -> int:
        return best_child(self.root)

    def best_move(self) -> int:
        if self.root.mate_move:
            return self.root.mate_move
        return self.root.moves[self.best_index()]

    def value(self) -> float:
        """The root's side to move's win probability after the best move (the net's value before any playout)."""
        if self.root.proven != UNPROVEN and self.root.mate_move:
            return 1.0
        if not self.root.moves:
            return 0.0
        value = edge_value(self.root, self.best_index())
        return self.root_value if math.isnan(value) else value

    def pv(self) -> list[int]:
        """The best line: the best move, then the most visited reply, and so on while the tree goes."""
        node, moves = self.root, []
        while True:
            if node.mate_move:
                moves.append(node.mate_move)
                break
            if not node.moves or not node.evaluated or (not node.visits.any() and node is not self.root):
                break
            index = best_child(node)
            moves.append(node.moves[index])
            node = node.children[index]
            if node is None:
                break
        return moves


def _root_node(board: cshogi.Board) -> Node:
    """The root is the game's position as it stands (match has judged it): only its moves matter, and a mate in
    one from it, found before any playout."""
    node = Node()
    moves = list(board.legal_moves)
    if not moves:
        node.terminal, node.proven = 0.0, LOSS
        return node
    node.mate_move = mate_in_one(board)
    if node.mate_move:
        node.proven = WIN
    return _with_moves(node, board, moves)


def mate_in_one(board: cshogi.Board) -> int:
    """A move that mates at once, or 0. cshogi's one-ply mate search is for positions not in check: in check it
    can answer a move that mates but leaves the mover's own king in check (an illegal move, seen in play: a gold
    dropped next to the other king while a promoted knight checked one's own)."""
    return 0 if board.is_check() else board.mate_move_in_1ply()
