"""`convert`: game records (CSA, KIF, KI2) into hcpe, one record per position before each move.

Each record holds the position, the move played there (`bestMove16`), the game's result (`gameResult`,
cshogi's BLACK_WIN / WHITE_WIN / DRAW) and the evaluation written with the move where the record has one
(CSA `'**` comments, taken as black's view as dlshogi's csa_to_hcpe does, turned to the side to move's),
else 0. Beside the output goes its game index (`game_index`), which `split` needs.

Both are written to hidden temp files and renamed into place at the end (the index last): an error, a
full disk or Ctrl-C leaves the old output (if any) and no temp file.
"""

from __future__ import annotations

import collections
import stat
from dataclasses import dataclass, field
from pathlib import Path

import cshogi
import numpy as np

from tideborn.data.formats.game_index import GameEntry, IndexHeader, index_path, write_index
from tideborn.data.formats.games import RESULT_NAMES, Game, GameReadError, find_game_files, read_games
from tideborn.data.formats.records import RECORD_DTYPES, records_fingerprint
from tideborn.data.tools.progress import CountProgress
from tideborn.errors import UserError
from tideborn.outputs import StagedOutputs
from tideborn.safefile import file_type

HCPE = RECORD_DTYPES["hcpe"]


@dataclass(frozen=True)
class ConvertFilters:
    min_ply: int = 1
    """Games with fewer moves are skipped."""
    min_rating: float | None = None
    """Games whose stated ratings fall below this are skipped; games that state none are kept."""
    include_handicap: bool = False
    """Keep games that start from anything but the standard position (handicaps, problems, mid-game)."""
    dedupe: bool = True
    """Keep only the first of identical games (same start and moves), common across collections."""


@dataclass
class ConvertReport:
    files: int = 0
    games_read: int = 0
    games_written: int = 0
    positions: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    def summary(self, output: Path, listed: bool = True) -> str:
        lines = [f"{output}: {self.positions:,} positions from {self.games_written:,} games "
                 f"({self.games_read:,} games read in {self.files:,} files)"]
        if self.skipped:
            lines.append("skipped games: " + ", ".join(f"{reason} {count}" for reason, count in
                                                      sorted(self.skipped.items(), key=lambda kv: -kv[1])))
        if self.unreadable:
            where = "listed on stderr" if listed else "run without --quiet to list them"
            lines.append(f"unreadable files: {len(self.unreadable)} ({where})")
        lines.append(f"game index: {index_path(output)}")
        return "\n".join(lines)


def skip_reason(game: Game, filters: ConvertFilters) -> str | None:
    if game.result is None:
        return "no result"
    if game.handicap and not filters.include_handicap:
        return "handicap or non-standard start"
    if game.plies < filters.min_ply:
        return f"under {filters.min_ply} plies"
    stated = [r for r in game.ratings if r is not None]
    if filters.min_rating is not None and stated and min(stated) < filters.min_rating:
        return f"rated under {filters.min_rating:g}"
    return None


def game_records(game: Game, board: cshogi.Board) -> np.ndarray | str:
    """The game's positions as hcpe records, or why it cannot be converted (an illegal move)."""
    assert game.result is not None
    board.set_sfen(game.sfen)
    records = np.zeros(game.plies, dtype=HCPE)
    packed = np.zeros(32, dtype=np.uint8)
    for ply, move in enumerate(game.moves):
        if not move or not board.is_legal(move):
            return f"illegal move at ply {ply + 1}"
        board.to_hcp(packed)
        records["hcp"][ply] = packed
        score = int(np.clip(game.scores[ply], -32767, 32767)) if game.scores else 0
        records["eval"][ply] = score if board.turn == cshogi.BLACK else -score
        records["bestMove16"][ply] = np.uint16(cshogi.move16(move)).view(np.int16)
        records["gameResult"][ply] = game.result
        board.push(move)
    return records


def _game_key(game: Game) -> int:
    return hash((tuple(game.sfen.split(" ")[:3]), tuple(game.moves)))


def convert_games(inputs: list[Path], output: Path, filters: ConvertFilters = ConvertFilters(),
                  progress: bool = True, warn=None) -> ConvertReport:
    """Convert the record files in `inputs` (files or directories) into `output` and its game index."""
    if output.suffix.lower() != ".hcpe":
        raise UserError(f"--output {output}: name the output NAME.hcpe (the extension tells readers its format)")
    for item in inputs:
        if not item.exists():
            raise UserError(f"{item}: no such file or directory")
        mode = item.stat().st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):  # reading a FIFO would wait for a writer for ever
            raise UserError(f"{item}: is {file_type(mode)}; name game record files or directories")
    files = find_game_files(inputs)
    if not files:
        raise UserError(f"no game records (.csa, .kif, .kifu, .ki2) under {', '.join(map(str, inputs))}")
    with StagedOutputs() as outputs:
        outputs.prepare(output, "--output")
        outputs.prepare(index_path(output), "--output")
        report = ConvertReport(files=len(files))
        entries: list[GameEntry] = []
        bar = CountProgress("convert", len(files), "files", enabled=progress)
        temp = outputs.write(output, lambda sink: _convert_into(sink, files, filters, report, entries, bar, warn))
        bar.finish()
        if report.positions == 0:
            why = [f"{reason} {count}" for reason, count in report.skipped.items()]
            if report.unreadable:
                why.append(f"unreadable files {len(report.unreadable)} (e.g. {report.unreadable[0][0]}: "
                           f"{report.unreadable[0][1]})")
            raise UserError(f"no game to write ({', '.join(why) or 'no games in the files'}); "
                            f"nothing written to {output}")
        header = IndexHeader(report.positions, records_fingerprint(temp))
        outputs.write(index_path(output), lambda handle: write_index(handle, entries, header))
        outputs.publish()
    return report


def _convert_into(sink, files: list[Path], filters: ConvertFilters, report: ConvertReport,
                  entries: list[GameEntry], bar: CountProgress, warn) -> None:
    """Append the records of every game that passes `filters` to `sink`; count in `report` and `entries`."""
    seen: set[int] = set()
    board = cshogi.Board()
    for done, path in enumerate(files, start=1):
        try:
            games = read_games(path)
        except GameReadError as exc:
            report.unreadable.append((str(path), str(exc)))
            if warn is not None:
                warn(f"{path}: skipped: {exc}")
            continue
        for game in games:
            report.games_read += 1
            reason = skip_reason(game, filters)
            key = _game_key(game)
            if reason is None and filters.dedupe and key in seen:
                reason = "duplicate"
            if reason is None:
                converted = game_records(game, board)
                if isinstance(converted, str):
                    reason = converted.split(" at ")[0]
            if reason is not None:
                report.skipped[reason] += 1
                continue
            seen.add(key)
            assert not isinstance(converted, str) and game.result is not None
            sink.write(converted.data)  # not `tofile`: a plain write reports a full disk as ENOSPC
            ratings = [("" if r is None else f"{r:g}") for r in game.ratings]
            entries.append(GameEntry(report.positions, len(converted), game.plies, RESULT_NAMES[game.result],
                                     game.endgame, int(game.handicap), ratings[0], ratings[1], game.source))
            report.positions += len(converted)
            report.games_written += 1
        bar.update(done, f"{report.games_written:,} games, {report.positions:,} positions")
