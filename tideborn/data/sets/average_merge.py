"""The merged set of `data.use_average` built in bounded memory: an external sort/merge by position key.

The input positions arrive in pieces (`average`); every CHUNK_POSITIONS of them are merged among themselves
(duplicates within the chunk summed) and kept, sorted by key, as a run: on disk, a scratch file beside the
cache (`safefile.create_scratch_file`), or in memory where no cache can be written. The runs are then merged
a block at a time: each run lends its next few positions, everything up to the smallest last key lent is
merged (no later position of any run can have such a key), and the merged positions are spooled to scratch
files, one per array, that `hcpe3.write_arrays` copies into the cache. Memory is bounded by the chunk and the
block whatever the number of inputs or of distinct positions; the scratch files are removed when the build
ends however it ends (a SIGKILL leaves them to the next build, which removes those of processes gone).

Sums are taken in the same order on disk and in memory (the same chunks, the same merge), so both give the
very same bytes. The merged positions come out in key order (the packed position's bytes).
"""

from __future__ import annotations

import errno
import os
import typing
import zlib
from pathlib import Path

import numpy as np

from tideborn.data.decode.features import POLICY_CLASSES
from tideborn.errors import UserError
from tideborn.safefile import create_scratch_file, os_error_text, remove_stale_scratch

CHUNK_POSITIONS = 1 << 20
"""Input positions merged in memory at a time (a run), and positions lent by all runs together to one merge
block: about 400 MB at six policy entries a position (sorting included)."""
KEY = np.dtype((np.void, 32))
POSITION = np.dtype([("key", KEY), ("result", "<f8"), ("winprob", "<f8"), ("count", "<i8"), ("entries", "<i8")])
"""A run's positions: the packed position, the sums of its duplicates' results, win probabilities and
count, and how many policy entries follow it in the run's entries."""
ENTRY = np.dtype([("label", "<u2"), ("move16", "<u2"), ("prob", "<f8"), ("first", "<i8")])
"""A run's policy entries, by position and label: the summed probability, and the move16 of the entry seen
first in input order (`first`: its index among all input entries)."""
OUTPUT_DTYPES = {"hcp": (np.uint8, 32), "result": (np.float32, 0), "winprob": (np.float32, 0),
                 "count": (np.int32, 0), "label": (np.uint16, 0), "move16": (np.uint16, 0),
                 "cand_offsets": (np.int64, 0), "cand_label": (np.uint16, 0), "cand_prob": (np.float32, 0)}
COPY_BYTES = 8 << 20


