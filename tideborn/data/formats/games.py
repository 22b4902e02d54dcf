"""Game records (CSA, KIF, KI2) read with cshogi's parsers into `Game`s: start, moves, result, players.

Real collections mix encodings (UTF-8 with or without BOM, cp932, EUC-JP) and formats, and state results
in several ways, so the result is worked out here rather than taken from the parser as is:

- CSA: a shogi-server `'summary:` line when present (it names the real winner of, e.g., a perpetual
  check), else the `%` end line. cshogi reports DRAW for a game without any result line, and knows no
  `%TSUMI`, so its `win` is not used.
- KIF / KI2: cshogi's result when it recognises the closing `まで...` line; else that line read more
  loosely (`まで147手で時間切れにより先手の勝ち`); else the terminal move line (`90 投了`), trusted only
  when its move number follows the last move. Variations (`変化：`) are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import cshogi
from cshogi import CSA, KI2, KIF

GAME_EXTENSIONS = {".csa": "csa", ".kif": "kif", ".kifu": "kif", ".ki2": "ki2", ".ki2u": "ki2"}
RESULT_NAMES = {cshogi.BLACK_WIN: "black_win", cshogi.WHITE_WIN: "white_win", cshogi.DRAW: "draw"}
_STANDARD_BOARD = cshogi.STARTING_SFEN.split(" ")[:3]

# CSA end lines: who wins relative to the side to move when the line is written.
_CSA_MOVER_LOSES = {"%TORYO", "%TIME_UP", "%ILLEGAL_MOVE", "%TSUMI"}
_CSA_MOVER_WINS = {"%KACHI"}
_CSA_DRAWS = {"%SENNICHITE", "%JISHOGI", "%HIKIWAKE", "%MAX_MOVES"}
_SUMMARY = re.compile(r"^'summary:[^:]*:(.+) (win|lose|draw):(.+) (win|lose|draw)\s*$")
_KIF_CLOSING = re.compile(r"まで(\d+)手.*?(先|後|下|上)手の(勝ち|入玉勝ち|反則勝ち|反則負け|負け)")
_KIF_CLOSING_DRAW = re.compile(r"まで(\d+)手.*?(千日手|持将棋)")
_KIF_TERMINAL = re.compile(r"^\s*(\d+)\s+(投了|詰み|切れ負け|Time-up|反則負け|反則勝ち|入玉勝ち|千日手|持将棋)")
_KIF_MOVER_LOSES = {"投了", "詰み", "切れ負け", "Time-up", "反則負け"}
_KIF_MOVER_WINS = {"反則勝ち", "入玉勝ち"}
_CSA_CLIENT_ENDS = {"#RESIGN": "%TORYO", "#TIME_UP": "%TIME_UP", "#ILLEGAL_MOVE": "%ILLEGAL_MOVE",
                    "#SENNICHITE": "%SENNICHITE", "#JISHOGI": "%JISHOGI", "#MAX_MOVES": "%MAX_MOVES"}
_CSA_PIECE = r"(?:FU|KY|KE|GI|KI|KA|HI|OU|TO|NY|NK|NG|UM|RY)"
_CSA_BOARD_ROW = re.compile(rf"^P[1-9](?: \* |[+-]{_CSA_PIECE}){{9}}\s*$")
_CSA_HANDICAP_ROW = re.compile(rf"^PI(?:[1-9]{{2}}{_CSA_PIECE})*\s*$")


class GameReadError(Exception):
    """A game record file that cannot be read or parsed; the message says why."""


@dataclass
class Game:
    source: str
    """The file (and `#N` for the N-th game of a multi-game CSA file)."""
    sfen: str
    """The starting position."""
    moves: list[int]
    result: int | None
    """cshogi.BLACK_WIN, WHITE_WIN or DRAW; None when the record states no result."""
    endgame: str = ""
    """How the game ended, as the record says (`%TORYO`, `%SENNICHITE`, ...)."""
    scores: list[int] | None = None
    """Per move, the evaluation written with it (CSA `'**` comments), from black's view; None if absent."""
    ratings: tuple[float | None, float | None] = (None, None)
    names: tuple[str, str] = ("", "")
    notes: list[str] = field(default_factory=list)

    @property
    def handicap(self) -> bool:
        """True unless the game starts from the standard initial position with black to move."""
        return self.sfen.split(" ")[:3] != _STANDARD_BOARD

    @property
    def plies(self) -> int:
        return len(self.moves)


