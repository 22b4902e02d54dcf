"""Start positions for matches: the shipped WCSC28 set, a file of SFENs, or an hcpe file.

Every position is checked here (a valid SFEN; pieces where the rules let them stand; the side not to move not
in check; `moves` after it legal, one by one; a side to move with a legal move and not already won by an
entering-king declaration), so a bad one is one line naming the file and line before any game starts. A position
the file holds twice is found too (`choose_openings`): with argmax play it would replay the same games.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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


_USI_MOVE = re.compile(r"[1-9][a-i][1-9][a-i]\+?|[PLNSGBR]\*[1-9][a-i]")


def _placement_error(sfen: str) -> str | None:
    """Why the pieces of `sfen` (valid SFEN text) stand where the rules never let them, or None: a pawn or lance
    on its last rank, a knight on its last two (no move from there), two unpromoted pawns of a side on a file
    (nifu). cshogi's `Board.is_ok` checks none of these."""
    ranks = sfen.split()[0].split("/")
    pawns: dict[tuple[str, int], int] = {}
    for row, rank in enumerate(ranks):  # row 0 is rank a (white's back rank), row 8 rank i (black's)
        column, promoted = 0, False
        for char in rank:
            if char == "+":
                promoted = True
                continue
            if char.isdigit():
                column += int(char)
                continue
            file, black = 9 - column, char.isupper()
            last = 0 if black else 8  # the rank a piece of that side moves towards and cannot leave
            piece, side = char.upper(), "black" if black else "white"
            if not promoted:
                if piece in "PL" and row == last:
                    return f"a {side} {'pawn' if piece == 'P' else 'lance'} on its last rank ({file}{'abcdefghi'[row]})"
                if piece == "N" and abs(row - last) <= 1:
                    return f"a {side} knight on its last two ranks ({file}{'abcdefghi'[row]})"
                if piece == "P":
                    pawns[(side, file)] = pawns.get((side, file), 0) + 1
                    if pawns[(side, file)] > 1:
                        return f"two unpromoted {side} pawns on file {file} (nifu)"
            column, promoted = column + 1, False
    return None


def _check_position(sfen: str, where: str) -> cshogi.Board:
    """The board of `sfen`, refused (`UserError`, naming `where`) unless it is SFEN text of a position the rules
    can reach: pieces where they may stand, and the side that just moved not left in check."""
    why = _sfen_syntax_error(sfen)
    if why:
        raise UserError(f"{where}: not a SFEN position ({why}): {sfen[:80]!r}")
    why = _placement_error(sfen)
    if why:
        raise UserError(f"{where}: not a legal position ({why}): {sfen[:80]!r}")
    fields = sfen.split()
    flipped = cshogi.Board()
    flipped.set_sfen(" ".join([fields[0], "w" if fields[1] == "b" else "b", *fields[2:]]))
    if flipped.is_check():  # asked before is_ok, which prints its diagnosis of this case to stdout
        waiting = "white" if fields[1] == "b" else "black"
        raise UserError(f"{where}: not a legal position ({waiting}, not to move, is in check): {sfen[:80]!r}")
    board = cshogi.Board()
    board.set_sfen(sfen)
    if not board.is_ok():
        raise UserError(f"{where}: not a legal position: {sfen[:80]!r}")
    return board


def _check_playable(board: cshogi.Board, where: str, text: str) -> str:
    if board.is_game_over() or board.is_nyugyoku():
        raise UserError(f"{where}: the game is already over in this position: {text[:80]!r}")
    return board.sfen()


def _position_of_line(line: str, where: str) -> str:
    """The SFEN of an openings line: `[position] startpos [moves M...]` or `[position] [sfen] SFEN [moves M...]`,
    its moves (USI) played and checked legal one by one. Anything else after `startpos`, or a move that is not
    legal where it is played, is refused naming `where` and the move."""
    return _check_playable(board_of_position(line, where), where, line.strip())


def board_of_position(line: str, where: str) -> cshogi.Board:
    """The board of a USI `position` line (or an openings line, as `_position_of_line` reads it) with its moves
    played on it, so the board keeps their history (repetitions); `UserError` naming `where` for anything that
    is not a legal position and legal moves. The USI engine reads its GUI's `position` commands with it: the
    checks come before cshogi sees the text, whose C++ parser aborts the process on malformed SFEN."""
    tokens = line.split()
    if tokens[0] == "position":
        tokens = tokens[1:]
    if not tokens:
        raise UserError(f"{where}: 'position' with no position after it")
    if tokens[0] == "startpos":
        base, rest = cshogi.STARTING_SFEN, tokens[1:]
        if rest and rest[0] != "moves":
            raise UserError(f"{where}: {rest[0]!r} after startpos; only 'moves' and USI moves may follow it: "
                            f"{line.strip()[:80]!r}")
    else:
        if tokens[0] == "sfen":
            tokens = tokens[1:]
        cut = tokens.index("moves") if "moves" in tokens else len(tokens)
        base, rest = " ".join(tokens[:cut]), tokens[cut:]
    board = _check_position(base, where)
    for number, usi in enumerate(rest[1:], start=1):
        move = board.move_from_usi(usi) if _USI_MOVE.fullmatch(usi) else 0
        if not move or not board.is_legal(move):
            if not _USI_MOVE.fullmatch(usi):
                raise UserError(f"{where}: move {number}, {usi!r}, is not a USI move (e.g. 7g7f, 8h2b+, P*5e)")
            raise UserError(f"{where}: move {number}, {usi!r}, is not a legal move in the position it is played "
                            f"in ({board.sfen()})")
        board.push(move)
    return board


