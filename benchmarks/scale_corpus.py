"""Corpora of a chosen size for the scale benchmark, hcpe3 and hcpe, from the shipped games.

A seed is written once: the games under `samples/games` as hcpe3 with made-up search statistics
(`hcpe3_file.write_hcpe3_from_games`, a few copies with other statistics each, no book moves, as self-play
writes), and the same moves as hcpe records (a plain cshogi replay of the seed: hcp, eval, move, result).
A corpus of N positions repeats the seed's bytes: whole games for hcpe3 (it stops after the game that
reaches N moves), records for hcpe (exactly N). Every game is real and legal, so the readers do their
whole work on each copy; only the positions repeat, which costs the readers nothing less.
"""

from __future__ import annotations

import tempfile
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.hcpe3_file import HCPE3_HEADER, MOVE_INFO, MOVE_VISITS, reference_moves, write_hcpe3_from_games
from tideborn.data.formats.records import RECORD_DTYPES
from tideborn.errors import UserError
from tideborn.outputs import StagedOutputs

SAMPLE_GAMES = Path(__file__).resolve().parents[1] / "samples" / "games"
WRITE_BYTES = 1 << 24
"""Bytes handed to the file at a time: large enough that Python's loop is not the cost, small in memory."""


@dataclass
class Seed:
    """The games once, as hcpe3 bytes cut at game boundaries, and their moves as hcpe records."""

    hcpe3: bytes
    game_ends: np.ndarray
    """Byte offset just past each game in `hcpe3`."""
    game_moves: np.ndarray
    """Moves (MoveInfo entries) of each game, in order."""
    hcpe: np.ndarray

    @property
    def hcpe3_bytes_per_move(self) -> float:
        return len(self.hcpe3) / max(int(self.game_moves.sum()), 1)


def game_boundaries(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(end offset, moves) of each game of hcpe3 bytes `data` (a plain walk of the layout)."""
    ends, moves, offset = [], [], 0
    while offset < len(data):
        header = np.frombuffer(data, HCPE3_HEADER, 1, offset)[0]
        offset += HCPE3_HEADER.itemsize
        count = int(header["moveNum"])
        for _ in range(count):
            info = np.frombuffer(data, MOVE_INFO, 1, offset)[0]
            offset += MOVE_INFO.itemsize + int(info["candidateNum"]) * MOVE_VISITS.itemsize
        if offset > len(data):
            raise UserError(f"the seed corpus ends inside game {len(ends)}")
        ends.append(offset)
        moves.append(count)
    return np.asarray(ends, np.int64), np.asarray(moves, np.int64)


def make_seed(games: typing.Sequence[Path] = (SAMPLE_GAMES,), copies: int = 4, seed: int = 0) -> Seed:
    """The seed of every corpus: `games` written `copies` times as hcpe3 (other statistics each time)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "seed.hcpe3"
        write_hcpe3_from_games(list(games), path, copies=copies, seed=seed, book_plies=0)
        data = path.read_bytes()
        moves = reference_moves(path)
    ends, game_moves = game_boundaries(data)
    hcpe = np.zeros(len(moves), RECORD_DTYPES["hcpe"])
    hcpe["hcp"] = np.frombuffer(b"".join(m.hcp for m in moves), np.uint8).reshape(-1, 32)
    hcpe["eval"] = [m.eval for m in moves]
    hcpe["bestMove16"] = np.asarray([m.move16 for m in moves], np.uint16).view(np.int16)
    hcpe["gameResult"] = [m.result_byte & 3 for m in moves]
    return Seed(data, ends, game_moves, hcpe)


def _write(path: Path, chunks: typing.Callable[[], typing.Iterator[bytes]]) -> None:
    """Whole or not at all (a staged file renamed over `path` once written), like every file tideborn writes."""

    def fill(out: typing.BinaryIO) -> None:
        for chunk in chunks():
            out.write(chunk)

    with StagedOutputs() as staged:
        staged.prepare(path, "corpus")
        staged.write(path, fill)
        staged.publish()


def write_hcpe3_corpus(seed: Seed, path: Path, positions: int) -> int:
    """Write the seed's games to `path` over and over until `positions` moves are written, whole games
    only; returns the moves written (at least `positions`, less than one game more)."""
    per_seed = int(seed.game_moves.sum())
    whole, rest = divmod(positions, per_seed)
    cumulative = np.cumsum(seed.game_moves)
    tail_games = int(np.searchsorted(cumulative, rest)) + 1 if rest else 0
    tail_bytes = int(seed.game_ends[tail_games - 1]) if tail_games else 0

    def chunks() -> typing.Iterator[bytes]:
        copies_per_chunk = max(1, WRITE_BYTES // len(seed.hcpe3))
        left = whole
        while left:
            n = min(left, copies_per_chunk)
            yield seed.hcpe3 * n
            left -= n
        if tail_bytes:
            yield seed.hcpe3[:tail_bytes]

    _write(path, chunks)
    return whole * per_seed + (int(cumulative[tail_games - 1]) if tail_games else 0)


def write_hcpe_corpus(seed: Seed, path: Path, positions: int) -> int:
    """Write exactly `positions` hcpe records to `path`: the seed's records over and over."""
    records = seed.hcpe.tobytes()
    record_bytes = seed.hcpe.dtype.itemsize

    def chunks() -> typing.Iterator[bytes]:
        per_chunk = max(1, WRITE_BYTES // len(records))
        left = positions
        while left:
            n = min(left, per_chunk * len(seed.hcpe))
            copies, part = divmod(n, len(seed.hcpe))
            yield records * copies + records[:part * record_bytes]
            left -= n

    _write(path, chunks)
    return positions
