"""Many games at once between two players, each move chosen by the side to move's policy, its value after
each legal move (value mode) or a PUCT search (search mode, `tideborn.match.search`).

All unfinished games advance together: the boards whose side to move belongs to player A are encoded
into one batch (`cshogi.dlshogi.make_input_features`) and go through A in one forward pass (a checkpoint's
network in PyTorch or an ONNX model in onnxruntime: `tideborn.match.players`), the rest through B. A move
is the legal move with the largest policy logit (`make_move_label` picks each legal move's logit), or, with
a temperature T > 0, drawn from the softmax of the legal logits / T with a random generator seeded per game,
so a game does not depend on which others share its batch.

A side may also be an external USI engine (`tideborn.match.external`): it is asked for each move of its games
one at a time, and an answer that is no move (a crash, a timeout, a resignation, an illegal move) loses the
game for it (`Forfeit`).

A game ends by the rules cshogi implements (docs/match.md): no legal move (mate; a pawn-drop mate is not
among cshogi's legal moves), the same position (board, hands, side to move) a fourth time (a draw, or a
loss for the side that gave check on every move of the cycle: `Board.is_draw`), an entering-king
declaration the side to move can make (`Board.is_nyugyoku`, 27-point rule), or `max_moves` plies played
from the opening (a draw).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import cshogi
import numpy as np
import torch
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_input_features, make_move_label

from tideborn.match.players import Player, as_player
from tideborn.match.search import Searcher

BLACK_WINS, WHITE_WINS, DRAW = "black", "white", "draw"
REPETITIONS_TO_END = 4
"""Sennichite: the same position for the fourth time ends the game."""


@dataclass
class Game:
    index: int
    opening: int
    sfen: str
    black: int
    """0 when the first network plays black (moves first from a `b` opening's side), 1 for the second."""
    moves: list[int] = field(default_factory=list)
    result: str | None = None
    reason: str | None = None
    board: cshogi.Board | None = None
    seen: Counter = field(default_factory=Counter)
    rng: np.random.Generator | None = None
    detail: str | None = None
    """What happened, where the reason alone does not say (an external engine's crash, timeout, illegal move)."""

    def score_of_first(self) -> float:
        """The first network's points: 1 win, 0.5 draw, 0 loss."""
        if self.result == DRAW:
            return 0.5
        winner_is_black = self.result == BLACK_WINS
        return 1.0 if winner_is_black == (self.black == 0) else 0.0

    def player_to_move(self) -> int:
        assert self.board is not None
        return self.black if self.board.turn == cshogi.BLACK else 1 - self.black


@dataclass(frozen=True)
class Forfeit:
    """An external engine's answer that loses the game for its side (`tideborn.match.external`): `reason` is
    the game's end (`engine crashed`, `engine timed out`, `resign`, `illegal move`, `false win declaration`)."""
    reason: str
    detail: str


def _side_wins(color: int) -> str:
    return BLACK_WINS if color == cshogi.BLACK else WHITE_WINS


def _finish(game: Game, result: str, reason: str) -> None:
    game.result, game.reason = result, reason
    game.board = None  # a finished game keeps only its moves; its Board can go
    game.seen = Counter()


def _judge(game: Game, max_moves: int) -> None:
    """End `game` if the position after its last move ends it (the side to move is `board.turn`)."""
    board = game.board
    to_move = board.turn
    if board.is_game_over():
        _finish(game, _side_wins(1 - to_move), "mate")
        return
    key = board.zobrist_hash()
    game.seen[key] += 1
    if game.seen[key] >= REPETITIONS_TO_END:
        state = board.is_draw()
        if state == cshogi.REPETITION_WIN:  # the opponent checked on every move of the cycle
            _finish(game, _side_wins(to_move), "perpetual check")
        elif state == cshogi.REPETITION_LOSE:
            _finish(game, _side_wins(1 - to_move), "perpetual check")
        else:
            _finish(game, DRAW, "repetition")
        return
    if board.is_nyugyoku():
        _finish(game, _side_wins(to_move), "entering king")
        return
    if len(game.moves) >= max_moves:
        _finish(game, DRAW, "max moves")


def _pick(moves: list[int], scores: np.ndarray, game: Game, temperature: float) -> int:
    """The best-scored move, or with a temperature one drawn from softmax(scores / T)."""
    if temperature <= 0:
        return moves[int(np.argmax(scores))]
    z = (scores - scores.max()) / temperature
    p = np.exp(z)
    return moves[int(game.rng.choice(len(moves), p=p / p.sum()))]


def _choose(logits: np.ndarray, game: Game, temperature: float) -> int:
    board = game.board
    moves = list(board.legal_moves)
    labels = np.fromiter((make_move_label(move, board.turn) for move in moves), dtype=np.int64, count=len(moves))
    return _pick(moves, logits[labels].astype(np.float64), game, temperature)


VALUE_CHUNK = 2048
"""Positions per forward pass in value mode (every legal move of every game in the group)."""


def _value_moves(player, group: list[Game], temperature: float, device) -> list[int]:
    """Value mode (a 1-ply search): every legal move is played, the position after it goes through the
    value head, and the move that leaves the opponent the lowest value logit is chosen (with a
    temperature: drawn from softmax(-value / T)). A move that mates at once is always taken."""
    rows: list[tuple[int, int]] = []  # (game row, move) per child position
    mates: dict[int, int] = {}
    per_game: list[list[int]] = []
    children: list[tuple[np.ndarray, np.ndarray]] = []
    f1 = np.zeros((FEATURES1_NUM, 9, 9), dtype=np.float32)
    f2 = np.zeros((FEATURES2_NUM, 9, 9), dtype=np.float32)
    for row, game in enumerate(group):
        board = game.board
        moves = list(board.legal_moves)
        per_game.append(moves)
        for move in moves:
            board.push(move)
            if row not in mates and board.is_game_over():
                mates[row] = move
            make_input_features(board, f1, f2)  # it clears the planes first
            board.pop()
            children.append((f1.copy(), f2.copy()))
            rows.append((row, move))
    player = as_player(player, device)
    values = np.empty(len(children), dtype=np.float64)
    for start in range(0, len(children), VALUE_CHUNK):
        part = children[start:start + VALUE_CHUNK]
        x1, x2 = np.stack([c[0] for c in part]), np.stack([c[1] for c in part])
        values[start:start + len(part)] = player.evaluate(x1, x2)[1]
    chosen, offset = [], 0
    for row, game in enumerate(group):
        moves = per_game[row]
        scores = -values[offset:offset + len(moves)]  # the opponent's value, from the mover's side
        offset += len(moves)
        chosen.append(mates[row] if row in mates else _pick(moves, scores, game, temperature))
    return chosen


def new_games(openings: list[str], pairs: int, seed: int) -> list[Game]:
    """`pairs` openings (cycling through `openings`), each played twice with the colours swapped."""
    games = []
    for pair in range(pairs):
        opening = pair % len(openings)
        for black in (0, 1):
            index = len(games)
            games.append(Game(index=index, opening=opening, sfen=openings[opening], black=black,
                              rng=np.random.default_rng([seed, index])))
    return games


def _search_moves(searcher, group: list[Game], playouts: int, max_moves: int) -> list[int]:
    """Search mode: a PUCT search of `playouts` from every game of the group, all the trees' leaves in each
    forward pass (`tideborn.match.search`); with a temperature, the move is drawn from the visits by the game's
    own generator."""
    results = searcher.search_many([game.board for game in group], playouts=playouts,
                                   plies_to_draw=[max_moves - len(game.moves) for game in group],
                                   rngs=[game.rng for game in group])
    return [result.move for result in results]


MODES = ("policy", "value", "search")


@torch.inference_mode()
def play(nets: tuple[Player | torch.nn.Module, Player | torch.nn.Module], games: list[Game], *,
         parallel: int = 100, max_moves: int = 320, temperature: float = 0.0, device: torch.device | str = "cpu",
         on_finished: Callable[[Game], None] | None = None, mode: str | tuple[str, str] = "policy",
         playouts: int = 64) -> float:
    """Play `games` to the end, at most `parallel` at a time; returns the seconds it took. `nets` are players
    (`tideborn.match.players`: a checkpoint's network or an ONNX model) or bare networks on `device`. `mode`
    is both sides' (policy, value or search with `playouts` per move), or a pair: each side's own."""
    start = time.monotonic()
    players = tuple(as_player(net, device) for net in nets)
    modes = (mode, mode) if isinstance(mode, str) else tuple(mode)
    unknown = [side_mode for side_mode in modes if side_mode not in MODES]
    if unknown:
        raise ValueError(f"mode {unknown[0]!r}: one of {', '.join(MODES)}")
    searchers = tuple(Searcher(player, temperature=temperature) if side_mode == "search" else None
                      for player, side_mode in zip(players, modes))
    queue = list(reversed(games))
    active: list[Game] = []
    capacity = max(1, min(parallel, len(games)))  # no buffer larger than the games need
    features1 = np.zeros((capacity, FEATURES1_NUM, 9, 9), dtype=np.float32)
    features2 = np.zeros((capacity, FEATURES2_NUM, 9, 9), dtype=np.float32)
    while queue or active:
        while queue and len(active) < capacity:
            game = queue.pop()
            game.board = cshogi.Board(game.sfen)
            game.seen[game.board.zobrist_hash()] += 1
            active.append(game)
        for player in (0, 1):
            group = [game for game in active if game.result is None and game.player_to_move() == player]
            if not group:
                continue
            if getattr(players[player], "external", False):
                moves = [players[player].choose(game) for game in group]  # one process: a move at a time
            elif modes[player] == "value":
                moves = _value_moves(players[player], group, temperature, device)
            elif modes[player] == "search":
                moves = _search_moves(searchers[player], group, playouts, max_moves)
            else:
                for row, game in enumerate(group):
                    make_input_features(game.board, features1[row], features2[row])
                logits = players[player].evaluate(features1[:len(group)], features2[:len(group)])[0]
                moves = [_choose(logits[row], game, temperature) for row, game in enumerate(group)]
            for row, game in enumerate(group):
                move = moves[row]
                if isinstance(move, Forfeit):
                    game.detail = move.detail
                    _finish(game, _side_wins(1 - game.board.turn), move.reason)
                    continue
                game.board.push(move)
                game.moves.append(move)
                _judge(game, max_moves)
        still = []
        for game in active:
            if game.result is None:
                still.append(game)
            elif on_finished is not None:
                on_finished(game)
        active = still
    return time.monotonic() - start
