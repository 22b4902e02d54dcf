"""The game index: a CSV beside an hcpe file that says which records belong to which game.

hcpe records carry no game boundaries, yet a train/test split must not cut through a game (its positions
are near-duplicates of each other). `convert` writes `NAME.games.csv` beside `NAME.hcpe`; `split` reads it
and writes one beside each output; `inspect` takes the ply range from it.

Its first line, `# tideborn-index {...}` (JSON), ties it to its hcpe file: the record count and a
fingerprint of the file's content (`records_fingerprint`), and for `split`'s outputs the split's id, the
file's role (train or test) and its partner. With it, a reader can tell an index written for another
version of its hcpe file, and a train/test pair whose halves come from different splits (a split
interrupted between its renames, or files copied from two splits): the trainer and `verify` refuse both.
Indexes without that line (written before it existed) are read as before, unchecked.
"""

from __future__ import annotations

import csv
import io
import json
import os
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tideborn.errors import UserError

INDEX_SUFFIX = ".games.csv"
HEADER_PREFIX = "# tideborn-index "


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


@dataclass(frozen=True)
class IndexHeader:
    """What an index says about the file it was written for (its first line)."""

    records: int
    fingerprint: str
    """`records_fingerprint` of the hcpe file."""
    split_id: str | None = None
    """Shared by the train and test outputs of one `split` run."""
    role: str | None = None
    """train or test, for `split`'s outputs."""
    partner: str | None = None
    """The other output of the split, relative to this file's directory."""


def write_index(handle: typing.BinaryIO, entries: list[GameEntry], header: IndexHeader | None = None) -> None:
    """Write the index (its header line first, when given) to a binary handle."""
    text = io.StringIO(newline="")
    if header is not None:
        text.write(HEADER_PREFIX + json.dumps({k: v for k, v in asdict(header).items() if v is not None}) + "\n")
    writer = csv.DictWriter(text, fieldnames=COLUMNS)
    writer.writeheader()
    for entry in entries:
        writer.writerow(asdict(entry))
    handle.write(text.getvalue().encode("utf-8"))


def read_index_header(path: Path) -> IndexHeader | None:
    """The header of the index at `path`, or None when it has none (or there is no index)."""
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.readline()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the game index: {exc}") from None
    if not first.startswith(HEADER_PREFIX):
        return None
    try:
        fields_ = json.loads(first[len(HEADER_PREFIX):])
        return IndexHeader(int(fields_["records"]), str(fields_["fingerprint"]), fields_.get("split_id"),
                           fields_.get("role"), fields_.get("partner"))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: line 1: malformed index header ({exc})") from None


def index_mismatch(records_path: Path) -> str | None:
    """Why the index beside `records_path` does not belong to that file's present content, or None (it
    does, or it has no header to tell)."""
    from tideborn.data.formats.records import records_fingerprint

    index = index_path(records_path)
    header = read_index_header(index)
    if header is None or records_fingerprint(records_path) == header.fingerprint:
        return None
    return (f"{index} was written for another version of {records_path.name} ({header.records:,} records then); "
            f"an interrupted or half-copied `data split` or `convert`? Run it again")


def partner_of(records_path: Path, header: IndexHeader) -> Path | None:
    return None if header.partner is None else records_path.parent / header.partner


def split_mismatch(a: Path, b: Path) -> str | None:
    """Why the hcpe files `a` and `b` are not the two halves of one split, or None where neither's index
    names the other as its partner (nothing to compare)."""
    header_a, header_b = read_index_header(index_path(a)), read_index_header(index_path(b))
    if header_a is None or header_b is None:
        return None
    named = [p for p, h, other in ((a, header_a, b), (b, header_b, a))
             if (partner := partner_of(p, h)) is not None and _same_file(partner, other)]
    if not named or header_a.split_id == header_b.split_id:
        return None
    return _mixed_pair(a, header_a, b, header_b)


def _mixed_pair(a: Path, header_a: IndexHeader, b: Path, header_b: IndexHeader) -> str:
    return (f"{a} and {b} come from different `data split` runs (split ids {header_a.split_id} and "
            f"{header_b.split_id}; an interrupted split, or files copied from two splits): test positions may "
            f"occur in train; run the split again")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def check_pairs(train: typing.Sequence[Path], test: typing.Sequence[Path]) -> None:
    """Raise `UserError` if an hcpe file's index belongs to another version of it, or a train and a test
    file one of which names the other as its partner come from different splits. Each index is read
    once, whatever the number of files."""
    for path in [*train, *test]:
        if (problem := index_mismatch(path)) is not None:
            raise UserError(problem)
    headers = {path: read_index_header(index_path(path)) for path in [*train, *test]}
    by_place = [{p.resolve(): p for p in train}, {p.resolve(): p for p in test}]
    for side, files in enumerate((train, test)):
        for path in files:
            header = headers[path]
            partner = None if header is None else partner_of(path, header)
            other = None if partner is None else by_place[1 - side].get(partner.resolve())
            if other is None or headers[other] is None or headers[other].split_id == header.split_id:
                continue
            pair = ((path, header), (other, headers[other]))
            raise UserError(_mixed_pair(*pair[side], *pair[1 - side]))


def read_index(path: Path, records: int) -> list[GameEntry]:
    """The entries of `path`, checked to tile `records` records exactly, in order."""
    if not path.is_file():
        raise UserError(f"{path}: no game index; split needs the index that `convert` writes beside its "
                        f"output (game boundaries are not stored in hcpe records)")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            first = handle.readline()
            start_line = 3
            if not first.startswith(HEADER_PREFIX):
                handle.seek(0)
                start_line = 2
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: cannot read the game index: {exc}") from None
    entries = []
    expected_first = 0
    for line, row in enumerate(rows, start=start_line):
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
