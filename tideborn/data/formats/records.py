"""Teacher record files: the two fixed-size formats, file and glob expansion, reading records by index.

`RecordSet` reads the records a batch uses with `os.pread` (neighbours coalesced into one read): a 100 GB
teacher set costs neither RAM nor a memory map. Not a memory map, because a file truncated under a map
kills the reading process with SIGBUS (a silent death, or "DataLoader worker ... killed by signal: Bus
error"); a short `pread` is an error that names the file. Every problem with a file is a `UserError` that
names it (and the record, where one record is at fault).
"""

from __future__ import annotations

import glob
import os
import stat
import typing
from pathlib import Path

import cshogi
import numpy as np

from tideborn.errors import UserError
from tideborn.safefile import NotARegularFile, file_type, open_regular_fd

RECORD_DTYPES: dict[str, np.dtype] = {
    "hcpe": np.dtype(cshogi.HuffmanCodedPosAndEval),  # dlshogi: hcp[32], eval, bestMove16, gameResult, pad
    "psv": np.dtype(cshogi.PackedSfenValue),  # YaneuraOu: sfen[32], score, move, gamePly, game_result, pad
}
EXTENSION_KINDS = {".hcpe": "hcpe", ".bin": "psv", ".psv": "psv", ".hcpe3": "hcpe3"}
"""Every teacher file kind by its extension: the fixed-size record kinds (RECORD_DTYPES) and hcpe3 (games of
variable length, `tideborn.data.cache.hcpe3`). The one table; `sources.file_kind` reads it too."""


def kind_from_extension(path: str | os.PathLike) -> str | None:
    """`hcpe` or `psv` from the file name's extension, or None when it does not tell a record kind."""
    kind = EXTENSION_KINDS.get(Path(path).suffix.lower())
    return kind if kind in RECORD_DTYPES else None


def resolve_kind(paths: typing.Sequence[str | os.PathLike], kind: str = "auto", what: str = "--kind") -> str:
    """The record kind for `paths`: `kind` itself unless `auto`, else the one their extensions agree on."""
    if kind in RECORD_DTYPES:
        return kind
    if kind != "auto":
        raise UserError(f"{what}: unknown record kind {kind!r}; use hcpe or psv")
    found = {kind_from_extension(p) for p in paths}
    if len(found) == 1 and None not in found:
        return found.pop()
    unknown = [str(p) for p in paths if kind_from_extension(p) is None]
    if unknown:
        raise UserError(f"{unknown[0]}: cannot tell the record format from the extension "
                        f"(.hcpe for hcpe; .bin or .psv for psv); pass {what} hcpe or psv")
    raise UserError(f"files of both kinds given ({', '.join(sorted(k for k in found if k))}); "
                    f"read one kind at a time or pass {what}")


def expand_paths(patterns: typing.Sequence[str], data_root: str | os.PathLike = ".",
                 key: str = "data.train") -> list[Path]:
    """Files named by `patterns` (paths or globs; relative ones resolve against `data_root`), in order.

    A glob must match at least one file; a plain path must exist. Matches of one glob are sorted, so the
    record numbering, and with it the data order, does not depend on the directory listing.
    """
    if not patterns:
        raise UserError(f"{key}: no files given")
    files: list[Path] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if not path.is_absolute():
            path = Path(data_root) / path
        if glob.has_magic(str(path)):
            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            if not matches:
                raise UserError(f"{key}: {pattern!r} matches no files (looked for {path}){_how_to_make(key, 'them')}")
            files.extend(matches)
        else:
            if key.startswith("data.") and not path.exists():
                raise UserError(f"{key}: {path}: no such file{_how_to_make(key, 'it')}")
            files.append(path)
    return files


class ChangedWhileRead(UserError):
    """A file got shorter (or went away) while it was being read through: a problem of the moment, not of
    the file's contents (`verify` says so and exits 2 rather than reporting the file as bad)."""


def _how_to_make(key: str, what: str) -> str:
    """The usual first stumble, a glob's as a path's: the teacher files were never made. A setting's message
    says how to make them; a data tool's FILE argument gets the bare fact."""
    if not key.startswith("data."):
        return ""
    return (f"; make {what} with `tideborn data convert RECORDS --output ALL.hcpe` then `tideborn data split` "
            "(README, docs/data.md)")


COALESCE_BYTES = 1024
"""Records closer than this in a file are fetched by one `pread` with what lies between them (fewer calls
for dense batches of small files; about the best of 0, 256, 1024 and 4096 measured)."""


