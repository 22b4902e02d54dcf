"""Helpers for the teacher-data tests (no tests here): real positions from cshogi, files in tmp_path.

Positions come from seeded random games played with cshogi's move generator, so every record is a legal
position with a legal move, written the way dlshogi and YaneuraOu write them (`to_hcp`, `to_psfen`).
"""

from __future__ import annotations

import random
from pathlib import Path

import cshogi
import numpy as np

from tideborn.config.load import load_settings

SAMPLE_GAMES = Path(__file__).resolve().parents[2] / "samples" / "games"
"""Real game records that ship with the project (66 WCSC28 engine games; samples/games/wcsc28/README.md)."""
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
"""More real game records, in a development setup with `../shared` beside the repository root (optional)."""
HCPE = np.dtype(cshogi.HuffmanCodedPosAndEval)
PSV = np.dtype(cshogi.PackedSfenValue)


def random_positions(count: int, seed: int = 0, max_plies: int = 60) -> list[tuple[str, int]]:
    """`count` (sfen, legal move) pairs from seeded random games."""
    rng = random.Random(seed)
    board = cshogi.Board()
    found: list[tuple[str, int]] = []
    while len(found) < count:
        board.reset()
        for _ in range(rng.randint(1, max_plies)):
            moves = list(board.legal_moves)
            if not moves or board.is_draw() or len(found) >= count:
                break
            move = rng.choice(moves)
            found.append((board.sfen(), move))
            board.push(move)
    return found


def hcpe_records(positions: list[tuple[str, int]], seed: int = 0) -> np.ndarray:
    """hcpe records of `positions` with seeded results and evals."""
    rng = np.random.default_rng(seed)
    records = np.zeros(len(positions), dtype=HCPE)
    board = cshogi.Board()
    for i, (sfen, move) in enumerate(positions):
        board.set_sfen(sfen)
        board.to_hcp(records["hcp"][i])
        records["bestMove16"][i] = np.uint16(cshogi.move16(move)).view(np.int16)
    records["eval"] = rng.integers(-3000, 3000, len(positions))
    records["gameResult"] = rng.choice([cshogi.DRAW, cshogi.BLACK_WIN, cshogi.WHITE_WIN], len(positions))
    return records


def psv_records(positions: list[tuple[str, int]], seed: int = 0) -> np.ndarray:
    """PackedSfenValue records of `positions` (YaneuraOu's move encoding) with seeded results and scores."""
    rng = np.random.default_rng(seed)
    records = np.zeros(len(positions), dtype=PSV)
    board = cshogi.Board()
    for i, (sfen, move) in enumerate(positions):
        board.set_sfen(sfen)
        board.to_psfen(records["sfen"][i])
        records["move"][i] = cshogi.move16_to_psv(cshogi.move16(move))
        records["gamePly"][i] = board.move_number
    records["score"] = rng.integers(-3000, 3000, len(positions))
    records["game_result"] = rng.choice([-1, 0, 1], len(positions))
    return records


def write_records(path: Path, records: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    records.tofile(path)
    return path


def settings_for(tmp_path: Path, *sets: str, train: list[str] | None = None, test: list[str] | None = None):
    """Resolved settings with no project file; `data.train` / `data.test` as given, relative to tmp_path."""
    overrides = [f"paths.data_root={str(tmp_path)!r}", "data.workers=0", "optim.batch_size=16",
                 "run.network=\"resnet2x32\""]
    if train is not None:
        overrides.append(f"data.train={train!r}".replace("'", '"'))
    if test is not None:
        overrides.append(f"data.test={test!r}".replace("'", '"'))
    return load_settings(None, [*overrides, *sets], environ={}, cwd=tmp_path).settings


def random_csa_games(directory: Path, games: int, seed: int = 0) -> None:
    """Random legal games, each in its own CSA file, ended by resignation."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for number in range(games):
        board = cshogi.Board()
        lines = ["V2.2", f"N+black{number}", f"N-white{number}", "PI", "+"]
        for _ in range(rng.randint(20, 60)):
            moves = list(board.legal_moves)
            if not moves:
                break
            move = rng.choice(moves)
            lines.append(("+" if board.turn == cshogi.BLACK else "-") + cshogi.move_to_csa(move))
            board.push(move)
        lines.append("%TORYO")
        (directory / f"game{number:03d}.csa").write_text("\n".join(lines) + "\n", encoding="utf-8")
