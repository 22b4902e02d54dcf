"""`split`: an hcpe file and its game index into train and test files, by game, with a leakage check.

Whole games go to one side, chosen by a seeded shuffle. Games share positions all the same (every game
passes through the initial position, many through the same openings), so test positions whose position
hash also occurs in train are dropped from the test file: a held-out score then measures positions the
network has not been trained on. The check at the end reads both written files back and fails if any
test position hash is still found in train.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import cshogi
import numpy as np

from tideborn.data.game_index import GameEntry, index_path, read_index, write_index
from tideborn.data.progress import Progress
from tideborn.data.records import open_records
from tideborn.errors import UserError

HASH_CHUNK = 65536


def position_hashes(records: np.ndarray, kind: str = "hcpe", progress: Progress | None = None,
                    done_before: int = 0) -> np.ndarray:
    """cshogi's Zobrist hash of each record's position (uint64)."""
    board = cshogi.Board()
    setter = board.set_hcp if kind == "hcpe" else board.set_psfen
    field = "hcp" if kind == "hcpe" else "sfen"
    hashes = np.zeros(len(records), dtype=np.uint64)
    for start in range(0, len(records), HASH_CHUNK):
        packed = np.ascontiguousarray(records[field][start:start + HASH_CHUNK])
        for i in range(len(packed)):
            setter(packed[i])
            hashes[start + i] = board.zobrist_hash()
        if progress is not None:
            progress.update(done_before + start + len(packed))
    return hashes


@dataclass
class SplitReport:
    train_games: int
    test_games: int
    train_positions: int
    test_positions: int
    dropped_shared: int
    """Test positions left out because the same position occurs in train."""
    leaked: int
    """Test positions found in train by the final check (0 unless something is wrong)."""

    def summary(self, train: Path, test: Path) -> str:
        return (f"{train}: {self.train_positions:,} positions from {self.train_games:,} games\n"
                f"{test}: {self.test_positions:,} positions from {self.test_games:,} games "
                f"({self.dropped_shared:,} positions also in train left out)\n"
                f"leakage check: {self.leaked} of {self.test_positions:,} test positions occur in train")


def _write(path: Path, records: np.ndarray) -> None:
    temp = path.with_name(path.name + ".tmp")
    records.tofile(temp)
    os.replace(temp, path)


def split_games(source: Path, train_path: Path, test_path: Path, test_fraction: float = 0.1,
                seed: int = 0, progress: bool = True) -> SplitReport:
    if not 0 < test_fraction < 1:
        raise UserError(f"--test-fraction {test_fraction}: must be between 0 and 1")
    if train_path.resolve() == test_path.resolve():
        raise UserError(f"--train and --test name the same file ({train_path})")
    for out in (train_path, test_path):
        if out.suffix.lower() != ".hcpe":
            raise UserError(f"{out}: name the outputs NAME.hcpe")
        if out.resolve() == source.resolve():
            raise UserError(f"{out}: would overwrite the input")
    records = open_records(source, "hcpe")
    games = read_index(index_path(source), len(records))
    if len(games) < 2:
        raise UserError(f"{source}: {len(games)} game(s); a split by game needs at least 2")
    order = np.random.default_rng(seed).permutation(len(games))
    test_count = min(len(games) - 1, max(1, round(test_fraction * len(games))))
    is_test = np.zeros(len(games), dtype=bool)
    is_test[order[:test_count]] = True

    bar = Progress("split: hashing positions", 2 * len(records), "positions", enabled=progress)
    hashes = position_hashes(records, progress=bar)
    game_of_record = np.repeat(np.arange(len(games)), [g.records for g in games])
    test_mask = is_test[game_of_record]
    train_hashes = np.unique(hashes[~test_mask])
    keep_test = test_mask & ~np.isin(hashes, train_hashes)
    dropped = int(test_mask.sum() - keep_test.sum())
    if not keep_test.any():
        raise UserError(f"every test position also occurs in train; nothing would be left for {test_path} "
                        f"(use more games or a larger --test-fraction)")

    train_path.parent.mkdir(parents=True, exist_ok=True)
    test_path.parent.mkdir(parents=True, exist_ok=True)
    _write(train_path, np.asarray(records[~test_mask]))
    _write(test_path, np.asarray(records[keep_test]))
    write_index(index_path(train_path), _reindex(games, ~is_test, np.ones(len(records), dtype=bool)))
    write_index(index_path(test_path), _reindex(games, is_test, keep_test))

    # The check reads back what was written rather than trusting the masks above.
    written_train = open_records(train_path, "hcpe")
    written_test = open_records(test_path, "hcpe")
    check_train = position_hashes(np.asarray(written_train), progress=bar, done_before=len(records))
    check_test = position_hashes(np.asarray(written_test))
    bar.finish()
    leaked = int(np.isin(check_test, check_train).sum())
    report = SplitReport(int((~is_test).sum()), int(is_test.sum()), len(written_train), len(written_test),
                         dropped, leaked)
    if leaked:
        raise UserError(f"leakage check failed: {leaked} positions of {test_path} also occur in {train_path}")
    return report


def _reindex(games: list[GameEntry], chosen: np.ndarray, kept_records: np.ndarray) -> list[GameEntry]:
    """Index entries of the chosen games, renumbered for the file that holds only their kept records."""
    entries, first = [], 0
    for game, take in zip(games, chosen):
        if not take:
            continue
        kept = int(kept_records[game.first_record:game.first_record + game.records].sum())
        if kept:
            entries.append(replace(game, first_record=first, records=kept))
            first += kept
    return entries