def open_record_file(path: Path, kind: str) -> tuple[int, os.stat_result]:
    """(descriptor, its stat) of the `kind` file `path` opened for reading (`safefile.open_regular_fd`: a FIFO
    put in its place is refused without waiting for a writer), else a `UserError` naming it. The caller closes it."""
    try:
        return open_regular_fd(path)
    except NotARegularFile as exc:
        raise UserError(f"{path}: is {file_type(exc.mode)}, not a {kind} file; name a regular file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None


def pread_full(fd: int, length: int, offset: int) -> bytes:
    """`length` bytes at `offset` in as many `pread` calls as it takes (one returns at most about 2 GiB);
    fewer only where the file ends, which the caller names (a file cut short under the reader)."""
    data = os.pread(fd, length, offset)
    while len(data) < length:
        more = os.pread(fd, length - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def readable_size(path: Path, kind: str) -> int:
    """The size of `path` in bytes, after checking it exists, is a regular file and can be read.

    The type is checked before the file is opened: opening a FIFO waits for a writer, for ever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a directory, not a {kind} file (name its files, e.g. {path / ('*.' + kind)})")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: is {file_type(mode)}, not a {kind} file; name a regular file")
    # the open checks the type again: should the path have become a FIFO since the stat, it does not wait
    fd, facts = open_record_file(path, kind)
    try:
        os.pread(fd, 1, 0)
        return facts.st_size
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def size_problem(size: int, kind: str) -> str | None:
    """Why a file of `size` bytes cannot hold `kind` records, or None."""
    itemsize = RECORD_DTYPES[kind].itemsize
    if size == 0:
        return f"is empty (0 bytes); a {kind} file holds {itemsize}-byte records"
    if size % itemsize:
        return (f"size {size} bytes is not a multiple of the {kind} record size ({itemsize} bytes): "
                f"{size // itemsize} whole records and {size % itemsize} bytes over; the file is truncated "
                f"or is not {kind}")
    return None


def check_record_file(path: Path, kind: str) -> int:
    """The number of records in `path`, after checking it is a readable, non-empty, whole-record file."""
    size = readable_size(path, kind)
    problem = size_problem(size, kind)
    if problem:
        raise UserError(f"{path}: {problem}")
    return size // RECORD_DTYPES[kind].itemsize


def records_fingerprint(path: Path, samples: int = 64) -> str:
    """A short digest of `path`'s size and of `samples` evenly spaced 64-byte pieces of it (first and last
    included): which version of a record file a game index was written for, in a few reads of any size."""
    import hashlib

    digest = hashlib.blake2b(digest_size=12)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        size = os.fstat(fd).st_size
        digest.update(size.to_bytes(8, "little"))
        piece = 64
        last = max(0, size - piece)
        for i in range(samples):
            digest.update(os.pread(fd, piece, last * i // max(1, samples - 1)))
    finally:
        os.close(fd)
    return digest.hexdigest()


def stream_records(path: Path, kind: str, count: int, chunk: int) -> typing.Iterator[tuple[int, np.ndarray]]:
    """(first index, records) of the `count` records of `path`, `chunk` at a time, read by `pread` in order.

    Not a memory map (a file truncated under one kills the process with SIGBUS): a file that gets shorter
    while it is read is a `UserError` naming it; one opened as something else than a regular file (a FIFO
    put in its place) is refused without waiting for a writer."""
    itemsize = RECORD_DTYPES[kind].itemsize
    fd, _ = open_record_file(path, kind)
    try:
        for start in range(0, count, chunk):
            want = (min(count, start + chunk) - start) * itemsize
            data = pread_full(fd, want, start * itemsize)
            if len(data) < want:
                raise ChangedWhileRead(f"{path}: changed while it was read: {os.fstat(fd).st_size:,} bytes now, "
                                       f"{count * itemsize:,} ({count:,} records) when reading began; was it "
                                       f"truncated or rewritten? Nothing was concluded about it")
            yield start, np.frombuffer(data, dtype=RECORD_DTYPES[kind])
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class RecordSet:
    """Files of one kind seen as one sequence: record `i` of the set is record `i - offsets[f]` of file `f`.

    Pickles without its open files (workers reopen them), so handing it to worker processes copies only
    the file list. A file that changes under it (truncated, rewritten in place, or replaced) is a
    `UserError` naming the file, at the next read that touches it, never a crash.
    """

    def __init__(self, paths: typing.Sequence[Path], kind: str):
        self.paths = [Path(p) for p in paths]
        self.kind = kind
        self.dtype = RECORD_DTYPES[kind]
        counts = [check_record_file(path, kind) for path in self.paths]
        self.counts = np.asarray(counts, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.identities = [_identity(os.stat(path)) for path in self.paths]
        """(device, inode) of each file when the set was made: a file replaced since then is refused."""
        self._fds: list[int | None] = [None] * len(self.paths)
        self._fd_pid = os.getpid()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fds"] = [None] * len(self.paths)
        return state

    def _fd(self, file_index: int) -> int:
        fd = self._fds[file_index]
        if fd is None:
            path = self.paths[file_index]
            replaced = UserError(f"{path}: was replaced by another file since the run started; training reads "
                                 f"the records it counted then, so put the original back or restart the run")
            try:
                fd, facts = open_regular_fd(path)
            except NotARegularFile:
                raise replaced from None
            except OSError as exc:
                raise UserError(f"{path}: cannot read any more ({exc.strerror or exc}); was it removed "
                                f"while training read it?") from None
            if _identity(facts) != self.identities[file_index]:
                os.close(fd)
                raise replaced
            self._fds[file_index] = fd
        return fd

    def _changed(self, file_index: int, fd: int) -> UserError:
        path = self.paths[file_index]
        expected = int(self.counts[file_index]) * self.dtype.itemsize
        size = os.fstat(fd).st_size
        return UserError(f"{path}: changed while training read it: {size:,} bytes now, {expected:,} "
                         f"({int(self.counts[file_index]):,} records) when the run started; was it truncated, "
                         f"appended to or rewritten in place? Put the original file back and resume")

    def _read_file(self, file_index: int, local: np.ndarray) -> np.ndarray:
        """Records `local` (indices within file `file_index`), in that order, by `pread`: records whose gap
        is under COALESCE_BYTES come in one read, the rest one read each."""
        fd = self._fd(file_index)
        itemsize = self.dtype.itemsize
        if os.fstat(fd).st_size != int(self.counts[file_index]) * itemsize:
            raise self._changed(file_index, fd)
        wanted, inverse = np.unique(local, return_inverse=True)
        breaks = np.flatnonzero(np.diff(wanted) > max(1, COALESCE_BYTES // itemsize)) + 1
        starts = np.concatenate([[0], breaks])
        first = wanted[starts]
        last = wanted[np.concatenate([breaks - 1, [len(wanted) - 1]])]
        lengths = (last - first + 1) * itemsize
        pread = os.pread
        data = b"".join([pread(fd, length, offset) for length, offset in
                         zip(lengths.tolist(), (first * itemsize).tolist())])
        if len(data) != int(lengths.sum()):
            raise self._changed(file_index, fd)
        # Where each wanted record lies in `data`: its span's start there, plus its place in the span.
        span_base = np.concatenate([[0], np.cumsum(last - first + 1)[:-1]])
        span_of = np.repeat(np.arange(len(starts)), np.diff(np.concatenate([starts, [len(wanted)]])))
        rows = span_base[span_of] + wanted - first[span_of]
        return np.frombuffer(data, dtype=self.dtype)[rows][inverse.reshape(-1)]

    def read(self, indices: np.ndarray) -> np.ndarray:
        """The records at global `indices`, in that order (a copy)."""
        indices = np.asarray(indices, dtype=np.int64)
        if self._fd_pid != os.getpid():
            # A forked worker shares the parent's descriptors; its own keep their offsets and lifetimes apart.
            self._fds, self._fd_pid = [None] * len(self.paths), os.getpid()
        if len(indices) == 0:
            return np.empty(0, dtype=self.dtype)
        if len(self.paths) == 1:
            return self._read_file(0, indices)
        file_ids = np.searchsorted(self.offsets, indices, side="right") - 1
        out = np.empty(len(indices), dtype=self.dtype)
        for file_index in np.unique(file_ids):
            chosen = file_ids == file_index
            out[chosen] = self._read_file(int(file_index), indices[chosen] - self.offsets[file_index])
        return out

    def locate(self, index: int) -> tuple[Path, int]:
        """(file, record index within that file) of global record `index`."""
        file_index = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return self.paths[file_index], int(index - self.offsets[file_index])

    def describe(self, index: int) -> str:
        path, local = self.locate(index)
        return f"{path}: record {local}"

    def close(self) -> None:
        fds, self._fds = self._fds, [None] * len(self.paths)
        if self._fd_pid == os.getpid():
            for fd in fds:
                if fd is not None:
                    os.close(fd)


def _identity(facts: os.stat_result) -> tuple[int, int]:
    return facts.st_dev, facts.st_ino

