"""The game index: a CSV beside an hcpe file that says which records belong to which game.

hcpe records carry no game boundaries, yet a train/test split must not cut through a game (its positions
are near-duplicates of each other). `convert` writes `NAME.games.csv` beside `NAME.hcpe`; `split` reads it
and writes one beside each output; `inspect` takes the ply range from it.
"""

from __future__ import annotations

import csv
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tideborn.errors import UserError

INDEX_SUFFIX = ".games.csv"


@dataclass
class GameEntry:
    first_record: int
    """Index of the game's first record in the hcpe file."""
    records: int
    """How many consecutive records the game has there."""
    plies: int
    """Moves in the game record (records can be fewer: split drops positions shared with train)."""
    result: str
    """black_win, white_win or draw."""
    endgame: str
    handicap: int
    black_rating: str
    white_rating: str
    source: str


COLUMNS = [f.name for f in fields(GameEntry)]


def index_path(records_path: Path) -> Path:
    """`games.hcpe` -> `games.games.csv`."""
    return records_path.with_suffix(INDEX_SUFFIX)


def write_index(path: Path, entries: list[GameEntry]) -> None:
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for entry in entries:
            writer.writerow(asdict(entry))
    os.replace(temp, path)


def read_index(path: Path, records: int) -> list[GameEntry]:
    """The entries of `path`, checked to tile `records` records exactly, in order."""
    if not path.is_file():
        raise UserError(f"{path}: no game index; split needs the index that `convert` writes beside its "
                        f"output (game boundaries are not stored in hcpe records)")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: cannot read the game index: {exc}") from None
    entries = []
    expected_first = 0
    for line, row in enumerate(rows, start=2):
        try:
            entry = GameEntry(int(row["first_record"]), int(row["records"]), int(row["plies"]), row["result"],
                              row["endgame"], int(row["handicap"]), row["black_rating"], row["white_rating"],
                              row["source"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{path}: line {line}: malformed game index row ({exc})") from None
        if entry.first_record != expected_first or entry.records < 0:
            raise UserError(f"{path}: line {line}: game starts at record {entry.first_record}, expected "
                            f"{expected_first}; the index does not match its hcpe file")
        expected_first += entry.records
        entries.append(entry)
    if expected_first != records:
        raise UserError(f"{path}: the index covers {expected_first} records but its hcpe file holds {records}; "
                        f"it belongs to another version of the file")
    return entries
