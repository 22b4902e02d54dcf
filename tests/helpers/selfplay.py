"""A stand-in for self-play engines, run as its own process: writes hcpe3 games (the shipped games, with visit
counts; `tests.helpers.hcpe3`) into a directory while a trainer watches it, every other file by rename and the
others by slow appending (a game at a time, each game in two writes, so a scan can meet a game cut short).

    python -m tests.helpers.selfplay DIR --files 6 --games 2 --pause 0.5 [--after RUN_DIR/events.jsonl]

Prints one line per file when it is complete. Files are named game-NNN.hcpe3; staging files go in DIR/../staging.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tests.helpers.hcpe3 import sample_games, write_hcpe3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--games", type=int, default=2, help="games per file")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between files, and between appends")
    parser.add_argument("--after", type=Path, help="begin once this events.jsonl has a data_window event (the "
                                                   "trainer watches, and waits)")
    args = parser.parse_args(argv)
    games = sample_games()
    deadline = time.monotonic() + 120
    while args.after is not None and not _said(args.after, b'"data_window"') and time.monotonic() < deadline:
        time.sleep(0.05)
    staging = args.folder.parent / "staging"
    staging.mkdir(exist_ok=True)
    for i in range(args.files):
        name = f"game-{i:03d}.hcpe3"
        chosen = [games[(i * args.games + g) % len(games)] for g in range(args.games)]
        if i % 2 == 0:  # by rename: written whole elsewhere, then moved in at once
            write_hcpe3(staging / name, chosen, seed=i)
            os.rename(staging / name, args.folder / name)
        else:  # by slow appending, in place: a scan sees it grow, and may see a game cut short
            pieces = []
            for g, game in enumerate(chosen):
                write_hcpe3(staging / f"{name}.{g}", [game], seed=i * 100 + g)
                pieces.append((staging / f"{name}.{g}").read_bytes())
            with open(args.folder / name, "ab") as handle:
                for piece in pieces:
                    half = len(piece) // 2
                    for part in (piece[:half], piece[half:]):
                        handle.write(part)
                        handle.flush()
                        time.sleep(args.pause / 2)
        print(f"wrote {name}", flush=True)
        time.sleep(args.pause)
    return 0


def _said(events: Path, what: bytes) -> bool:
    try:
        return what in events.read_bytes()
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