def decode_text(data: bytes) -> str:
    """Text of a record file: UTF-8 (BOM or not), else cp932 (Shift_JIS), else EUC-JP."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for encoding in ("utf-8", "cp932", "euc_jp"):
        try:
            return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError:
            continue
    raise GameReadError("cannot tell the text encoding (tried UTF-8, cp932, EUC-JP)")


def _mover(sfen: str, plies: int) -> int:
    """The side to move after `plies` moves from `sfen`."""
    first = cshogi.WHITE if sfen.split(" ")[1] == "w" else cshogi.BLACK
    return first ^ (plies & 1)


def _win_for(color: int) -> int:
    return cshogi.BLACK_WIN if color == cshogi.BLACK else cshogi.WHITE_WIN


def csa_result(endgame: str, comment: str, names: list[str], sfen: str, plies: int) -> int | None:
    for line in comment.splitlines():
        found = _SUMMARY.match(line.strip())
        if found:
            first_name, first, second_name, second = (s.strip() for s in found.groups())
            if first == "draw" and second == "draw":
                return cshogi.DRAW
            # shogi-server lists black first; names confirm it when they are given
            black_outcome = second if names[0] and names[0] == second_name and names[0] != first_name else first
            return cshogi.BLACK_WIN if black_outcome == "win" else cshogi.WHITE_WIN
    mover = _mover(sfen, plies)
    if endgame in _CSA_MOVER_LOSES:
        return _win_for(mover ^ 1)
    if endgame in _CSA_MOVER_WINS:
        return _win_for(mover)
    if endgame == "%+ILLEGAL_ACTION":
        return cshogi.WHITE_WIN
    if endgame == "%-ILLEGAL_ACTION":
        return cshogi.BLACK_WIN
    if endgame in _CSA_DRAWS:
        return cshogi.DRAW
    return None


def kif_result(parsed_win: int | None, text: str, sfen: str, plies: int) -> tuple[int | None, str]:
    if parsed_win is not None:
        return parsed_win, "closing line"
    for line in text.splitlines():
        found = _KIF_CLOSING.search(line)
        if found and int(found.group(1)) == plies:
            side = cshogi.BLACK if found.group(2) in "先下" else cshogi.WHITE
            loses = found.group(3) in ("反則負け", "負け")
            return _win_for(side ^ 1 if loses else side), "closing line"
        found = _KIF_CLOSING_DRAW.search(line)
        if found and int(found.group(1)) == plies:
            return cshogi.DRAW, "closing line"
    for line in text.splitlines():
        found = _KIF_TERMINAL.match(line)
        if found and int(found.group(1)) == plies + 1:
            word, mover = found.group(2), _mover(sfen, plies)
            if word in _KIF_MOVER_LOSES:
                return _win_for(mover ^ 1), word
            if word in _KIF_MOVER_WINS:
                return _win_for(mover), word
            return cshogi.DRAW, word
    return None, ""


def prepare_csa_text(text: str) -> str:
    """Position lines as cshogi's C++ CSA parser needs them, or `GameReadError`: that parser reads past
    the end of a short or unknown board line, and of any P+/P- line, and crashes instead of raising."""
    lines = text.split("\n")
    has_end = any(line.startswith("%") for line in lines)
    for number, line in enumerate(lines, start=1):
        if line.startswith("#"):
            # shogi-server client lines (`#RESIGN`, `#TIME_UP`, `#WIN`): cshogi rejects them. Where the game
            # has no `%` end line, the first that says how it ended stands for one; the rest are comments.
            end = _CSA_CLIENT_ENDS.get(line.strip())
            lines[number - 1] = end if end and not has_end else "'" + line
            has_end = has_end or bool(end)
            continue
        if line.rstrip() in ("P+", "P-"):
            lines[number - 1] = "'"  # an empty piece list (nothing in hand): a no-op cshogi cannot read
            continue
        if line.startswith(("P+", "P-")):
            raise GameReadError(f"line {number}: piece-by-piece setup lines (P+, P-) are not supported "
                                f"(cshogi's CSA parser cannot read them; such games start from a "
                                f"non-standard position)")
        if line.startswith("PI"):
            if not _CSA_HANDICAP_ROW.match(line):
                raise GameReadError(f"line {number}: malformed PI line {line[:40]!r}")
        elif line.startswith("P"):
            lines[number - 1] = line = line.rstrip().ljust(29)  # editors strip the last cell's blank
            if not _CSA_BOARD_ROW.match(line):
                raise GameReadError(f"line {number}: malformed board line {line[:40]!r}")
    return "\n".join(lines)


def _parse_csa(text: str, source: str) -> list[Game]:
    games = []
    parsed_games = CSA.Parser.parse_str(prepare_csa_text(text))
    for number, parsed in enumerate(parsed_games, start=1):
        moves = list(parsed.moves)
        if not moves and not parsed.sfen:
            continue  # the empty tail after a trailing "/" separator
        scores = list(parsed.scores)[:len(moves)]
        ratings = tuple(r if r else None for r in parsed.ratings)
        name = source if len(parsed_games) == 1 else f"{source}#{number}"
        result = csa_result(parsed.endgame, parsed.comment, parsed.names, parsed.sfen, len(moves))
        games.append(Game(name, parsed.sfen, moves, result, parsed.endgame,
                          scores if any(scores) else None, ratings, tuple(parsed.names)))  # type: ignore[arg-type]
    return games


def _ki2_move(token: re.Match, board: cshogi.Board, previous: int | None, number: int) -> int:
    """The legal move a KI2 move (`▲５七銀右上`) names, by the notation's rules: a drop is implied only when
    no piece on the board can reach the square, no `成` means no promotion, and 上/引/寄/直 and 左/右 are
    seen from the mover's side. (cshogi 1.1.0's KI2 parser counts drops among the pieces 左/右 compare
    and fails with an IndexError on ordinary games.)"""
    _, dest, file_kanji, rank_kanji, piece, side, motion, action = token.groups()
    piece_type = cshogi.PIECE_JAPANESE_SYMBOLS.index(piece)
    if dest.rstrip("\u3000") == "同":
        if previous is None:
            raise GameReadError(f"move {number}: `{token.group(0).strip()}` has no previous move")
        to_square = cshogi.move_to(previous)
    else:
        to_square = (cshogi.NUMBER_JAPANESE_NUMBER_SYMBOLS.index(file_kanji) - 1) * 9 \
            + cshogi.NUMBER_JAPANESE_KANJI_SYMBOLS.index(rank_kanji) - 1
    reaching = [m for m in board.legal_moves if cshogi.move_to(m) == to_square]
    drops = [m for m in reaching if cshogi.move_is_drop(m)
             and cshogi.hand_piece_to_piece_type(cshogi.move_drop_hand_piece(m)) == piece_type]
    moving = [m for m in reaching if not cshogi.move_is_drop(m) and cshogi.move_from_piece_type(m) == piece_type]
    if action == "打" or not moving:
        candidates = drops
    else:
        promote = action == "成"
        candidates = [m for m in moving if cshogi.move_is_promotion(m) == promote]
        black = board.turn == cshogi.BLACK
        to_file, to_rank = divmod(to_square, 9)

        def forward(m: int) -> int:  # >0: the piece moves toward the opponent
            rank = cshogi.move_from(m) % 9
            return (rank - to_rank) if black else (to_rank - rank)

        if motion == "上":
            candidates = [m for m in candidates if forward(m) > 0]
        elif motion == "引":
            candidates = [m for m in candidates if forward(m) < 0]
        elif motion == "寄":
            candidates = [m for m in candidates if forward(m) == 0]
        if side == "直":
            candidates = [m for m in candidates if forward(m) > 0 and cshogi.move_from(m) // 9 == to_file]
        elif side in ("左", "右") and candidates:
            files = [cshogi.move_from(m) // 9 for m in candidates]
            # black's left is the high file numbers; white sees the board the other way round
            wanted = max(files) if (side == "左") == black else min(files)
            candidates = [m for m in candidates if cshogi.move_from(m) // 9 == wanted]
    if len(candidates) != 1:
        why = "no legal move" if not candidates else f"{len(candidates)} legal moves"
        raise GameReadError(f"move {number}: `{token.group(0).strip()}` matches {why}")
    return candidates[0]


def _ki2_moves(text: str, sfen: str) -> list[int]:
    """The main line's moves from the `▲`/`△` lines of a KI2 record, starting from `sfen`."""
    board = cshogi.Board(sfen)
    moves: list[int] = []
    for line in text.split("\n"):
        if not line.startswith(("▲", "△")):
            continue
        line = (line.replace("王", "玉").replace("竜", "龍").replace("成銀", "全").replace("成桂", "圭")
                .replace("成香", "杏"))
        position = 0
        while token := KI2.Parser.MOVE_RE.match(line, position):
            move = _ki2_move(token, board, moves[-1] if moves else None, len(moves) + 1)
            board.push(move)
            moves.append(move)
            position = token.end()
        if line[position:].strip():
            raise GameReadError(f"move {len(moves) + 1}: cannot read `{line[position:position + 20].strip()}`")
    return moves


