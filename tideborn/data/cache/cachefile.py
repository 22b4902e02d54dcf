"""Decoded-data cache files (hcpe3 positions, averaged positions), read with `os.pread`, never memory-mapped.

A cache file is a 4096-byte JSON header (format, version, its arrays' offsets, dtypes and shapes, the
total size) followed by flat arrays (`hcpe3.write_arrays` writes them). `open_cache` checks the file before
anything of it is used, and `CacheArray` reads the rows a batch needs by `pread`, near ones coalesced as
`records.RecordSet` does. Not a memory map, for the reason teacher files are not mapped: a file truncated
under a map kills the reading process with SIGBUS (a silent death, or "DataLoader worker ... killed by
signal: Bus error"); a short `pread` is a `UserError` naming the cache and what it was built from.

A cache sits in a data directory that other people may share, so one is used only when it is a regular
file reached without a symbolic link (O_NOFOLLOW), opened without waiting (O_NONBLOCK: a FIFO in its place
must not hang the run), owned by the user or by the owner of what it was built from, writable by nobody
else, and its header describes arrays that lie within the file with plain numeric dtypes. Anything else
is `HostileCache` (the caller decodes in memory and warns once, leaving the entry alone) or None (stale or
damaged: rebuilt).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import typing
import zlib
from pathlib import Path

import numpy as np

from tideborn.data.formats.records import pread_full
from tideborn.errors import UserError
from tideborn.safefile import NotARegularFile, link_target, open_regular_fd, trust_problem

HEADER_BYTES = 4096
COALESCE_BYTES = 4096
"""Rows closer than this are fetched by one `pread` with what lies between them (as `records.COALESCE_BYTES`)."""
SCAN_ROWS = 1 << 20
"""Rows read at a time when a whole array is read or checked (bounded memory for any size of cache)."""
_DTYPE_KINDS = "biuf"
CHECKSUM_PIECE = 8 << 20
"""Bytes read at a time while an array's checksum is computed or checked."""
_cache_warnings: list[str] = []
"""Warnings about caches said in this process (see `warn_about_cache`), for the trainer's `warning` events."""


def warn_about_cache(text: str, warn: typing.Callable[[str], None] | None = None) -> None:
    """Say `text` (a cache that could not be written, used or trusted) on stderr, or to `warn`, and keep it
    for `take_cache_warnings`: the trainer reads caches before `run_started`, and a warning said only on
    stderr would never reach events.jsonl, where status and the monitor look."""
    _cache_warnings.append(text)
    (warn or (lambda line: print(f"warning: {line}", file=sys.stderr)))(text)


def take_cache_warnings() -> list[str]:
    """The cache warnings said since the last call (each once), oldest first."""
    taken = list(_cache_warnings)
    _cache_warnings.clear()
    return taken


class HostileCache(Exception):
    """A cache entry that must not be used, replaced or followed (a link, not a regular file, someone
    else's or writable by others); `str()` says what it is."""


class DamagedCache(Exception):
    """A cache whose arrays do not match the checksums in its header (bytes changed on disk); `str()` says
    which array."""


def array_checksum(array: np.ndarray) -> str:
    """The CRC-32 of an array's bytes, as the header stores it (8 hex digits)."""
    data = memoryview(np.ascontiguousarray(array)).cast("B")
    crc = 0
    for start in range(0, len(data), CHECKSUM_PIECE):
        crc = zlib.crc32(data[start:start + CHECKSUM_PIECE], crc)
    return f"{crc:08x}"


class CacheFile:
    """An open cache file: its header, and `pread` access checked against the size and identity it had
    when it was opened. Pickles without its descriptor; another process reopens it (O_NOFOLLOW) and
    refuses a file that is not the same one (another inode) or not the same size."""

    def __init__(self, path: Path, header: dict, fd: int, facts: os.stat_result, source: str):
        self.path = Path(path)
        self.header = header
        self.source = source
        """What it was built from, for messages (`the positions cache of data/sp.hcpe3`)."""
        self.size = facts.st_size
        self.identity = (facts.st_dev, facts.st_ino)
        self._fd: int | None = fd

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None}

    def _changed(self, now: str) -> UserError:
        return UserError(f"{self.path}: {self.source} changed while the run read it ({now}; {self.size:,} bytes "
                         f"when the run started); was it truncated, replaced or rewritten in place? Delete it "
                         f"and resume: it is built again")

    def fd(self) -> int:
        if self._fd is None:
            # a forked worker keeps the inherited descriptor (`pread` does not share a file offset); a
            # spawned one, or a pickled copy, opens the file again and must find the same one
            try:
                fd, facts = open_regular_fd(self.path, follow_links=False)
            except NotARegularFile:
                raise self._changed("another file is in its place") from None
            except OSError as exc:
                raise self._changed(f"cannot open it any more: {exc.strerror or exc}") from None
            if (facts.st_dev, facts.st_ino) != self.identity:
                os.close(fd)
                raise self._changed("another file is in its place")
            self._fd = fd
        return self._fd

    def check_size(self) -> int:
        fd = self.fd()
        size = os.fstat(fd).st_size
        if size != self.size:
            raise self._changed(f"{size:,} bytes now")
        return fd

    def read(self, offset: int, length: int, fd: int | None = None) -> bytes:
        """`length` bytes at `offset` (a short read is the file changing under us: `UserError`)."""
        fd = self.check_size() if fd is None else fd
        data = pread_full(fd, length, offset)
        if len(data) < length:
            raise self._changed(f"a read at byte {offset + len(data):,} found the end of the file, "
                                f"{os.fstat(fd).st_size:,} bytes now")
        return data

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass  # interpreter shutdown or a descriptor closed elsewhere: nothing left to release


