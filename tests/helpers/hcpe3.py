"""Writes hcpe3 files (dlshogi's self-play format) from real games, with made-up but consistent search data.

Each move of each game gets a MoveInfo (the move played as selectedMove16, an eval for the side to move)
and, except for the first `book_plies` moves (candidateNum 0, as an opening book writes), a few legal
candidates with visit counts, the move played among them. The visit counts are drawn from a seeded RNG, so
a file is the same every time; `expected` records what was written, for read-back checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import cshogi
import numpy as np

from tideborn.data.cache.hcpe3 import HEADER_DTYPE, MOVE_INFO_DTYPE, MOVE_VISITS_DTYPE
from tideborn.data.formats.games import find_game_files, read_games

REPO = Path(__file__).resolve().parents[2]
SAMPLE_GAMES = REPO / "samples" / "games"


@dataclass
class WrittenGame:
    start_hcp: np.ndarray
    result: int
    moves: list[int]
    """cshogi moves of the game."""
    infos: np.ndarray
    candidates: list[np.ndarray]
    positions: list[np.ndarray] = field(default_factory=list)
    """The hcp before each move (replayed while writing)."""


def sample_games(limit: int | None = None) -> list:
    """Real games (samples/games, WCSC28) that have a result and start from the standard position."""
    games = [g for path in find_game_files([SAMPLE_GAMES]) for g in read_games(path)
             if g.result is not None and g.moves]
    return games[:limit] if limit else games


def made_up_search(board: cshogi.Board, move: int, rng: np.random.Generator, width: int = 6) -> np.ndarray:
    """A few legal candidates with visit counts, the move played among them (usually the most visited)."""
    legal = [m for m in board.legal_moves if m != move]
    others = rng.choice(len(legal), size=min(width - 1, len(legal)), replace=False) if legal else []
    moves = [move] + [legal[i] for i in others]
    visits = rng.integers(1, 200, size=len(moves))
    visits[0] = visits.max() + rng.integers(0, 300)
    out = np.empty(len(moves), MOVE_VISITS_DTYPE)
    out["move16"] = [cshogi.move16(m) for m in moves]
    out["visitNum"] = visits
    order = rng.permutation(len(moves))  # the played move is not always first
    return out[order]


def stm_result(result: int, ply: int) -> int:
    """+1, -1 or 0: the game's result (cshogi DRAW 0, BLACK_WIN 1, WHITE_WIN 2) for the side to move at `ply`
    of a game from the standard position (black moves at even plies)."""
    winner = result & 3
    if winner not in (1, 2):
        return 0
    return 1 if (winner == 1) == (ply % 2 == 0) else -1


def write_hcpe3(path: Path, games: list, seed: int = 0, book_plies: int = 2, max_moves: int | None = None,
                result_flags: int = 0, eval_unit: float | None = None) -> list[WrittenGame]:
    """Write `games` (tideborn.data.formats.games.Game) as hcpe3 to `path`; returns what was written.

    Evals are uniform noise unless `eval_unit` is given: then each is the side to move's result (+1 win,
    -1 loss, 0 draw) times `eval_unit` plus noise of the same size, so the evals predict the results and
    dlshogi's evalfix finds a scale that grows with `eval_unit`."""
    rng = np.random.default_rng(seed)
    board = cshogi.Board()
    written: list[WrittenGame] = []
    with open(path, "wb") as handle:
        for game in games:
            moves = game.moves[:max_moves] if max_moves else game.moves
            board.set_sfen(game.sfen)
            header = np.zeros(1, HEADER_DTYPE)
            board.to_hcp(header["hcp"][0])
            result = int(game.result) | (0x4 if getattr(game, "endgame", "") == "%SENNICHITE" else 0) | result_flags
            header["moveNum"], header["result"], header["opponent"] = len(moves), result, 0
            infos = np.zeros(len(moves), MOVE_INFO_DTYPE)
            record = WrittenGame(header["hcp"][0].copy(), result, list(moves), infos, [])
            for ply, move in enumerate(moves):
                hcp = np.empty(32, np.uint8)
                board.to_hcp(hcp)
                record.positions.append(hcp)
                infos[ply]["selectedMove16"] = cshogi.move16(move)
                infos[ply]["eval"] = (int(rng.integers(-2000, 2000)) if eval_unit is None
                                      else int(eval_unit * (stm_result(result, ply) + rng.normal())))
                candidates = np.empty(0, MOVE_VISITS_DTYPE) if ply < book_plies else made_up_search(board, move, rng)
                infos[ply]["candidateNum"] = len(candidates)
                record.candidates.append(candidates)
                board.push(move)
            handle.write(header.tobytes())
            for info, candidates in zip(infos, record.candidates):
                handle.write(info.tobytes())
                handle.write(candidates.tobytes())
            written.append(record)
    return written


def records_of_positions(positions: dict, psv_results: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """A positions cache's arrays (`build_positions(...)["arrays"]`) as hcpe and psv records, one per position:
    the move played, the eval, and the game result (for psv from the side to move's view; 0, a draw, with
    `psv_results=False`)."""
    hcpe = np.zeros(len(positions["hcp"]), dtype=cshogi.HuffmanCodedPosAndEval)
    hcpe["hcp"], hcpe["eval"] = positions["hcp"], positions["eval"]
    hcpe["bestMove16"] = positions["move16"].view(np.int16)
    hcpe["gameResult"] = (positions["result"] & 3).view(np.int8)
    psv = np.zeros(len(hcpe), dtype=cshogi.PackedSfenValue)
    board = cshogi.Board()
    for i, record in enumerate(hcpe):
        board.set_hcp(record["hcp"])
        board.to_psfen(psv["sfen"][i])
        psv["move"][i] = cshogi.move16_to_psv(int(positions["move16"][i]))
        psv["score"][i] = record["eval"]
        winner = int(record["gameResult"])
        if psv_results and winner != cshogi.DRAW:
            psv["game_result"][i] = 1 if (winner == 1) == (board.turn == 0) else -1
    return hcpe, psv


def corrupt(path: Path, games: list, how: str) -> int:
    """Write 4 games to `path` and damage game 2 (returns its byte offset)."""
    written = write_hcpe3(path, games[:4], seed=30)
    data = bytearray(path.read_bytes())
    offset = 0
    for game in written[:2]:
        offset += 36 + sum(6 + 4 * len(c) for c in game.candidates)
    if how == "truncated":
        data = data[:offset + 36 + 6 * 2 + 3]  # within move 2's MoveInfo (moves 0 and 1 are book moves)
    elif how == "illegal":
        first_move = offset + 36 + 6 * 1 + 4 * len(written[2].candidates[0])  # move 1's MoveInfo
        data[first_move:first_move + 2] = (0x7F7F).to_bytes(2, "little")
    elif how == "movenum":  # game 1 claims one move more than it has: game 2's header is read as a move
        first = 36 + sum(6 + 4 * len(c) for c in written[0].candidates)
        data[first + 32:first + 34] = (len(written[1].moves) + 1).to_bytes(2, "little")
    elif how == "candidates":  # the last MoveInfo of the last game claims more candidates than remain
        field = len(data) - 4 * len(written[3].candidates[-1]) - 2
        data[field:field + 2] = (500).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    return offset