def _concatenate(pieces: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """`np.concatenate` of contiguous arrays of a structured `dtype`, as bytes: numpy copies a structured array
    field by field, element by element (0.5 s for a chunk), and its bytes in one copy (a twentieth of that)."""
    if not pieces:
        return np.zeros(0, dtype)
    return np.concatenate([np.ascontiguousarray(piece).view(np.uint8) for piece in pieces]).view(dtype)


def _key_groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, group of each key) grouping equal 32-byte keys, groups numbered in the keys' byte order: a
    sort of four big-endian 64-bit columns (`np.lexsort`), about twice as fast as numpy's sort of 32-byte
    voids, which compares them one by one."""
    columns = np.ascontiguousarray(keys).view(">u8").reshape(-1, 4)
    order = np.lexsort((columns[:, 3], columns[:, 2], columns[:, 1], columns[:, 0]))
    ordered = columns[order]
    starts = np.concatenate([[True], (ordered[1:] != ordered[:-1]).any(axis=1)]) if len(order) else \
        np.zeros(0, bool)
    group = np.empty(len(order), np.int64)
    group[order] = np.cumsum(starts) - 1
    return order[starts], group


def _entry_order(combined: np.ndarray) -> np.ndarray:
    """The entries in (combined, first) order. Entries come in `first` order wherever two share `combined`:
    a chunk's in input order, and a merge block's run after run (a run's chunk precedes the next's, and
    within a run each position and label is there once). So their place breaks the ties: one sort of a single
    64-bit key where both fit (they do for any chunk this module makes), else a stable sort."""
    if not len(combined):
        return np.zeros(0, np.int64)
    bits = max(1, int(len(combined) - 1).bit_length())
    if int(combined.max()) < 1 << (62 - bits):
        return np.argsort((combined << bits) | np.arange(len(combined)))
    return np.argsort(combined, kind="stable")


def combine(positions: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge `positions` (POSITION, any order) and their `entries` (ENTRY, each position's in turn): one
    position per key, in key order, with the sums of its duplicates, and one entry per (position, label)."""
    firsts, inverse = _key_groups(positions["key"])
    groups = len(firsts)
    out = np.zeros(groups, POSITION)
    out["key"] = positions["key"][firsts]
    out["result"] = np.bincount(inverse, positions["result"], groups)
    out["winprob"] = np.bincount(inverse, positions["winprob"], groups)
    out["count"] = np.bincount(inverse, positions["count"], groups).astype(np.int64)
    owner = inverse[np.repeat(np.arange(len(positions)), positions["entries"])]
    combined = owner * POLICY_CLASSES + entries["label"].astype(np.int64)
    order = _entry_order(combined)
    ordered = combined[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]])) if len(ordered) else \
        np.zeros(0, np.int64)
    merged = np.zeros(len(starts), ENTRY)
    if len(starts):
        first = order[starts]
        merged["label"] = ordered[starts] % POLICY_CLASSES
        merged["move16"] = entries["move16"][first]
        merged["first"] = entries["first"][first]
        merged["prob"] = np.add.reduceat(entries["prob"][order], starts)
    out["entries"] = np.bincount(ordered[starts] // POLICY_CLASSES, minlength=groups)
    return out, merged


class ScratchUnwritable(UserError):
    """The scratch files cannot be written (a read-only directory, a full disk): the build goes on in memory."""


class Scratch:
    """The scratch files of one build, beside the cache `beside` (None: everything in memory); closed and
    removed by `close`, which the builder calls however the build ends."""

    def __init__(self, beside: Path | None):
        self.beside = beside
        self.files: list[tuple[int, Path]] = []
        if beside is not None:
            remove_stale_scratch(beside)

    def new(self) -> int | None:
        if self.beside is None:
            return None
        try:
            fd, path = create_scratch_file(self.beside, len(self.files))
        except OSError as exc:
            raise self.error(exc) from None
        self.files.append((fd, path))
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        try:
            while len(view):
                view = view[os.write(fd, view):]
        except OSError as exc:
            raise self.error(exc) from None

    def error(self, exc: OSError) -> UserError:
        where = self.beside.parent if self.beside is not None else "memory"
        return ScratchUnwritable(f"cannot write scratch files in {where}: {os_error_text(exc) if exc.errno else exc}")

    def close(self) -> None:
        files, self.files = self.files, []
        for fd, path in files:
            try:
                os.close(fd)
            finally:
                path.unlink(missing_ok=True)


def _read(fd: int, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    want = count * dtype.itemsize
    data = os.pread(fd, want, offset)
    while len(data) < want:  # a short read of a regular file: go on until the end
        more = os.pread(fd, want - len(data), offset + len(data))
        if not more:
            raise OSError(errno.EIO, f"a scratch file ends at byte {offset + len(data)}, {want} bytes expected")
        data += more
    return np.frombuffer(data, dtype)


class _Run:
    """One sorted run: its positions and entries in memory, or in a scratch file (positions, then entries)."""

    def __init__(self, scratch: Scratch, positions: np.ndarray, entries: np.ndarray):
        self.size, self.entry_count = len(positions), len(entries)
        self.fd = scratch.new()
        if self.fd is None:
            self.positions, self.entries = positions, entries
        else:
            scratch.write(self.fd, positions.tobytes())
            scratch.write(self.fd, entries.tobytes())
        self.next_position = self.next_entry = 0

    def lend(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` positions (fewer at the end) and their entries."""
        count = min(count, self.size - self.next_position)
        if self.fd is None:
            positions = self.positions[self.next_position:self.next_position + count]
        else:
            positions = _read(self.fd, POSITION, self.next_position * POSITION.itemsize, count)
        entry_count = int(positions["entries"].sum())
        if self.fd is None:
            entries = self.entries[self.next_entry:self.next_entry + entry_count]
        else:
            entries = _read(self.fd, ENTRY, self.size * POSITION.itemsize + self.next_entry * ENTRY.itemsize,
                            entry_count)
        self.next_position += count
        self.next_entry += entry_count
        return positions, entries


class SpooledArray:
    """An output array written piece by piece to a scratch file (or kept in memory), with its CRC-32: what
    `hcpe3.write_arrays` copies into a cache."""

    def __init__(self, scratch: Scratch, dtype: typing.Any, width: int):
        self.scratch, self.dtype, self.width = scratch, np.dtype(dtype), width
        self.rows, self.crc = 0, 0
        self.fd = scratch.new()
        self.pieces: list[np.ndarray] = []

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows, self.width) if self.width else (self.rows,)

    @property
    def nbytes(self) -> int:
        return self.rows * max(1, self.width) * self.dtype.itemsize

    @property
    def checksum(self) -> str:
        return f"{self.crc:08x}"

    def append(self, piece: np.ndarray) -> None:
        piece = np.ascontiguousarray(piece, dtype=self.dtype)
        self.rows += len(piece)
        self.crc = zlib.crc32(memoryview(piece).cast("B"), self.crc)
        if self.fd is None:
            self.pieces.append(piece)
        else:
            self.scratch.write(self.fd, memoryview(piece).cast("B"))

    def write_into(self, handle: typing.BinaryIO) -> None:
        if self.fd is None:
            for piece in self.pieces:
                handle.write(piece.tobytes())
            return
        for offset in range(0, self.nbytes, COPY_BYTES):
            handle.write(os.pread(self.fd, min(COPY_BYTES, self.nbytes - offset), offset))

    def array(self) -> np.ndarray:
        """The whole array in memory (the in-memory build)."""
        if self.fd is not None:
            return _read(self.fd, self.dtype, 0, self.rows * max(1, self.width)).reshape(self.shape).copy()
        if not self.pieces:
            return np.zeros(self.shape, self.dtype)
        return np.concatenate(self.pieces).reshape(self.shape)


class ExternalMerge:
    """Collects input positions (`add`), then merges them (`finish`) into SpooledArrays of the merged set."""

    def __init__(self, scratch: Scratch, chunk_positions: int | None = None):
        self.scratch = scratch
        self.chunk = max(1, chunk_positions or CHUNK_POSITIONS)
        self.runs: list[_Run] = []
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending_count = 0
        self.entries_seen = 0

    def add(self, hcp: np.ndarray, result: np.ndarray, winprob: np.ndarray, entry_pos: np.ndarray,
            entry_label: np.ndarray, entry_move16: np.ndarray, entry_prob: np.ndarray) -> None:
        """Input positions and their policy entries (`entry_pos`: the entry's position among these, in
        increasing order)."""
        n = len(hcp)
        positions = np.zeros(n, POSITION)
        positions["key"] = np.ascontiguousarray(hcp, dtype=np.uint8).reshape(-1, 32).view(KEY).reshape(-1)
        positions["result"], positions["winprob"], positions["count"] = result, winprob, 1
        entry_pos = np.asarray(entry_pos, dtype=np.int64)
        positions["entries"] = np.bincount(entry_pos, minlength=n)
        entries = np.zeros(len(entry_pos), ENTRY)
        order = np.argsort(entry_pos, kind="stable")  # each position's entries in turn, as given
        entries["label"] = np.asarray(entry_label)[order]
        entries["move16"] = np.asarray(entry_move16)[order]
        entries["prob"] = np.asarray(entry_prob)[order]
        entries["first"] = self.entries_seen + order
        self.entries_seen += len(entries)
        start = 0
        while start < n:  # split at the chunk's bound
            take = min(n - start, self.chunk - self.pending_count)
            lo, hi = int(positions["entries"][:start].sum()), int(positions["entries"][:start + take].sum())
            self.pending.append((positions[start:start + take], entries[lo:hi]))
            self.pending_count += take
            start += take
            if self.pending_count >= self.chunk:
                self._spill()

    def _spill(self) -> None:
        if not self.pending:
            return
        positions = _concatenate([p for p, _ in self.pending], POSITION)
        entries = _concatenate([e for _, e in self.pending], ENTRY)
        self.pending, self.pending_count = [], 0
        self.runs.append(_Run(self.scratch, *combine(positions, entries)))

    def finish(self) -> dict[str, SpooledArray]:
        """The merged set's arrays (see `average.build_average`), merged from the runs a block at a time."""
        self._spill()
        out = {name: SpooledArray(self.scratch, dtype, width) for name, (dtype, width) in OUTPUT_DTYPES.items()}
        out["cand_offsets"].append(np.zeros(1, np.int64))
        block = max(1, self.chunk // max(1, len(self.runs)))
        lent: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(self.runs)
        candidates = 0
        while True:
            for k, run in enumerate(self.runs):
                if (lent[k] is None or not len(lent[k][0])) and run.next_position < run.size:
                    lent[k] = run.lend(block)
            active = [k for k in range(len(self.runs)) if lent[k] is not None and len(lent[k][0])]
            if not active:
                break
            # no run holds, beyond what it lent, a key at or below the smallest of the last keys lent
            bound = np.sort(np.array([lent[k][0]["key"][-1] for k in active], dtype=KEY))[:1]
            taken_positions, taken_entries = [], []
            for k in active:
                positions, entries = lent[k]
                n = int(np.searchsorted(positions["key"], bound, side="right")[0])
                e = int(positions["entries"][:n].sum())
                taken_positions.append(positions[:n])
                taken_entries.append(entries[:e])
                lent[k] = (positions[n:], entries[e:])
            if len(active) == 1:  # one run's positions: merged already (combine would give the same bytes)
                merged, merged_entries = taken_positions[0], taken_entries[0]
            else:
                merged, merged_entries = combine(_concatenate(taken_positions, POSITION),
                                                 _concatenate(taken_entries, ENTRY))
            candidates = self._emit(out, merged, merged_entries, candidates)
        return out

    @staticmethod
    def _emit(out: dict[str, SpooledArray], merged: np.ndarray, entries: np.ndarray, before: int) -> int:
        count = merged["count"].astype(np.float64)
        group = np.repeat(np.arange(len(merged)), merged["entries"])
        prob = entries["prob"] / count[group]
        offsets = np.concatenate([[0], np.cumsum(merged["entries"])]).astype(np.int64)
        # the most likely move (first of equals by label): the top-1 reference and the move the decoder checks
        top = np.lexsort((-prob, group))[offsets[:-1]]
        out["hcp"].append(np.ascontiguousarray(merged["key"]).view(np.uint8).reshape(-1, 32))
        out["result"].append(merged["result"] / count)
        out["winprob"].append(merged["winprob"] / count)
        out["count"].append(merged["count"])
        out["label"].append(entries["label"][top])
        out["move16"].append(entries["move16"][top])
        out["cand_offsets"].append(before + offsets[1:])
        out["cand_label"].append(entries["label"])
        out["cand_prob"].append(prob)
        return before + len(entries)