def _parse_kif(text: str, source: str, fmt: str) -> list[Game]:
    text = text.split("\n変化：", 1)[0]  # main line only
    if fmt == "kif":
        parsed = KIF.Parser.parse_str(text)
        moves = list(parsed.moves)
    else:
        # cshogi reads the header, start and result (the move lines left out), the moves are read here
        parsed = KI2.Parser.parse_str("\n".join(line for line in text.split("\n")
                                                 if not line.startswith(("▲", "△"))))
        moves = _ki2_moves(text, parsed.sfen)
    result, how = kif_result(parsed.win, text, parsed.sfen, len(moves))
    names = tuple(n or "" for n in parsed.names)
    return [Game(source, parsed.sfen, moves, result, parsed.endgame or how, None, (None, None), names)]  # type: ignore[arg-type]


def read_games(path: Path) -> list[Game]:
    """The games in one record file. Raises `GameReadError` when it cannot be read or parsed."""
    fmt = GAME_EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise GameReadError(f"not a game record extension ({', '.join(GAME_EXTENSIONS)})")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GameReadError(f"cannot read: {exc.strerror or exc}") from None
    text = decode_text(data)
    try:
        return _parse_csa(text, str(path)) if fmt == "csa" else _parse_kif(text, str(path), fmt)
    except GameReadError as exc:  # found here, with the line or move it names
        raise GameReadError(f"cannot parse as {fmt.upper()}: {exc}") from None
    except Exception as exc:  # cshogi's parsers raise ValueError, KeyError, IndexError, ParserException...
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise GameReadError(f"cannot parse as {fmt.upper()}: {type(exc).__name__}: {message}"[:200]) from None


def find_game_files(inputs: list[Path]) -> list[Path]:
    """Record files named directly, or found (recursively, sorted) under named directories."""
    found: list[Path] = []
    for item in inputs:
        if item.is_dir():
            found.extend(sorted(p for p in item.rglob("*")
                                if p.is_file() and p.suffix.lower() in GAME_EXTENSIONS))
        else:
            found.append(item)
    return found
