"""hcpe3, dlshogi's self-play format: whole games with the search's visit counts, and its decoded cache.

File layout (dlshogi `cppshogi.h`, little-endian, no padding), one game after another:

- a 36-byte header `HuffmanCodedPosAndEval3`: `hcp[32]` the start position, `moveNum` u16, `result` u8
  (bits 0-1: cshogi's DRAW 0 / BLACK_WIN 1 / WHITE_WIN 2 for the whole game; bit 2 sennichite, bit 3
  entering-king declaration, bit 4 max moves), `opponent` u8 (0 self-play, 1/2 a USI engine as black/white);
- `moveNum` times a 6-byte `MoveInfo` (`selectedMove16` u16, `eval` s16 from the side to move's view,
  `candidateNum` u16), each followed by `candidateNum` 4-byte `MoveVisits` (`move16` u16, `visitNum` u16).

The games have no index and the positions exist only by replaying the moves, so a file is decoded once
(`build_positions`) into a **positions cache** beside it, `.NAME.positions` (e.g. `.selfplay.hcpe3.positions`):
a 4096-byte JSON header (format version, the source's fingerprint: size, mtime and a digest of 64 pieces of
it) and then flat arrays, read with `pread` (`cachefile`, never a memory map). `build_positions` gives these
arrays, and `Hcpe3Positions` reads them by these names whatever the cache stores:

| array | per | meaning |
| --- | --- | --- |
| `game_offsets` int64 | game | byte offset of each game's header in the hcpe3 file |
| `hcp` uint8 [32] | position | the position (HuffmanCodedPos), replayed with cshogi |
| `eval` int16, `move16` uint16, `result` uint8 | position | MoveInfo eval, selected move; the result byte |
| `label` uint16 | position | the selected move's policy label (`make_move_label`) |
| `game` int32, `ply` uint16 | position | which game and which of its moves (for messages) |
| `cand_offsets` int64 [N + 1] | position | where its candidates lie in the three arrays below (CSR) |
| `cand_move16`, `cand_label`, `cand_visits` uint16 | candidate | the MoveVisits, with each move's policy label |

The cache itself (version 5) stores them compactly (`hcpe3_compact`): the hcp of every 8th ply of a game only
(`hcpe3_replay.anchor_starts`), the others replayed at read; labels by table; results with the positions they
are replayed from.

As in dlshogi's `load_hcpe3`, a position whose selected move repeats an earlier position (a repetition draw,
superior or inferior, looking back 16 plies) is left out; the count is in the header (`repetitions`). Unlike
dlshogi, a position with `candidateNum` 0 is kept and trained one-hot on the selected move (dlshogi skips it).

A stale cache (another size, mtime or content of the source, or another format version) is rebuilt, and so is
one whose arrays fail their checksums (CRC-32 each, in the header; `cachefile`), with a warning naming it;
one that cannot be written (a read-only directory) is built in memory, with one warning per file. Warnings
about caches are kept for the trainer's `warning` events (`cachefile.take_cache_warnings`).

Public API: `Hcpe3File(path)` -> `.games()` (the raw games, exactly as stored), `.positions()`
(`Hcpe3Positions`, built or loaded), `.game_count`, `.position_count`; `build_positions(path)` decodes
without touching any cache; `policy_targets(...)` turns visit counts into the training distribution.

The replay (`hcpe3_replay`) keeps to cshogi's board what only a board can answer (legality, `to_hcp`,
repetitions) and does the rest in bulk with numpy; `build_caches` decodes several files at once, each in a
child process. Timing the decoder: `python -m tideborn.data.cache.hcpe3 FILE.hcpe3` decodes FILE without the cache
and prints games, positions and positions/s (docs/benchmarks.md has figures).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import cshogi
import numpy as np

from tideborn.data.cache.cachefile import (
    CacheArray,
    DamagedCache,
    HostileCache,
    array_checksum,
    offsets_consistent,
    open_cache,
    warn_about_cache,
)
from tideborn.data.cache.hcpe3_compact import CompactPositions, compact, labels_of
from tideborn.data.cache.hcpe3_compact import consistent as compact_consistent
from tideborn.data.decode.features import POLICY_CLASSES
from tideborn.data.decode.hcpe3_replay import WINDOW_BYTES, ReplayedPositions, truncated
from tideborn.data.formats.records import (
    ChangedWhileRead,
    open_record_file,
    pread_full,
    readable_size,
    records_fingerprint,
)
from tideborn.errors import UserError

HEADER_DTYPE = np.dtype([("hcp", np.uint8, 32), ("moveNum", "<u2"), ("result", "u1"), ("opponent", "u1")])
MOVE_INFO_DTYPE = np.dtype([("selectedMove16", "<u2"), ("eval", "<i2"), ("candidateNum", "<u2")])
MOVE_VISITS_DTYPE = np.dtype([("move16", "<u2"), ("visitNum", "<u2")])
HEADER_SIZE, MOVE_INFO_SIZE, MOVE_VISITS_SIZE = 36, 6, 4
RESULT_MASK = 0x3
"""The result byte's bits 0-1: the game's result (cshogi's DRAW 0, BLACK_WIN 1, WHITE_WIN 2)."""
RESULT_FLAGS = {"sennichite": 0x4, "nyugyoku": 0x8, "max_moves": 0x10}
RESULT_UNKNOWN_BITS = 0xE0
"""Bits of the result byte dlshogi never sets: a file with them is not hcpe3, or is misaligned."""
MAX_LEGAL_MOVES = 593
"""The most legal moves a shogi position can have: more candidates than this cannot all be legal and distinct."""
REPETITIONS_SKIPPED = (cshogi.REPETITION_DRAW, cshogi.REPETITION_SUPERIOR, cshogi.REPETITION_INFERIOR)
REPETITION_PLIES = 16
"""dlshogi's `moveIsDraw(move, 16)`: how far back a repetition is looked for."""

CACHE_FORMAT = "tideborn-hcpe3-positions"
CACHE_VERSION = 5
"""5: the compact layout's anchors by ply (every 8th of a game, `hcpe3_replay.anchor_starts`): a cache of 4 reads
right but is not what a fresh decode writes, which `verify` would call foreign; 4: the compact layout
(`hcpe3_compact`: an hcp every few positions); 3: a CRC-32 of each array in the header. A cache of another
version is rebuilt, never read."""
CACHE_HEADER_BYTES = 4096
READ_CHUNK = 1 << 22
"""Bytes of an hcpe3 file read at a time while it is replayed (`pread`, never a memory map)."""
_ALIGN = 64
_warned_unwritable: set[str] = set()
_decoded_in_memory: dict[tuple, tuple[dict, dict[str, np.ndarray]]] = {}
"""Positions this process decoded in memory (no usable cache), by file and fingerprint: the trainer's checks
and its data loader ask for the same file, and should not decode it twice."""


@dataclass
class Hcpe3Game:
    """One game as stored: header fields, its MoveInfos, and each move's MoveVisits."""

    offset: int
    hcp: np.ndarray
    move_num: int
    result: int
    opponent: int
    moves: np.ndarray
    """[moveNum] MOVE_INFO_DTYPE."""
    candidates: list[np.ndarray]
    """Per move, [candidateNum] MOVE_VISITS_DTYPE."""


def cache_path(path: Path) -> Path:
    """Where the positions cache of hcpe3 file `path` lives: `.NAME.positions` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.positions")


def content_digest() -> typing.Any:
    """A fresh digest of a file's content identity (`content_hash`, the caches' `content`): fed the whole file's
    bytes in order."""
    return hashlib.blake2b(digest_size=16)


class _SourceReader:
    """An hcpe3 file read forward in chunks by `pread` (not a memory map: a file truncated under a map kills
    the process with SIGBUS). `get(offset, n)` gives a buffer holding bytes [offset, offset + n) and where
    they start in it; a short read (the file cut under us) is a `UserError` naming the file. The bytes
    read, in order, feed `digest` (the whole file's content hash, for the cache's fingerprint)."""

    def __init__(self, path: Path, size: int, kind: str = "hcpe3"):
        self.path, self.size = path, size
        self.fd, _ = open_record_file(path, kind)  # refused if replaced by a FIFO since it was checked
        self.buffer, self.base = b"", 0
        self.digest = content_digest()

    def get(self, offset: int, n: int) -> tuple[bytes, int]:
        end = self.base + len(self.buffer)
        if offset >= self.base and offset + n <= end:
            return self.buffer, offset - self.base
        keep = self.buffer[offset - self.base:] if self.base <= offset < end else b""
        start = end if keep else offset
        if start != end:  # a jump forward: the digest covers what was read, and says so by not matching
            self.digest.update(b"\0jump" + start.to_bytes(8, "little"))
        want = min(max(n - len(keep), READ_CHUNK), self.size - start)
        data = pread_full(self.fd, want, start)
        if len(data) < want:
            raise ChangedWhileRead(f"{self.path}: changed while it was read: it ends at byte "
                                   f"{start + len(data):,} now, {self.size:,} bytes when reading began; was it "
                                   f"truncated or rewritten?")
        self.digest.update(data)
        self.buffer, self.base = keep + data, offset if keep else start
        return self.buffer, offset - self.base

    def close(self) -> None:
        os.close(self.fd)


def check_hcpe3_file(path: Path) -> int:
    """The size of hcpe3 file `path`, after checking it is a readable regular file holding a first game header."""
    size = readable_size(path, "hcpe3")
    if size == 0:
        raise UserError(f"{path}: is empty (0 bytes); an hcpe3 file holds games of a {HEADER_SIZE}-byte header "
                        f"and the moves")
    if size < HEADER_SIZE:
        raise truncated(Path(path), 0, 0, "game header", HEADER_SIZE, size)
    return size


def iter_games(path: Path) -> typing.Iterator[Hcpe3Game]:
    """The games of `path` as stored (no replay), checking only that each lies whole within the file."""
    path = Path(path)
    size = check_hcpe3_file(path)
    reader = _SourceReader(path, size)
    try:
        offset, game = 0, 0
        while offset < size:
            if size - offset < HEADER_SIZE:
                raise truncated(path, game, offset, "game header", HEADER_SIZE, size)
            buffer, at = reader.get(offset, HEADER_SIZE)
            header = np.frombuffer(buffer, HEADER_DTYPE, 1, at)[0].copy()
            move_num = int(header["moveNum"])
            p = offset + HEADER_SIZE
            infos = np.empty(move_num, MOVE_INFO_DTYPE)
            candidates = []
            for i in range(move_num):
                if p + MOVE_INFO_SIZE > size:
                    raise truncated(path, game, offset, f"move {i} of {move_num}", MOVE_INFO_SIZE, size, p)
                buffer, at = reader.get(p, MOVE_INFO_SIZE)
                infos[i] = np.frombuffer(buffer, MOVE_INFO_DTYPE, 1, at)[0]
                p += MOVE_INFO_SIZE
                count = int(infos[i]["candidateNum"])
                if count > MAX_LEGAL_MOVES:
                    raise UserError(f"{path}: game {game} (byte {offset}): move {i}: candidateNum "
                                    f"{count} is more than a position can have legal moves ({MAX_LEGAL_MOVES}); "
                                    f"the file is corrupt or misaligned")
                if p + count * MOVE_VISITS_SIZE > size:
                    raise UserError(f"{path}: game {game} (byte {offset}): move {i}: candidateNum {count} "
                                    f"reaches past the end of the file (byte {p + count * MOVE_VISITS_SIZE} of "
                                    f"{size}); the file is cut short or is not hcpe3")
                buffer, at = reader.get(p, count * MOVE_VISITS_SIZE)
                candidates.append(np.frombuffer(buffer, MOVE_VISITS_DTYPE, count, at).copy())
                p += count * MOVE_VISITS_SIZE
            yield Hcpe3Game(offset, np.array(header["hcp"]), move_num, int(header["result"]),
                            int(header["opponent"]), infos, candidates)
            offset, game = p, game + 1
    finally:
        reader.close()


def build_positions(path: Path, progress: typing.Callable[[int, int], None] | None = None) -> dict:
    """Replay every game of `path` with cshogi: the cache's arrays (see the module docstring) and its meta.

    A malformed game (truncated, a result byte out of range or with unknown bits, an undecodable start
    position, an empty or illegal selected move, more candidates than legal moves, a candidate that is not a
    legal move or appears twice) is a `UserError` naming the file, the game and its byte offset.
    `progress(bytes_done, size)` is called now and then."""
    return _build(path, progress)[0]


def _build(path: Path, progress: typing.Callable[[int, int], None] | None = None, full: bool = True
           ) -> tuple[dict, str]:
    """`build_positions`, and the content hash of the bytes it replayed (the whole file). Not `full`: the
    arrays in the cache's compact layout, packing only the anchors' positions (most of a move's cost)."""
    path = Path(path)
    size = check_hcpe3_file(path)
    reader = _SourceReader(path, size)
    replayed = ReplayedPositions(path, every_hcp=full)
    window = WINDOW_BYTES
    try:
        offset = 0
        while offset < size:
            buffer, at = reader.get(offset, min(window, size - offset))
            used = replayed.replay(buffer, at, offset, size, offset + len(buffer) - at >= size)
            if used == 0:  # a game longer than the window: a larger one
                window *= 2
                continue
            offset += used
            if progress is not None:
                progress(offset, size)
    finally:
        reader.close()
    if progress is not None:
        progress(size, size)
    arrays = replayed.arrays()
    meta = {"games": len(arrays["game_offsets"]), "positions": len(arrays["eval"]),
            "repetitions": replayed.repetitions, "candidates": len(arrays["cand_move16"])}
    return {"meta": meta, "arrays": arrays}, reader.digest.hexdigest()


def source_fingerprint(path: Path) -> dict:
    """What the cache was built from: size, mtime (ns) and a digest of 64 pieces of the file."""
    facts = os.stat(path)
    return {"size": facts.st_size, "mtime_ns": facts.st_mtime_ns, "digest": records_fingerprint(path)}


def source_identity(path: Path) -> list[int]:
    """(device, inode, ctime ns) of `path`: the same file, untouched since (ctime cannot be set back, as
    mtime can, and a copy or an edit in place changes it)."""
    facts = os.stat(path)
    return [facts.st_dev, facts.st_ino, facts.st_ctime_ns]


def content_hash(path: Path, kind: str = "hcpe3") -> str:
    """The hash of the whole file as `_build` computes it while replaying (read forward in chunks); `kind`
    names the file in messages."""
    size = os.stat(path).st_size
    reader = _SourceReader(Path(path), size, kind)
    try:
        for offset in range(0, size, READ_CHUNK):
            reader.get(offset, min(READ_CHUNK, size - offset))
    finally:
        reader.close()
    return reader.digest.hexdigest()


def write_arrays(path: Path, meta: dict, arrays: dict[str, typing.Any], fmt: str) -> None:
    """Write `arrays` in the cache layout (JSON header, aligned flat arrays) to `path`, atomically: a temp
    file beside it, fsynced, renamed over it (`StagedOutputs`). An array is a numpy array or one spooled on
    disk (`average_merge.SpooledArray`: `dtype`, `shape`, `nbytes`, `checksum`, `write_into(handle)`),
    copied in pieces so that a cache larger than memory can be written."""
    from tideborn.outputs import StagedOutputs

    layout, offset = {}, CACHE_HEADER_BYTES
    for name, array in arrays.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        layout[name] = [offset, array.dtype.str, list(array.shape)]
        offset += array.nbytes
    checksums = {name: array_checksum(array) if isinstance(array, np.ndarray) else array.checksum
                 for name, array in arrays.items()}
    header = json.dumps({"format": fmt, "version": CACHE_VERSION, **meta, "arrays": layout, "checksums": checksums,
                         "bytes": offset}).encode() + b"\n"
    if len(header) > CACHE_HEADER_BYTES:
        raise ValueError("cache header too long")

    def fill(handle: typing.BinaryIO) -> None:
        handle.write(header.ljust(CACHE_HEADER_BYTES, b" "))
        position = CACHE_HEADER_BYTES
        for name, array in arrays.items():
            start = layout[name][0]
            handle.write(b"\0" * (start - position))
            if isinstance(array, np.ndarray):
                handle.write(np.ascontiguousarray(array).tobytes())
            else:
                array.write_into(handle)
            position = start + array.nbytes

    with StagedOutputs() as staged:
        staged.write(path, fill)
        staged.publish()


def trusted_owners(*sources: Path) -> set[int]:
    """Whose cache files are used: the user's, and those of the owners of the files they were built from."""
    owners = {os.geteuid()}
    for source in sources:
        try:
            owners.add(os.stat(source).st_uid)
        except OSError:
            continue  # a source that went away is named by its own reader
    return owners


def read_arrays(path: Path, fmt: str, source: str = "the cache", trusted: typing.Collection[int] | None = None
                ) -> tuple[dict, dict[str, CacheArray]] | None:
    """(header, arrays read by `pread`) of a cache file, or None when it is missing, of another format or
    version, or not whole and consistent. `HostileCache` when the entry must not be used at all (a link,
    not a regular file, someone else's, writable by others: see `cachefile`); `DamagedCache` when its
    arrays do not match their checksums. `source` names what the
    cache was built from in messages."""
    found = open_cache(Path(path), fmt, CACHE_VERSION, source, {os.geteuid()} if trusted is None else trusted)
    if found is None or not _consistent(*found):
        return None
    return found


def _consistent(header: dict, arrays: dict[str, CacheArray]) -> bool:
    """The arrays agree with each other and the header (positions, CSR offsets within the candidates)."""
    try:
        positions = int(header["positions"])
        offsets = arrays["cand_offsets"]
        if header.get("format") == CACHE_FORMAT:  # the positions cache: its compact layout
            return compact_consistent(header, arrays) and offsets.ndim == 1 and \
                offsets_consistent(offsets, positions, len(arrays["cand_move16"]))
        per_position = [a for name, a in arrays.items() if name in ("hcp", "eval", "move16", "result", "label",
                                                                    "game", "ply", "winprob", "count")]
        per_candidate = [a for name, a in arrays.items() if name.startswith("cand_") and name != "cand_offsets"]
        if not all(len(a) == positions for a in per_position) or len({len(a) for a in per_candidate}) > 1:
            return False
        total = len(per_candidate[0]) if per_candidate else 0
        return offsets.ndim == 1 and offsets_consistent(offsets, positions, total)
    except (KeyError, TypeError, ValueError, IndexError):
        return False


def _warn_once(key: str, text: str, warn: typing.Callable[[str], None] | None) -> None:
    if key in _warned_unwritable:
        return
    _warned_unwritable.add(key)
    warn_about_cache(text, warn)


def _matches(header: dict, path: Path, fingerprint: dict, identity: list[int]) -> bool:
    """Whether a cache's header describes file `path` as it is now. Size, mtime and the sampled digest
    must agree; then either the file is the very one it was built from (same inode, ctime untouched) or,
    for a copy or a move (another inode), the hash of its whole content agrees: a cache copied from another
    file of the same size and mtime is not trusted on the 64 sampled pieces alone."""
    if header.get("source") != fingerprint:
        return False
    if header.get("identity") == identity:
        return True
    return header.get("content") == content_hash(path)


def load_or_build(path: Path, warn: typing.Callable[[str], None] | None = None,
                  progress: typing.Callable[[int, int], None] | None = None
                  ) -> tuple[dict, dict[str, np.ndarray | CacheArray]]:
    """The positions cache of `path`: read if it matches the file, else built (and written when possible).

    A cache entry that must not be used (a link, a FIFO, a directory, someone else's file, one writable by
    others) is left alone: the positions are decoded in memory and one warning names the entry."""
    path = Path(path)
    readable_size(path, "hcpe3")
    fingerprint = source_fingerprint(path)
    identity = source_identity(path)
    cache = cache_path(path)
    source = f"the positions cache of {path}"
    hostile = None
    try:
        found = read_arrays(cache, CACHE_FORMAT, source, trusted_owners(path))
    except HostileCache as exc:
        found, hostile = None, str(exc)
    except DamagedCache as exc:
        found = None
        _warn_once(f"{cache}:damaged", f"{cache}: {source} is damaged ({exc}); it is built again", warn)
    if found is not None and _matches(found[0], path, fingerprint, identity):
        return found
    memo_key = (str(path.resolve()), json.dumps(fingerprint, sort_keys=True), tuple(identity))
    if memo_key in _decoded_in_memory:
        return _decoded_in_memory[memo_key]
    if progress is None:  # in the trainer: say why the start takes a while (once per file and version)
        target = "memory (its cache cannot be used)" if hostile else f"{cache} (once)"
        print(f"hcpe3: decoding {path} ({fingerprint['size']:,} bytes) into {target}", flush=True)
    # The arrays in memory are the full layout; a cache to write needs the compact one only, which the replay
    # makes without packing every position. Where the write fails all the same (disk full, the file replaced
    # meanwhile), the file is replayed again for the full layout: a cost only on that rare path.
    writable = not hostile and os.access(cache.parent, os.W_OK | os.X_OK)
    built, content = _build(path, progress, full=not writable)
    meta = {**built["meta"], "source": fingerprint, "identity": identity, "content": content}

    def in_memory() -> tuple[dict, dict[str, np.ndarray]]:
        full, full_content = (built, content) if not writable else _build(path)
        return {"format": CACHE_FORMAT, "version": CACHE_VERSION, **meta, **full["meta"],
                "content": full_content}, full["arrays"]

    if hostile:
        _decoded_in_memory[memo_key] = in_memory()
        _warn_once(str(cache), f"{path}: decoded in memory, the positions cache could not be written ({cache} "
                   f"{hostile}; it is not used or replaced); every run decodes it again until it is removed", warn)
        return _decoded_in_memory[memo_key]
    try:
        write_arrays(cache, meta, built["arrays"] if writable else compact(built["arrays"]), CACHE_FORMAT)
    except UserError as exc:
        _warn_once(str(cache), f"{path}: decoded in memory, the positions cache could not be written ({exc}); "
                   f"every run decodes it again", warn)
        _decoded_in_memory[memo_key] = in_memory()
        return _decoded_in_memory[memo_key]
    try:
        found = read_arrays(cache, CACHE_FORMAT, source, trusted_owners(path))
    except (HostileCache, DamagedCache):
        found = None  # replaced, or damaged, since it was written: use what was built
    if found is None or found[0].get("content") != content:  # replaced meanwhile: use what was built
        return in_memory()
    return found


PARALLEL_BYTES = 16 << 20
"""Below this many bytes of files to decode, child processes would cost more to start than they save."""


def _cache_is_current(path: Path) -> bool:
    """Whether `path` has a positions cache written for it as it is now (by its header alone: opening it
    checks the rest). Never through a link nor waiting on a FIFO: whatever is not a regular file is left
    for the opening, which says what it is."""
    try:
        if not stat.S_ISREG(os.lstat(cache_path(path)).st_mode):
            return True  # a link, a FIFO...: the parent decodes in memory and warns; no child's business
        fd = os.open(cache_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # the parent says what is wrong with it
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        header = json.loads(os.pread(fd, CACHE_HEADER_BYTES, 0).split(b"\n", 1)[0])
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    finally:
        os.close(fd)
    return isinstance(header, dict) and header.get("format") == CACHE_FORMAT and \
        header.get("version") == CACHE_VERSION and header.get("source") == source_fingerprint(path)


def _build_cache_in_child(path: str) -> bool:
    """In a child process: decode `path` and write its positions cache; False where that failed. What went
    wrong (a malformed game, a cache that cannot be written) is not said here: the parent opens the file
    next and says it, once, in file order."""
    try:
        return Hcpe3File(path, warn=_said_by_the_parent).positions(progress=_quiet).cached
    except UserError:
        return False


def _said_by_the_parent(line: str) -> None:
    """A child's cache warning: the parent, decoding the same file, says it."""


def _quiet(done: int, size: int) -> None:
    """No progress lines from a child (the parent announced the decoding)."""


def build_caches(paths: typing.Sequence[Path], processes: int | None = None) -> list[Path]:
    """Decode the hcpe3 files among `paths` that have no current positions cache, up to `processes` at once
    (default: the usable CPU cores), each in a child process that writes the file's cache; the files whose
    cache a child wrote. Nothing is decoded this way for fewer than two files or PARALLEL_BYTES in all:
    opening the files after this (`Hcpe3File.positions`) decodes in the process whatever is still missing,
    and says every error and warning, in file order.

    The children are plain `python -m tideborn.data.cache.hcpe3 --write-cache FILE` processes, not
    multiprocessing's: those import the caller's main module again, which a script without a
    `__main__` guard does not survive, and a fork would copy a trainer's CUDA state and threads."""
    import subprocess

    processes = processes if processes is not None else len(os.sched_getaffinity(0))
    todo = []
    for path in dict.fromkeys(Path(p) for p in paths):
        try:
            if not _cache_is_current(path):
                todo.append(path)
        except OSError:
            continue  # a file that cannot be read is named when it is opened
    if processes < 2 or len(todo) < 2 or sum(p.stat().st_size for p in todo) < PARALLEL_BYTES:
        return []
    at_once = min(processes, len(todo))
    for path in todo:
        print(f"hcpe3: decoding {path} ({path.stat().st_size:,} bytes) into {cache_path(path)} (once; "
              f"{at_once} files at a time)", flush=True)
    waiting, running, written = list(todo), {}, []
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                path = waiting.pop(0)
                running[path] = subprocess.Popen([sys.executable, "-m", "tideborn.data.cache.hcpe3", "--write-cache",
                                                  str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            time.sleep(0.05)  # polled, never os.wait(): that would reap the caller's other children too
            for path, child in list(running.items()):
                if child.poll() is not None:
                    del running[path]
                    if child.returncode == 0:
                        written.append(path)
    finally:
        for child in running.values():  # interrupted: no child is left writing behind the caller's back
            child.kill()
            child.wait()
    return [p for p in todo if p in written]


class Hcpe3Positions:
    """The decoded positions of one hcpe3 file (cache arrays read by `pread` as batches need them, or
    arrays in memory); see the module docstring. Pickles small (the arrays name their cache file, which
    another process opens again and must find unchanged)."""

    def __init__(self, path: Path, header: dict, arrays: dict[str, np.ndarray | CacheArray]):
        self.path = Path(path)
        self.header = header
        self.compact: CompactPositions | None = None
        if "anchor" in arrays:  # a cache's compact layout: the full arrays computed from it when read
            self.compact = CompactPositions(arrays, self.damaged)
            arrays = self.compact.expand()
        self.arrays = arrays
        for name, array in arrays.items():
            setattr(self, name, array)
        self.games = int(header["games"])
        self.repetitions = int(header["repetitions"])

    def __len__(self) -> int:
        return int(self.header["positions"])

    def hcpe_records(self, indices: np.ndarray) -> np.ndarray:
        """Positions `indices` as hcpe records: hcp, eval, the selected move, the game's result (bits 0-1)."""
        records = np.zeros(len(indices), dtype=cshogi.HuffmanCodedPosAndEval)
        records["hcp"] = self.hcp[indices]
        records["eval"] = self.eval[indices]
        records["bestMove16"] = self.move16[indices].view(np.int16)
        records["gameResult"] = (self.result[indices] & RESULT_MASK).view(np.int8)
        return records

    def decoder_input(self, indices: np.ndarray) -> tuple[np.ndarray, typing.Any]:
        """(hcpe records, positions plan) of `indices` for `features.Decoder.decode`: from a compact cache the
        records carry each position's anchor (the side to move set right) and the plan replays the moves
        from there on the decoder's own board; else the records themselves and no plan."""
        if self.compact is None:
            return self.hcpe_records(indices), None
        indices = np.asarray(indices, dtype=np.int64)
        packed, plan = self.compact.replay_plan(indices)
        records = np.zeros(len(indices), dtype=cshogi.HuffmanCodedPosAndEval)
        records["hcp"] = packed
        records["eval"] = self.eval[indices]
        records["bestMove16"] = self.move16[indices].view(np.int16)
        records["gameResult"] = (self.result[indices] & RESULT_MASK).view(np.int8)
        return records, plan

    def candidates(self, index: int) -> np.ndarray:
        """Position `index`'s MoveVisits (move16, visitNum) as stored."""
        start, stop = int(self.cand_offsets[index]), int(self.cand_offsets[index + 1])
        out = np.empty(stop - start, MOVE_VISITS_DTYPE)
        out["move16"], out["visitNum"] = self.cand_move16[start:stop], self.cand_visits[start:stop]
        return out

    def candidate_rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(starts, counts) of the candidates of positions `indices`, checked against the candidate arrays
        (a cache damaged in place is a `UserError` naming it, never an index past its end)."""
        indices = np.asarray(indices, dtype=np.int64)
        bounds = _rows(self.cand_offsets, indices, 2).reshape(len(indices), 2).astype(np.int64)
        starts, stops = bounds[:, 0], bounds[:, 1]
        if len(indices) and ((stops < starts).any() or starts.min() < 0 or stops.max() > len(self.cand_label)):
            raise self.damaged("candidate offsets out of order")
        return starts, stops - starts

    @property
    def cached(self) -> bool:
        """Whether the positions are read from the cache file (not decoded in memory)."""
        return isinstance(self.arrays.get("eval"), CacheArray)

    def damaged(self, reason: str, index: int | None = None) -> UserError:
        """The error for a position that fails a check although the file's games were all checked when they
        were decoded: the cache's fault (changed since it was opened), named as the cache, never the file."""
        where = "" if index is None else f" at position {index} (said to be {self.describe(index)})"
        if not self.cached:
            return UserError(f"{self.path}: its positions decoded in memory fail a check{where}: {reason}")
        return UserError(f"{cache_path(self.path)}: the positions cache of {self.path} is damaged{where}: {reason}; "
                         f"delete it and resume: it is built again from the file")

    def targets(self, indices: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(labels [n, K] int64, probabilities [n, K] float32, most visited label [n] int64) of `indices`."""
        indices = np.asarray(indices, dtype=np.int64)
        starts, counts = self.candidate_rows(indices)
        # only the candidates of these positions are read (a few thousand rows, not the whole arrays)
        local_starts = (np.cumsum(counts) - counts).astype(np.int64)
        if self.compact is not None:  # labels from the moves and the side to move, by table
            turns = self.compact.turns(indices)
            cand_labels = labels_of(np.repeat(turns, counts), _rows(self.cand_move16, starts, counts))
            fallback = labels_of(turns, np.asarray(self.move16[indices]))
        else:
            cand_labels, fallback = _rows(self.cand_label, starts, counts), np.asarray(self.label[indices])
        try:
            return policy_targets(local_starts, counts, cand_labels,
                                  _rows(self.cand_visits, starts, counts).astype(np.float64),
                                  fallback.astype(np.int64), temperature)
        except LabelOutOfRange as bad:
            raise self.damaged(str(bad), int(indices[bad.row])) from None

    def describe(self, index: int) -> str:
        return f"{self.path}: game {int(self.game[index])} move {int(self.ply[index])}"


def _rows(array: np.ndarray | CacheArray, starts: np.ndarray, counts: np.ndarray | int) -> np.ndarray:
    """Rows [start, start + count) of each start, concatenated: by `CacheArray.gather` (coalesced reads) from a
    cache, by indexing from memory."""
    counts = np.broadcast_to(np.asarray(counts, dtype=np.int64), np.shape(starts))
    if isinstance(array, CacheArray):
        return array.gather(starts, counts)
    total = int(counts.sum())
    flat = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(counts) - counts), counts) + np.arange(total)
    return array[flat]


def policy_targets(starts: np.ndarray, counts: np.ndarray, cand_labels: np.ndarray, weights: np.ndarray,
                   fallback: np.ndarray, temperature: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded sparse policy targets of n rows from CSR candidates (`starts`, `counts` into `cand_labels`
    and `weights`): p ∝ weight^(1/T) (dlshogi's `visits_to_proberbility`), one-hot on the largest weight
    (the first of equals) when T is 0, one-hot on `fallback` (the selected move) for a row without
    candidates or whose weights are all 0. `temperature` None: the weights are probabilities already.
    Returns (labels [n, K] int64, probabilities [n, K] float32, top label [n] int64), K >= 1; padding has
    label 0 and probability 0."""
    n = len(starts)
    counts = np.asarray(counts, dtype=np.int64)
    width = max(1, int(counts.max()) if n else 1)
    column = np.arange(width)
    present = column[None, :] < counts[:, None]
    flat = (np.asarray(starts, dtype=np.int64)[:, None] + column[None, :])[present]
    labels = np.zeros((n, width), dtype=np.int64)
    raw = np.zeros((n, width), dtype=np.float64)
    labels[present] = cand_labels[flat]
    raw[present] = weights[flat]
    if temperature is not None and temperature > 0 and temperature != 1:
        # N^(1/T) scaled by the row's largest N first: the same distribution, without the overflow of, say,
        # 600^(1/0.01) (dlshogi's plain pow would give inf/inf there)
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = raw / raw.max(axis=1, keepdims=True)
        raw = np.power(np.nan_to_num(scaled, nan=0.0), 1.0 / temperature)
    top_column = raw.argmax(axis=1) if n else np.zeros(0, np.int64)
    top = labels[np.arange(n), top_column]
    total = raw.sum(axis=1)
    usable = total > 0
    if temperature is not None and temperature == 0:
        probs = np.zeros((n, width), dtype=np.float64)
        probs[np.arange(n), top_column] = 1.0
    else:
        probs = raw / np.where(usable, total, 1.0)[:, None]
    # rows with nothing to go by: one-hot on the selected move
    labels[~usable] = 0
    probs[~usable] = 0.0
    labels[~usable, 0] = fallback[~usable]
    probs[~usable, 0] = 1.0
    top = np.where(usable, top, fallback).astype(np.int64)
    if (labels >= POLICY_CLASSES).any():  # labels come from make_move_label; never trust a cache blindly
        row = int(np.flatnonzero((labels >= POLICY_CLASSES).any(axis=1))[0])
        raise LabelOutOfRange(row, f"policy label {int(labels[row].max())} out of range (0-{POLICY_CLASSES - 1})")
    return labels, probs.astype(np.float32), top


class LabelOutOfRange(UserError):
    """A policy label past the last class, from a cache's row `row` (the caller names the cache)."""

    def __init__(self, row: int, text: str):
        super().__init__(text)
        self.row = row


class Hcpe3File:
    """An hcpe3 file: `games()` reads it as stored; `positions()` gives its decoded (cached) positions."""

    def __init__(self, path: str | os.PathLike, cache: bool = True,
                 warn: typing.Callable[[str], None] | None = None):
        self.path = Path(path)
        self.use_cache = cache
        self.warn = warn
        self._positions: Hcpe3Positions | None = None

    def games(self) -> typing.Iterator[Hcpe3Game]:
        return iter_games(self.path)

    def positions(self, progress: typing.Callable[[int, int], None] | None = None) -> Hcpe3Positions:
        if self._positions is None:
            if self.use_cache:
                header, arrays = load_or_build(self.path, self.warn, progress)
            else:
                built = build_positions(self.path, progress)
                header, arrays = {**built["meta"]}, built["arrays"]
            self._positions = Hcpe3Positions(self.path, header, arrays)
        return self._positions

    @property
    def game_count(self) -> int:
        return self.positions().games

    @property
    def position_count(self) -> int:
        return len(self.positions())


def _main(argv: list[str]) -> int:
    if argv[:1] == ["--write-cache"]:  # a child of `build_caches`
        import signal

        # Ctrl-C reaches the whole process group: the child just ends (its temp file is never the cache),
        # and the parent, not a traceback from each child, says what happened
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        return 0 if all([_build_cache_in_child(name) for name in argv[1:]]) else 1
    if not argv:
        print("usage: python -m tideborn.data.cache.hcpe3 FILE.hcpe3 ...  (decode without the cache; positions/s)")
        return 2
    for name in argv:
        started = time.perf_counter()
        try:
            built = build_positions(Path(name))
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        seconds = time.perf_counter() - started
        meta = built["meta"]
        print(f"{name}: {meta['games']:,} games, {meta['positions']:,} positions "
              f"({meta['repetitions']:,} repetitions left out), {meta['candidates']:,} candidates; "
              f"decoded in {seconds:.2f} s, {meta['positions'] / max(seconds, 1e-9):,.0f} positions/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
