"""hcpe3 files for the benchmark and the cross-check: real games replayed with made-up search statistics.

dlshogi's hcpe3 is what its self-play writes: per game a 36-byte header (start position as a 32-byte
HuffmanCodedPos, moveNum u16, result u8, opponent u8), then per move a MoveInfo (selectedMove16 u16,
eval s16, candidateNum u16) and candidateNum MoveVisits (move16 u16, visitNum u16).

dlshogi's own converter (`dlshogi/utils/csa_to_hcpe3.py`) needs floodgate records: `'**` evaluation
comments on every move and player ratings, and it writes one candidate per move (the move played, one
visit). The games at hand lack ratings and mostly evaluations, and one candidate would leave the
distributions untested, so this writer replays real games (legal moves, real results) and invents the
rest, seeded: several legal candidates per move with visit counts (the move played gets the most), the
first `book_plies` moves without candidates (as self-play writes its opening moves), an evaluation where
the record has none.
"""

from __future__ import annotations

import random
import typing
from dataclasses import dataclass
from pathlib import Path

import cshogi
import numpy as np

from tideborn.data.decode.features import sane_kings
from tideborn.data.formats.games import GameReadError, find_game_files, read_games
from tideborn.errors import UserError
from tideborn.outputs import StagedOutputs

HCPE3_HEADER = np.dtype([("hcp", np.uint8, 32), ("moveNum", "<u2"), ("result", "u1"), ("opponent", "u1")])
MOVE_INFO = np.dtype([("selectedMove16", "<u2"), ("eval", "<i2"), ("candidateNum", "<u2")])
MOVE_VISITS = np.dtype([("move16", "<u2"), ("visitNum", "<u2")])
assert (HCPE3_HEADER.itemsize, MOVE_INFO.itemsize, MOVE_VISITS.itemsize) == (36, 6, 4)

GAMERESULT_SENNICHITE, GAMERESULT_NYUGYOKU, GAMERESULT_MAXMOVE = 4, 8, 16
"""dlshogi's result flags above the two winner bits (`cppshogi.h`)."""
_ENDGAME_FLAGS = {"%SENNICHITE": GAMERESULT_SENNICHITE, "%KACHI": GAMERESULT_NYUGYOKU,
                  "%JISHOGI": GAMERESULT_MAXMOVE, "%MAX_MOVES": GAMERESULT_MAXMOVE}


@dataclass
class Hcpe3Summary:
    games: int = 0
    moves: int = 0
    """MoveInfo entries written."""
    with_candidates: int = 0
    """Moves with at least one candidate: the positions a reader can train on (before any filter of its own)."""
    bytes: int = 0


def game_bytes(sfen: str, moves: list[int], result: int, scores: list[int] | None, rng: random.Random,
               board: cshogi.Board, max_candidates: int = 8, book_plies: int = 8) -> tuple[bytes, int]:
    """One game as hcpe3 bytes and its number of moves with candidates. `result` is cshogi's
    BLACK_WIN/WHITE_WIN/DRAW with dlshogi's flags added; `scores` from black's view (None: made up)."""
    board.set_sfen(sfen)
    header = np.zeros(1, HCPE3_HEADER)
    board.to_hcp(header["hcp"][0])
    header["moveNum"], header["result"] = len(moves), result
    parts = [header.tobytes()]
    with_candidates = 0
    made_up_eval = rng.randint(-300, 300)
    for ply, move in enumerate(moves):
        if not board.is_legal(move):
            raise ValueError(f"illegal move at ply {ply + 1}")
        if scores is not None:
            black_eval = scores[ply]
        else:
            made_up_eval = max(-3000, min(3000, made_up_eval + rng.randint(-150, 150)))
            black_eval = made_up_eval
        info = np.zeros(1, MOVE_INFO)
        info["selectedMove16"] = cshogi.move16(move)
        info["eval"] = max(-32767, min(32767, black_eval if board.turn == cshogi.BLACK else -black_eval))
        if ply < book_plies:
            parts.append(info.tobytes())
        else:
            others = [m for m in board.legal_moves if m != move]
            extra = rng.sample(others, min(len(others), rng.randint(0, max_candidates - 1)))
            visits = np.zeros(1 + len(extra), MOVE_VISITS)
            visits["move16"] = [cshogi.move16(m) for m in [move, *extra]]
            top = rng.randint(20, 800)
            visits["visitNum"] = [top] + [rng.randint(1, top) for _ in extra]
            info["candidateNum"] = len(visits)
            parts += [info.tobytes(), visits.tobytes()]
            with_candidates += 1
        board.push(move)
    return b"".join(parts), with_candidates