class CacheArray:
    """One array of a cache file, read by `pread` when indexed: an int, a slice (step 1) or an index array
    (rows in that order; near rows fetched together). `np.asarray()` reads it whole."""

    def __init__(self, cache: CacheFile, name: str, offset: int, dtype: np.dtype, shape: tuple[int, ...]):
        self.cache, self.name, self.offset = cache, name, offset
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.row_shape = self.shape[1:]
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def _rows(self, start: int, stop: int, fd: int | None = None) -> np.ndarray:
        if stop <= start:
            return np.empty((0, *self.row_shape), self.dtype)
        data = self.cache.read(self.offset + start * self.row_bytes, (stop - start) * self.row_bytes, fd)
        return np.frombuffer(data, self.dtype).reshape(stop - start, *self.row_shape)

    def __getitem__(self, key: typing.Any) -> typing.Any:
        n = self.shape[0]
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {int(key)} out of range for {self.name} of {n}")
            return self._rows(i, i + 1)[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                return self[np.arange(start, stop, step)]
            return self._rows(start, stop).copy()
        return self.take(np.asarray(key))

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Rows `indices` (any shape of int array), in that order; a copy."""
        indices = np.asarray(indices, dtype=np.int64)
        flat = indices.reshape(-1)
        rows = self.gather(flat, np.ones(len(flat), dtype=np.int64))
        return rows.reshape(*indices.shape, *self.row_shape)

    def gather(self, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Rows [starts[i], starts[i] + counts[i]) for each i, concatenated in that order (a copy): the
        rows of a batch, pairs of CSR offsets, the candidates of a batch's positions. Ranges closer than
        COALESCE_BYTES in the file come in one `pread`, so a batch costs about one read per distinct place."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        total = int(counts.sum()) if len(counts) else 0
        if total == 0:
            return np.empty((0, *self.row_shape), self.dtype)
        ends = starts + counts
        n = self.shape[0]
        if starts.min() < 0 or ends.max() > n or counts.min() < 0:
            raise IndexError(f"rows out of range for {self.name} of {n}")
        order = np.argsort(starts, kind="stable")
        first, last = starts[order], ends[order]
        reach = np.maximum.accumulate(last)
        gap = max(1, COALESCE_BYTES // max(1, self.row_bytes))
        opens = np.concatenate([[True], first[1:] > reach[:-1] + gap])
        span_of_sorted = np.cumsum(opens) - 1
        span_first = first[opens]
        span_last = np.maximum.reduceat(last, np.flatnonzero(opens))
        lengths = (span_last - span_first) * self.row_bytes
        offsets = self.offset + span_first * self.row_bytes
        fd = self.cache.check_size()
        pread = os.pread
        data = b"".join([pread(fd, length, offset) for length, offset in zip(lengths.tolist(), offsets.tolist())])
        if len(data) != int(lengths.sum()):  # cut short under us since the size was checked
            data = b"".join([self.cache.read(offset, length, fd) for length, offset in
                             zip(lengths.tolist(), offsets.tolist())])
        table = np.frombuffer(data, self.dtype).reshape(-1, *self.row_shape)
        span_base = np.concatenate([[0], np.cumsum(span_last - span_first)[:-1]])
        where = np.empty(len(starts), dtype=np.int64)  # each range's first row in `table`
        where[order] = span_base[span_of_sorted] + first - span_first[span_of_sorted]
        if total == len(starts):  # one row each (a batch's rows)
            return table[where]
        item_base = np.cumsum(counts) - counts
        flat = np.repeat(where - item_base, counts) + np.arange(total)
        return table[flat]

    def __array__(self, dtype: typing.Any = None, copy: typing.Any = None) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        fd = self.cache.check_size()
        for start in range(0, self.shape[0], SCAN_ROWS):
            stop = min(self.shape[0], start + SCAN_ROWS)
            out[start:stop] = self._rows(start, stop, fd)
        return out if dtype is None else out.astype(dtype)

    def astype(self, dtype: typing.Any) -> np.ndarray:
        return np.asarray(self).astype(dtype)

    def chunks(self) -> typing.Iterator[np.ndarray]:
        """The array in pieces of at most SCAN_ROWS rows, in order (for checks of any size)."""
        for start in range(0, self.shape[0], SCAN_ROWS):
            yield self._rows(start, min(self.shape[0], start + SCAN_ROWS))


def close_arrays(arrays: typing.Iterable[typing.Any]) -> None:
    """Close the cache files behind `arrays` (others are ignored); a later read opens the file again and
    must find the same one."""
    for array in arrays:
        if isinstance(array, CacheArray):
            array.cache.close()


def cache_trust_problem(facts: os.stat_result, trusted_uids: typing.Collection[int]) -> str | None:
    """Why a cache with these (fstat) facts is not to be used (`safefile.trust_problem`: not a regular file,
    someone else's, or writable by others), with what that would let them do; None when it may be."""
    problem = trust_problem(facts, trusted_uids)
    if problem is None or not stat.S_ISREG(facts.st_mode):
        return problem
    if facts.st_uid not in trusted_uids:
        return f"{problem}, neither you nor the owner of the data it was built from, who could have crafted it"
    return f"{problem}, who could swap its contents"


def open_cache(path: Path, fmt: str, version: int, source: str, trusted_uids: typing.Collection[int]
               ) -> tuple[dict, dict[str, CacheArray]] | None:
    """(header, arrays) of the cache at `path`; None when it is missing, of another format or version, or
    its header's arrays do not fit the file; `HostileCache` when the entry must not be used (see the module
    docstring); `DamagedCache` when an array does not match its checksum. The file is checked as it was
    opened (fstat), never followed through a link."""
    try:
        fd, facts = open_regular_fd(path, follow_links=False)
    except FileNotFoundError:
        return None
    except NotARegularFile as exc:
        raise HostileCache(f"is {exc.what}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostileCache(f"is a symbolic link{link_target(path)}; a cache is never read or written through "
                               "a link") from None
        if exc.errno == errno.ENOTDIR:
            return None
        raise HostileCache(f"cannot be opened ({exc.strerror or exc})") from None
    try:
        problem = cache_trust_problem(facts, trusted_uids)
        if problem:
            raise HostileCache(problem)
        head = os.pread(fd, HEADER_BYTES, 0)
    except BaseException:
        os.close(fd)
        raise
    cache = CacheFile(path, {}, fd, facts, source)  # closes fd when dropped
    try:
        header = json.loads(head.split(b"\n", 1)[0])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict) or header.get("format") != fmt or header.get("version") != version \
            or header.get("bytes") != facts.st_size:
        return None
    cache.header = header
    arrays = _layout(cache, header.get("arrays"), facts.st_size)
    sums = header.get("checksums")
    if arrays is None or not isinstance(sums, dict) or set(sums) != set(arrays):
        return None
    for name, array in arrays.items():
        found = _stored_checksum(cache, array)
        if found != sums[name]:
            raise DamagedCache(f"its array {name!r} does not match its checksum (CRC-32 {found}, {sums[name]} "
                               f"when written): changed on disk since it was built")
    return header, arrays


def _stored_checksum(cache: CacheFile, array: CacheArray) -> str:
    fd, crc = cache.check_size(), 0
    for start in range(0, array.nbytes, CHECKSUM_PIECE):
        crc = zlib.crc32(cache.read(array.offset + start, min(CHECKSUM_PIECE, array.nbytes - start), fd), crc)
    return f"{crc:08x}"


def _layout(cache: CacheFile, layout: typing.Any, size: int) -> dict[str, CacheArray] | None:
    """The header's arrays, each checked to lie within the file, with a plain numeric dtype and at most
    two dimensions; None for anything else (a damaged or crafted header: the cache is rebuilt)."""
    if not isinstance(layout, dict):
        return None
    arrays = {}
    for name, spec in layout.items():
        if not (isinstance(spec, list) and len(spec) == 3):
            return None
        offset, dtype_text, shape = spec
        if not (isinstance(offset, int) and isinstance(dtype_text, str) and isinstance(shape, list)
                and 1 <= len(shape) <= 2 and all(isinstance(s, int) and 0 <= s < 2**48 for s in shape)):
            return None
        try:
            dtype = np.dtype(dtype_text)
        except (TypeError, ValueError):
            return None
        if dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
            return None
        nbytes = dtype.itemsize
        for s in shape:
            nbytes *= s  # Python ints: a crafted shape cannot overflow into a small number
        if not HEADER_BYTES <= offset <= size or offset + nbytes > size:
            return None
        arrays[name] = CacheArray(cache, name, offset, dtype, tuple(shape))
    return arrays


def offsets_consistent(offsets: CacheArray | np.ndarray, rows: int, total: int) -> bool:
    """CSR offsets of `rows` rows into `total` entries: rows + 1 of them, from 0 to `total`, never
    decreasing (checked in pieces, so any size of cache costs bounded memory)."""
    if len(offsets) != rows + 1:
        return False
    previous = 0
    pieces = offsets.chunks() if isinstance(offsets, CacheArray) else [np.asarray(offsets)]
    for piece in pieces:
        if len(piece) == 0:
            continue
        if piece[0] < previous or np.any(np.diff(piece) < 0):
            return False
        previous = int(piece[-1])
    first = int(offsets[0])
    return first == 0 and previous == total
