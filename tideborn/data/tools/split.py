"""`split`: an hcpe file and its game index into train and test files, by game, with a leakage check.

Whole games go to one side, chosen by a seeded shuffle. Games share positions all the same (every game
passes through the initial position, many through the same openings), so test positions whose position
hash also occurs in train are dropped from the test file: a held-out score then measures positions the
network has not been trained on. The check at the end reads both written files back and fails if any
test position hash is still found in train.

The four outputs (train, test and their game indexes) are written to hidden temp files, checked, and only
then renamed into place together, Ctrl-C held back during the renames: an error, a full disk or Ctrl-C
leaves the old pair (if any) as it was and no temp file. Both indexes carry one split id and a
fingerprint of their file, so even a SIGKILL between two renames leaves a pair the trainer and `verify`
recognise as mixed and refuse.
"""

from __future__ import annotations

import os
import typing
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import cshogi
import numpy as np

from tideborn.data.formats.game_index import GameEntry, IndexHeader, index_mismatch, index_path, read_index, write_index
from tideborn.data.formats.records import check_record_file, records_fingerprint, stream_records
from tideborn.data.tools.progress import CountProgress
from tideborn.errors import UserError
from tideborn.outputs import StagedOutputs, same_output

HASH_CHUNK = 65536
READ_CHUNK = 65536
"""Records per `pread` of the input and of the written files: they are streamed, never memory-mapped (a file
truncated under a map kills the process with SIGBUS; a short read is one line naming the file)."""
WRITE_CHUNK = 1 << 20
"""Records per write call: a plain `write` reports a full disk as ENOSPC (numpy's `tofile` does not)."""


def position_hashes(records: np.ndarray, kind: str = "hcpe", progress: CountProgress | None = None,
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


def write_records(handle: typing.BinaryIO, records: np.ndarray) -> None:
    for start in range(0, len(records), WRITE_CHUNK):
        handle.write(np.ascontiguousarray(records[start:start + WRITE_CHUNK]).data)


def check_split_paths(source: Path, train_path: Path, test_path: Path) -> None:
    """Refuse outputs that are one file (or share a game index), or that would overwrite the input."""
    if same_output(train_path, test_path) or same_output(index_path(train_path), index_path(test_path)):
        raise UserError(f"--train {train_path} and --test {test_path} name the same file (or the same game "
                        f"index, {index_path(test_path).name}); name two different files")
    for flag, out in (("--train", train_path), ("--test", test_path)):
        if out.suffix.lower() != ".hcpe":
            raise UserError(f"{flag} {out}: name the outputs NAME.hcpe")
        if same_output(out, source) or same_output(index_path(out), index_path(source)):
            raise UserError(f"{flag} {out}: would overwrite the input {source}")


def split_games(source: Path, train_path: Path, test_path: Path, test_fraction: float = 0.1,
                seed: int = 0, progress: bool = True) -> SplitReport:
    if not 0 < test_fraction < 1:
        raise UserError(f"--test-fraction {test_fraction}: must be between 0 and 1")
    check_split_paths(source, train_path, test_path)
    with StagedOutputs() as outputs:
        for flag, out in (("--train", train_path), ("--test", test_path)):
            outputs.prepare(out, flag)
            outputs.prepare(index_path(out), flag)
        count = check_record_file(source, "hcpe")
        if (problem := index_mismatch(source)) is not None:
            raise UserError(problem)
        games = read_index(index_path(source), count)
        if len(games) < 2:
            raise UserError(f"{source}: {len(games)} game(s); a split by game needs at least 2")
        order = np.random.default_rng(seed).permutation(len(games))
        test_count = min(len(games) - 1, max(1, round(test_fraction * len(games))))
        is_test = np.zeros(len(games), dtype=bool)
        is_test[order[:test_count]] = True

        bar = CountProgress("split: hashing positions", 2 * count, "positions", enabled=progress)
        hashes = np.empty(count, dtype=np.uint64)
        for start, chunk in stream_records(source, "hcpe", count, READ_CHUNK):
            hashes[start:start + len(chunk)] = position_hashes(chunk)
            bar.update(start + len(chunk))
        game_of_record = np.repeat(np.arange(len(games)), [g.records for g in games])
        test_mask = is_test[game_of_record]
        train_hashes = np.unique(hashes[~test_mask])
        keep_test = test_mask & ~np.isin(hashes, train_hashes)
        dropped = int(test_mask.sum() - keep_test.sum())
        if not keep_test.any():
            raise UserError(f"every test position also occurs in train; nothing would be left for {test_path} "
                            f"(use more games or a larger --test-fraction)")

        def copy_chosen(handle: typing.BinaryIO, chosen: np.ndarray) -> None:
            # Read again, chunk by chunk, rather than held from the hashing pass: memory stays the hashes and
            # masks, not the records. A source cut since is a short read, refused like one in the first pass.
            for start, chunk in stream_records(source, "hcpe", count, READ_CHUNK):
                write_records(handle, chunk[chosen[start:start + len(chunk)]])

        train_temp = outputs.write(train_path, lambda handle: copy_chosen(handle, ~test_mask))
        test_temp = outputs.write(test_path, lambda handle: copy_chosen(handle, keep_test))

        # The check reads back what was written rather than trusting the masks above, before publishing.
        train_written, test_written = int((~test_mask).sum()), int(keep_test.sum())
        check_train = np.empty(train_written, dtype=np.uint64)
        for start, chunk in stream_records(train_temp, "hcpe", train_written, READ_CHUNK):
            check_train[start:start + len(chunk)] = position_hashes(chunk)
            bar.update(count + start + len(chunk))
        check_test = np.empty(test_written, dtype=np.uint64)
        for start, chunk in stream_records(test_temp, "hcpe", test_written, READ_CHUNK):
            check_test[start:start + len(chunk)] = position_hashes(chunk)
        bar.finish()
        leaked = int(np.isin(check_test, check_train).sum())
        report = SplitReport(int((~is_test).sum()), int(is_test.sum()), train_written, test_written,
                             dropped, leaked)
        if leaked:
            raise UserError(f"leakage check failed: {leaked} positions of {test_path} also occur in {train_path}; "
                            f"nothing was written")

        split_id = uuid.uuid4().hex
        for role, path, temp, partner, entries in (
                ("train", train_path, train_temp, test_path, _reindex(games, ~is_test, np.ones(count, bool))),
                ("test", test_path, test_temp, train_path, _reindex(games, is_test, keep_test))):
            header = IndexHeader(sum(e.records for e in entries), records_fingerprint(temp), split_id, role,
                                 os.path.relpath(partner.resolve(), path.resolve().parent))
            outputs.write(index_path(path), lambda handle, e=entries, h=header: write_index(handle, e, h))
        # The hcpe files first, the indexes last: until both indexes are in place, an index does not match
        # its file's fingerprint, so a crash between the renames leaves a pair that is refused, not used.
        outputs.publish()
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