def write_hcpe3_from_games(inputs: list[Path], output: Path, copies: int = 1, seed: int = 0,
                           max_candidates: int = 8, book_plies: int = 8,
                           warn: typing.Callable[[str], None] | None = None) -> Hcpe3Summary:
    """Write the games under `inputs` (CSA, KIF, KI2) to `output` as hcpe3, `copies` times over (each copy
    with other made-up statistics, for a larger file). Games without a result are left out, and so are
    handicap games: a HuffmanCodedPos holds all 40 pieces, and dlshogi's reader refuses a start position
    without them (it aborts the process: `incorrect Huffman code`)."""
    games = []
    for path in find_game_files(inputs):
        try:
            games.extend(g for g in read_games(path) if g.result is not None and g.moves and not g.handicap)
        except GameReadError as exc:
            if warn:
                warn(f"{path}: {exc}")
    if not games:
        raise UserError(f"no readable game with a result from the standard position under "
                        f"{', '.join(map(str, inputs))}; nothing written to {output}")
    rng, board, summary = random.Random(seed), cshogi.Board(), Hcpe3Summary()

    def fill(out: typing.BinaryIO) -> None:
        for _ in range(copies):
            for game in games:
                result = int(game.result) | _ENDGAME_FLAGS.get(game.endgame, 0)  # type: ignore[arg-type]
                try:
                    data, positions = game_bytes(game.sfen, game.moves, result, game.scores, rng, board,
                                                 max_candidates, book_plies)
                except ValueError as exc:
                    if warn:
                        warn(f"{game.source}: {exc}")
                    continue
                out.write(data)
                summary.games += 1
                summary.moves += len(game.moves)
                summary.with_candidates += positions
                summary.bytes += len(data)

    # whole or not at all: a temp file beside `output`, renamed over it once written
    with StagedOutputs() as staged:
        staged.prepare(output, "output")
        staged.write(output, fill)
        staged.publish()
    return summary


def walk_hcpe3(path: Path) -> typing.Iterator[tuple[int, int, int, bytes, np.ndarray, np.ndarray]]:
    """(game, ply, result, start hcp, MoveInfo, MoveVisits[]) for every move of `path`, in file order: an
    independent plain reading of the layout, for the cross-check to name games and plies."""
    data = path.read_bytes()
    offset, game = 0, 0

    def take(dtype: np.dtype, count: int, what: str) -> np.ndarray:
        if offset + count * dtype.itemsize > len(data):
            raise UserError(f"{path}: game {game}: the file ends inside {what} (byte {len(data)})")
        return np.frombuffer(data, dtype, count, offset)

    while offset < len(data):
        header = take(HCPE3_HEADER, 1, "a game header")[0]
        offset += HCPE3_HEADER.itemsize
        for ply in range(int(header["moveNum"])):
            info = take(MOVE_INFO, 1, f"move {ply}")[0]
            offset += MOVE_INFO.itemsize
            count = int(info["candidateNum"])
            visits = take(MOVE_VISITS, count, f"move {ply}'s candidates")
            offset += count * MOVE_VISITS.itemsize
            yield game, ply, int(header["result"]), header["hcp"].tobytes(), info, visits
        game += 1


@dataclass
class ReferenceMove:
    """One move of an hcpe3 file, replayed with cshogi: the position before it and what it trains."""

    game: int
    ply: int
    hcp: bytes
    move16: int
    candidates: np.ndarray
    """MoveVisits as stored."""
    policy: dict[int, float]
    """move16 -> probability (dlshogi's temperature 1: one candidate is one-hot, else visits over their
    sum; a repeated move16 keeps its last value, as dlshogi's map does)."""
    eval: int
    """As written: the side to move's."""
    result_byte: int
    result: float
    """1 win, 0.5 draw, 0 loss for the side to move."""
    repetition: str | None
    """Why dlshogi leaves the position out as a repetition, or None."""

    @property
    def dlshogi_keeps(self) -> bool:
        """`load_hcpe3` trains on the position: it has candidates and its move makes no repetition."""
        return len(self.candidates) > 0 and self.repetition is None


_REPETITIONS = {cshogi.REPETITION_DRAW: "repetition draw", cshogi.REPETITION_SUPERIOR: "superior repetition",
                cshogi.REPETITION_INFERIOR: "inferior repetition"}


def reference_moves(path: Path) -> list[ReferenceMove]:
    """Every move of `path` by a plain cshogi replay, with dlshogi's `load_hcpe3` rules worked out: the
    move's position is left out when it has no candidates or when the move repeats a position (a draw,
    or the same board with one side's hand superior or inferior) within 16 plies (`moveIsDraw(move, 16)`)."""
    moves: list[ReferenceMove] = []
    board, packed, current = cshogi.Board(), np.zeros(32, np.uint8), -1
    for game, ply, result, start, info, visits in walk_hcpe3(path):
        if game != current:
            start_packed = np.frombuffer(start, np.uint8)
            try:  # king squares first: cshogi's decoder writes them before any check
                if not sane_kings(start_packed.reshape(1, 32))[0]:
                    raise RuntimeError("king squares off the board")
                board.set_hcp(start_packed)
            except RuntimeError as exc:
                raise UserError(f"{path}: game {game}: undecodable start position ({exc})") from None
            current = game
        move16 = int(info["selectedMove16"])
        move = board.move_from_move16(move16)
        if not move16 or not board.is_legal(move):
            raise UserError(f"{path}: game {game} move {ply}: selected move {move16:#06x} does not replay")
        board.to_hcp(packed)
        hcp, turn = packed.tobytes(), board.turn
        board.push(move)
        repetition = _REPETITIONS.get(board.is_draw(16))
        total = float(visits["visitNum"].astype(np.int64).sum())
        policy = {m: (1.0 if len(visits) == 1 else count / total)
                  for m, count in zip(visits["move16"].tolist(), visits["visitNum"].tolist())}
        winner = result & 3
        side_result = 0.5 if winner == cshogi.DRAW else float((winner == cshogi.BLACK_WIN) == (turn == cshogi.BLACK))
        moves.append(ReferenceMove(game, ply, hcp, move16, visits.copy(), policy, int(info["eval"]), result,
                                   side_result, repetition))
    return moves
