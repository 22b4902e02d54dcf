"""Regenerate tideborn/match/openings.sfen from the WCSC28 game records (run from the repository root).

    python scripts/make_openings.py ../shared/data/games/HiraokaTakuya+apery/utils/make_wcsc28_book/kifu

Each game contributes the positions after 8, 12 and 16 plies (fewer if it is shorter); duplicates are
dropped (many games share a book line), the rest kept in file-name order so the file is reproducible.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cshogi
from cshogi import CSA

PLIES = (8, 12, 16)
HEADER = """\
# Default openings for `tideborn match`: {count} distinct positions (SFEN, one a line) after 8, 12 and 16
# plies of the {games} games of the 28th World Computer Shogi Championship (WCSC28, 2018).
# Game records: Computer Shogi Association (CSA), which allows their free use with attribution; taken
# from the CSA files in github.com/HiraokaTakuya/apery (utils/make_wcsc28_book/kifu, GPL-3.0).
# Regenerate with scripts/make_openings.py.
"""


def main(kifu_dir: str) -> int:
    files = sorted(Path(kifu_dir).glob("*.csa"))
    seen: set[str] = set()
    lines: list[str] = []
    board = cshogi.Board()
    for path in files:
        for game in CSA.Parser.parse_str(path.read_text(encoding="utf-8-sig")):
            board.set_sfen(game.sfen)
            for ply, move in enumerate(game.moves, start=1):
                board.push(move)
                if ply in PLIES:
                    # The move number is the game's, not 1: drop it so the same position dedups.
                    position = " ".join(board.sfen().split()[:3])
                    if position not in seen:
                        seen.add(position)
                        lines.append(f"{position} {ply + 1}")
                if ply >= max(PLIES):
                    break
    out = Path(__file__).resolve().parents[1] / "tideborn" / "match" / "openings.sfen"
    out.write_text(HEADER.format(count=len(lines), games=len(files)) + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(lines)} positions from {len(files)} games")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
