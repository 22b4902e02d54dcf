"""Start positions for matches: the shipped WCSC28 set, a file of SFENs, or an hcpe file.

Every position is checked here (a valid SFEN, a side to move with a legal move and not already won by an
entering-king declaration), so a bad one is one line naming the file and line before any game starts.
"""

from __future__ import annotations

import re
from pathlib import Path

import cshogi
import numpy as np

from tideborn.errors import UserError

DEFAULT_OPENINGS = Path(__file__).with_name("openings.sfen")
"""621 distinct positions after 8, 12 and 16 plies of the WCSC28 games (see the file's header)."""
HCPE_RECORD = cshogi.HuffmanCodedPosAndEval.itemsize
MAX_OPENINGS = 1_000_000


_RANK = re.compile(r"(?:[1-9]|\+?[PLNSBRplnsbr]|[GKgk])+")
_PIECES = {"P": 18, "L": 4, "N": 4, "S": 4, "G": 4, "B": 2, "R": 2}
_HAND = re.compile(r"-|(?:(?:[1-9]|1[0-8])?[PLNSGBRplnsgbr])+")


def _sfen_syntax_error(sfen: str) -> str | None:
    """Why `sfen` is not SFEN text, or None. Checked before cshogi sees it: a malformed string makes its
    C++ parser throw an exception that aborts the whole process rather than raising in Python."""
    fields = sfen.split()
    if len(fields) not in (3, 4):
        return "board, side to move, hands and an optional move number"
    ranks = fields[0].split("/")
    if len(ranks) != 9:
        return "9 ranks separated by '/'"
    for rank in ranks:
        if not _RANK.fullmatch(rank):
            return f"rank {rank!r}"
        if sum(int(c) if c.isdigit() else 1 for c in rank.replace("+", "")) != 9:
            return f"rank {rank!r} is not 9 squares"
    if fields[0].count("K") != 1 or fields[0].count("k") != 1:
        return "one king a side"
    if fields[1] not in ("b", "w"):
        return f"side to move {fields[1]!r}"
    if not _HAND.fullmatch(fields[2]):
        return f"hands {fields[2]!r}"
    counts = dict.fromkeys("PLNSGBR", 0)
    for piece in fields[0].upper():
        counts[piece] = counts.get(piece, 0) + 1
    for number, piece in re.findall(r"(\d*)([A-Za-z])", fields[2] if fields[2] != "-" else ""):
        counts[piece.upper()] += int(number or 1)
    too_many = [piece for piece, limit in _PIECES.items() if counts[piece] > limit]
    if too_many:
        return f"more {too_many[0]} pieces than a shogi set has"
    if len(fields) == 4 and not (fields[3].isdigit() and 0 < int(fields[3]) < 100_000):
        return f"move number {fields[3]!r}"
    return None


def _check_playable(sfen: str, where: str) -> str:
    why = _sfen_syntax_error(sfen)
    if why:
        raise UserError(f"{where}: not a SFEN position ({why}): {sfen[:80]!r}")
    board = cshogi.Board()
    board.set_sfen(sfen)
    if not board.is_ok():
        raise UserError(f"{where}: not a legal position: {sfen[:80]!r}")
    if board.is_game_over() or board.is_nyugyoku():
        raise UserError(f"{where}: the game is already over in this position: {sfen[:80]!r}")
    return board.sfen()


def _sfen_of_line(line: str) -> str:
    text = line.strip()
    for prefix in ("position ", "sfen "):
        if text.startswith(prefix):
            text = text[len(prefix):].strip()
    if text.split(" ")[0] == "startpos":
        return cshogi.STARTING_SFEN
    return text


def load_openings(path: Path | None = None) -> list[str]:
    """The SFENs of `path` (text, one a line, `#` comments; or an .hcpe file), the shipped set if None."""
    source = DEFAULT_OPENINGS if path is None else path
    if not source.exists():
        raise UserError(f"{source}: no such openings file")
    if not source.is_file():
        raise UserError(f"{source}: the openings file is not a regular file")
    if source.suffix == ".hcpe":
        return _hcpe_openings(source)
    try:
        text = source.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{source}: not a text file of SFEN lines (or name an hcpe file *.hcpe)") from None
    except OSError as exc:
        raise UserError(f"{source}: cannot read the openings file ({exc.strerror})") from None
    sfens: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sfens.append(_check_playable(_sfen_of_line(line), f"{source}:{number}"))
        if len(sfens) > MAX_OPENINGS:
            raise UserError(f"{source}: more than {MAX_OPENINGS:,} openings; name a smaller file")
    if not sfens:
        raise UserError(f"{source}: no positions in the openings file (SFEN lines, '#' for comments)")
    return sfens


def _hcpe_openings(source: Path) -> list[str]:
    size = source.stat().st_size
    if size == 0 or size % HCPE_RECORD:
        raise UserError(f"{source}: not an hcpe file ({size} bytes is not a whole number of "
                        f"{HCPE_RECORD}-byte records)")
    if size // HCPE_RECORD > MAX_OPENINGS:
        raise UserError(f"{source}: more than {MAX_OPENINGS:,} openings; name a smaller file")
    records = np.fromfile(source, dtype=cshogi.HuffmanCodedPosAndEval)
    board = cshogi.Board()
    sfens: list[str] = []
    for index, record in enumerate(records):
        try:
            board.set_hcp(np.asarray(record["hcp"]))
        except Exception as exc:  # noqa: BLE001 - a damaged record makes cshogi raise a plain exception
            raise UserError(f"{source}: record {index} is not a position ({exc or type(exc).__name__})") from None
        sfens.append(_check_playable(board.sfen(), f"{source}: record {index}"))
    return sfens