def load_openings(path: Path | None = None) -> list[str]:
    """The SFENs of `path` (text, one a line, `#` comments; or an .hcpe file), the shipped set if None; every
    one, repeats included (`choose_openings` finds them)."""
    return [sfen for sfen, _ in _read_openings(path)]


@dataclass(frozen=True)
class Openings:
    """A match's start positions and what was found repeated in the file they came from."""
    positions: list[str]
    """The SFENs to play, in the file's order: each position once unless repeats were kept."""
    source: Path
    repeats: list[tuple[str, str]]
    """(where, where first): each line or record whose position an earlier one already holds."""
    kept: bool
    """Whether the repeats are among `positions` (`--keep-repeated-openings`)."""

    def warning(self) -> str | None:
        """One line saying how many positions repeat, the first few by line, and what was done; None if none."""
        if not self.repeats:
            return None
        shown = ", ".join(f"{where} = {first}" for where, first in self.repeats[:REPEATS_SHOWN])
        more = f", and {len(self.repeats) - REPEATS_SHOWN:,} more" if len(self.repeats) > REPEATS_SHOWN else ""
        total = len(self.positions) + (0 if self.kept else len(self.repeats))
        done = ("kept (--keep-repeated-openings): with argmax play each replays the same games" if self.kept else
                f"dropped, {len(self.positions):,} distinct openings left (--keep-repeated-openings keeps them)")
        return (f"{self.source}: {len(self.repeats):,} of {total:,} opening positions repeat an earlier one "
                f"({shown}{more}); {done}")


REPEATS_SHOWN = 5
"""Repeats named in the warning; the rest are counted."""


def position_key(sfen: str) -> str:
    """What makes two openings the same game: board, side to move and hands; not the move number."""
    return " ".join(sfen.split()[:3])


def choose_openings(path: Path | None = None, keep_repeated: bool = False) -> Openings:
    """The openings of `path` (as `load_openings`) with each position that repeats an earlier one (the same board,
    side to move and hands, however it was written) found, and dropped unless `keep_repeated`."""
    first_seen: dict[str, str] = {}
    positions: list[str] = []
    repeats: list[tuple[str, str]] = []
    for sfen, where in _read_openings(path):
        key = position_key(sfen)
        if key in first_seen:
            repeats.append((where, first_seen[key]))
            if not keep_repeated:
                continue
        else:
            first_seen[key] = where
        positions.append(sfen)
    return Openings(positions, DEFAULT_OPENINGS if path is None else path, repeats, keep_repeated)


def _read_openings(path: Path | None) -> list[tuple[str, str]]:
    """(SFEN, where: `line N` or `record N`) of every position of `path`, the shipped set if None."""
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
    sfens: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sfens.append((_position_of_line(line, f"{source}:{number}"), f"line {number}"))
        if len(sfens) > MAX_OPENINGS:
            raise UserError(f"{source}: more than {MAX_OPENINGS:,} openings; name a smaller file")
    if not sfens:
        raise UserError(f"{source}: no positions in the openings file (SFEN lines, '#' for comments)")
    return sfens


def _hcpe_openings(source: Path) -> list[tuple[str, str]]:
    size = source.stat().st_size
    if size == 0 or size % HCPE_RECORD:
        raise UserError(f"{source}: not an hcpe file ({size} bytes is not a whole number of "
                        f"{HCPE_RECORD}-byte records)")
    if size // HCPE_RECORD > MAX_OPENINGS:
        raise UserError(f"{source}: more than {MAX_OPENINGS:,} openings; name a smaller file")
    records = np.fromfile(source, dtype=cshogi.HuffmanCodedPosAndEval)
    board = cshogi.Board()
    sfens: list[tuple[str, str]] = []
    for index, record in enumerate(records):
        try:
            board.set_hcp(np.asarray(record["hcp"]))
        except Exception as exc:  # noqa: BLE001 - a damaged record makes cshogi raise a plain exception
            raise UserError(f"{source}: record {index} is not a position ({exc or type(exc).__name__})") from None
        where = f"{source}: record {index}"
        sfen = board.sfen()
        sfens.append((_check_playable(_check_position(sfen, where), where, sfen), f"record {index}"))
    return sfens
