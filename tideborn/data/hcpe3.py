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
it) and then flat arrays, memory-mapped when read:

| array | per | meaning |
| --- | --- | --- |
| `game_offsets` int64 | game | byte offset of each game's header in the hcpe3 file |
| `hcp` uint8 [32] | position | the position (HuffmanCodedPos), replayed with cshogi |
| `eval` int16, `move16` uint16, `result` uint8 | position | MoveInfo eval, selected move; the result byte |
| `label` uint16 | position | the selected move's policy label (`make_move_label`) |
| `game` int32, `ply` uint16 | position | which game and which of its moves (for messages) |
| `cand_offsets` int64 [N + 1] | position | where its candidates lie in the three arrays below (CSR) |
| `cand_move16`, `cand_label`, `cand_visits` uint16 | candidate | the MoveVisits, with each move's policy label |

As in dlshogi's `load_hcpe3`, a position whose selected move repeats an earlier position (a repetition draw,
superior or inferior, looking back 16 plies) is left out; the count is in the header (`repetitions`). Unlike
dlshogi, a position with `candidateNum` 0 is kept and trained one-hot on the selected move (dlshogi skips it).

A stale cache (another size, mtime or content of the source, or another format version) is rebuilt; one that
cannot be written (a read-only directory) is built in memory, with one warning per file.

Public API: `Hcpe3File(path)` -> `.games()` (the raw games, exactly as stored), `.positions()`
(`Hcpe3Positions`, built or loaded), `.game_count`, `.position_count`; `build_positions(path)` decodes
without touching any cache; `policy_targets(...)` turns visit counts into the training distribution.

Timing the decoder: `python -m tideborn.data.hcpe3 FILE.hcpe3` decodes FILE without the cache and prints
games, positions and positions/s (the replay is pure Python over cshogi; see docs/data.md for figures).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import time
import typing
from array import array as typed_array
from dataclasses import dataclass
from pathlib import Path

import cshogi
import numpy as np
from cshogi.dlshogi import make_move_label

from tideborn.data.features import POLICY_CLASSES, sane_kings
from tideborn.data.records import readable_size, records_fingerprint
from tideborn.errors import UserError

HEADER_DTYPE = np.dtype([("hcp", np.uint8, 32), ("moveNum", "<u2"), ("result", "u1"), ("opponent", "u1")])
MOVE_INFO_DTYPE = np.dtype([("selectedMove16", "<u2"), ("eval", "<i2"), ("candidateNum", "<u2")])
MOVE_VISITS_DTYPE = np.dtype([("move16", "<u2"), ("visitNum", "<u2")])
HEADER_SIZE, MOVE_INFO_SIZE, MOVE_VISITS_SIZE = 36, 6, 4
RESULT_MASK = 0x3
"""The result byte's bits 0-1: the game's result (cshogi's DRAW 0, BLACK_WIN 1, WHITE_WIN 2)."""
RESULT_FLAGS = {"sennichite": 0x4, "nyugyoku": 0x8, "max_moves": 0x10}
REPETITIONS_SKIPPED = (cshogi.REPETITION_DRAW, cshogi.REPETITION_SUPERIOR, cshogi.REPETITION_INFERIOR)
REPETITION_PLIES = 16
"""dlshogi's `moveIsDraw(move, 16)`: how far back a repetition is looked for."""

CACHE_FORMAT = "tideborn-hcpe3-positions"
CACHE_VERSION = 2
CACHE_HEADER_BYTES = 4096
_ALIGN = 64
_warned_unwritable: set[str] = set()


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


def _map(path: Path) -> tuple[mmap.mmap | bytes, int]:
    size = check_hcpe3_file(path)
    with open(path, "rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ), size


def check_hcpe3_file(path: Path) -> int:
    """The size of hcpe3 file `path`, after checking it is a readable regular file holding a first game header."""
    size = readable_size(path, "hcpe3")
    if size == 0:
        raise UserError(f"{path}: is empty (0 bytes); an hcpe3 file holds games of a {HEADER_SIZE}-byte header "
                        f"and the moves")
    if size < HEADER_SIZE:
        raise _truncated(Path(path), 0, 0, "game header", HEADER_SIZE, size)
    return size


def _truncated(path: Path, game: int, offset: int, what: str, need: int, size: int, at: int | None = None
               ) -> UserError:
    return UserError(f"{path}: game {game} (byte {offset}): truncated {what}: needs {need} bytes at byte "
                     f"{offset if at is None else at}, the file ends at {size}; the file is cut short or is not hcpe3")


def iter_games(path: Path) -> typing.Iterator[Hcpe3Game]:
    """The games of `path` as stored (no replay), checking only that each lies whole within the file."""
    path = Path(path)
    buffer, size = _map(path)
    try:
        offset, game = 0, 0
        while offset < size:
            if size - offset < HEADER_SIZE:
                raise _truncated(path, game, offset, "game header", HEADER_SIZE, size)
            header = np.frombuffer(buffer, HEADER_DTYPE, 1, offset)[0]
            move_num = int(header["moveNum"])
            p = offset + HEADER_SIZE
            infos = np.empty(move_num, MOVE_INFO_DTYPE)
            candidates = []
            for i in range(move_num):
                if p + MOVE_INFO_SIZE > size:
                    raise _truncated(path, game, offset, f"move {i} of {move_num}", MOVE_INFO_SIZE, size, p)
                infos[i] = np.frombuffer(buffer, MOVE_INFO_DTYPE, 1, p)[0]
                p += MOVE_INFO_SIZE
                count = int(infos[i]["candidateNum"])
                if p + count * MOVE_VISITS_SIZE > size:
                    raise UserError(f"{path}: game {game} (byte {offset}): move {i}: candidateNum {count} "
                                    f"reaches past the end of the file (byte {p + count * MOVE_VISITS_SIZE} of "
                                    f"{size}); the file is cut short or is not hcpe3")
                candidates.append(np.frombuffer(buffer, MOVE_VISITS_DTYPE, count, p).copy())
                p += count * MOVE_VISITS_SIZE
            yield Hcpe3Game(offset, np.array(header["hcp"]), move_num, int(header["result"]),
                            int(header["opponent"]), infos, candidates)
            offset, game = p, game + 1
    finally:
        # numpy views of the map may still be alive here (closing it would raise BufferError); the map
        # is unmapped when the last of them goes.
        del buffer


def build_positions(path: Path, progress: typing.Callable[[int, int], None] | None = None) -> dict:
    """Replay every game of `path` with cshogi: the cache's arrays (see the module docstring) and its meta.

    A malformed game (truncated, a result byte out of range, an undecodable start position, an empty or
    illegal selected move, a candidate that is not a legal move) is a `UserError` naming the file, the game
    and its byte offset. `progress(bytes_done, size)` is called now and then."""
    path = Path(path)
    buffer, size = _map(path)
    unpack_info = struct.Struct("<HhH").unpack_from
    board = cshogi.Board()
    # Compact typed buffers (2 bytes a candidate field), not lists of Python ints: a large file has
    # hundreds of millions of candidates.
    game_offsets, hcps = typed_array("q"), bytearray()
    evals, moves16, results, labels = typed_array("h"), typed_array("H"), typed_array("B"), typed_array("H")
    games_of, plies, cand_counts = typed_array("i"), typed_array("H"), typed_array("q")
    cand_moves, cand_visits, cand_labels = typed_array("H"), typed_array("H"), typed_array("H")
    repetitions = 0
    hcp_buffer = np.empty(32, np.uint8)
    push, to_hcp, from_move16, is_legal = board.push, board.to_hcp, board.move_from_move16, board.is_legal
    try:
        offset, game = 0, 0
        while offset < size:
            where = f"{path}: game {game} (byte {offset})"
            if size - offset < HEADER_SIZE:
                raise _truncated(path, game, offset, "game header", HEADER_SIZE, size)
            start = np.frombuffer(buffer, np.uint8, 32, offset).copy()
            move_num, result, _ = struct.unpack_from("<HBB", buffer, offset + 32)
            if result & RESULT_MASK not in (cshogi.DRAW, cshogi.BLACK_WIN, cshogi.WHITE_WIN):
                raise UserError(f"{where}: result byte {result:#04x} out of range (bits 0-1 must be 0 draw, "
                                f"1 black win or 2 white win); the file is not hcpe3 or is misaligned")
            if not sane_kings(start.reshape(1, 32))[0]:
                raise UserError(f"{where}: undecodable start position (king squares off the board); the file "
                                f"is not hcpe3 or is misaligned")
            try:
                board.set_hcp(start)
            except RuntimeError as exc:
                raise UserError(f"{where}: undecodable start position ({exc})") from None
            game_offsets.append(offset)
            p = offset + HEADER_SIZE
            for i in range(move_num):
                if p + MOVE_INFO_SIZE > size:
                    raise _truncated(path, game, offset, f"move {i} of {move_num}", MOVE_INFO_SIZE, size, p)
                selected, evaluation, count = unpack_info(buffer, p)
                p += MOVE_INFO_SIZE
                if p + count * MOVE_VISITS_SIZE > size:
                    raise UserError(f"{where}: move {i}: candidateNum {count} reaches past the end of the file "
                                    f"(byte {p + count * MOVE_VISITS_SIZE} of {size}); the file is cut short or "
                                    f"is not hcpe3")
                pairs = struct.unpack_from(f"<{2 * count}H", buffer, p) if count else ()
                p += count * MOVE_VISITS_SIZE
                move = from_move16(selected) if selected else 0
                if not move or not is_legal(move):
                    what = "empty" if not selected else f"{selected:#06x}, illegal"
                    raise UserError(f"{where}: move {i} of {move_num}: selected move {what} in the replayed "
                                    f"position ({board.sfen()}); the file is corrupt or misaligned")
                turn = board.turn
                candidates = pairs[0::2]
                if count:
                    legal = {m & 0xFFFF for m in board.legal_moves}
                    for candidate in candidates:
                        if candidate not in legal:
                            raise UserError(f"{where}: move {i} of {move_num}: candidate {candidate:#06x} is not "
                                            f"a legal move in the replayed position ({board.sfen()})")
                to_hcp(hcp_buffer)
                push(move)
                # After the move, not `move_is_draw(move, 16)` before it: cshogi's `move_is_draw` misses the
                # superior and inferior repetitions (a returned position with more or fewer pieces in hand),
                # which dlshogi's `moveIsDraw` finds and skips; `is_draw` after the move finds all three.
                if board.is_draw(REPETITION_PLIES) in REPETITIONS_SKIPPED:
                    repetitions += 1
                else:
                    hcps += hcp_buffer.tobytes()
                    evals.append(evaluation)
                    moves16.append(selected)
                    results.append(result)
                    labels.append(make_move_label(selected, turn))
                    games_of.append(game)
                    plies.append(i)
                    cand_counts.append(count)
                    if count:
                        cand_moves.extend(candidates)
                        cand_visits.extend(pairs[1::2])
                        cand_labels.extend([make_move_label(m, turn) for m in candidates])
            offset, game = p, game + 1
            if progress is not None and game % 256 == 0:
                progress(offset, size)
    finally:
        # numpy views of the map may still be alive here (closing it would raise BufferError); the map
        # is unmapped when the last of them goes.
        del buffer
    if progress is not None:
        progress(size, size)
    n = len(evals)

    def as_numpy(values: typed_array, dtype: type) -> np.ndarray:
        return np.frombuffer(values, dtype=values.typecode).astype(dtype, copy=False) if len(values) \
            else np.empty(0, dtype)

    arrays = {
        "game_offsets": as_numpy(game_offsets, np.int64),
        "hcp": np.frombuffer(hcps, dtype=np.uint8).reshape(n, 32),
        "eval": as_numpy(evals, np.int16),
        "move16": as_numpy(moves16, np.uint16),
        "result": as_numpy(results, np.uint8),
        "label": as_numpy(labels, np.uint16),
        "game": as_numpy(games_of, np.int32),
        "ply": as_numpy(plies, np.uint16),
        "cand_offsets": np.concatenate([[0], np.cumsum(as_numpy(cand_counts, np.int64))]).astype(np.int64),
        "cand_move16": as_numpy(cand_moves, np.uint16),
        "cand_label": as_numpy(cand_labels, np.uint16),
        "cand_visits": as_numpy(cand_visits, np.uint16),
    }
    meta = {"games": len(game_offsets), "positions": n, "repetitions": repetitions,
            "candidates": len(cand_moves)}
    return {"meta": meta, "arrays": arrays}


def source_fingerprint(path: Path) -> dict:
    """What the cache was built from: size, mtime (ns) and a digest of 64 pieces of the file."""
    facts = os.stat(path)
    return {"size": facts.st_size, "mtime_ns": facts.st_mtime_ns, "digest": records_fingerprint(path)}


def write_arrays(path: Path, meta: dict, arrays: dict[str, np.ndarray], fmt: str) -> None:
    """Write `arrays` in the cache layout (JSON header, aligned flat arrays) to `path`, atomically: a temp
    file beside it, fsynced, renamed over it (`StagedOutputs`)."""
    from tideborn.outputs import StagedOutputs

    layout, offset = {}, CACHE_HEADER_BYTES
    for name, array in arrays.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        layout[name] = [offset, array.dtype.str, list(array.shape)]
        offset += array.nbytes
    header = json.dumps({"format": fmt, "version": CACHE_VERSION, **meta, "arrays": layout,
                         "bytes": offset}).encode() + b"\n"
    if len(header) > CACHE_HEADER_BYTES:
        raise ValueError("cache header too long")

    def fill(handle: typing.BinaryIO) -> None:
        handle.write(header.ljust(CACHE_HEADER_BYTES, b" "))
        position = CACHE_HEADER_BYTES
        for name, array in arrays.items():
            start = layout[name][0]
            handle.write(b"\0" * (start - position))
            handle.write(np.ascontiguousarray(array).tobytes())
            position = start + array.nbytes

    with StagedOutputs() as staged:
        staged.write(path, fill)
        staged.publish()


def read_arrays(path: Path, fmt: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """(header, memory-mapped arrays) of a cache file, or None when it is missing, of another format or
    version, or not whole."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(CACHE_HEADER_BYTES)
            size = os.fstat(handle.fileno()).st_size
        header = json.loads(head.split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("format") != fmt or header.get("version") != CACHE_VERSION \
            or header.get("bytes") != size:
        return None
    arrays = {}
    try:  # a damaged or foreign header (offsets past the end, odd dtypes) is a stale cache: rebuilt
        for name, (offset, dtype, shape) in header["arrays"].items():
            count = int(np.prod(shape)) if shape else 1
            if count == 0:
                arrays[name] = np.empty(shape, dtype=np.dtype(dtype))
            else:
                arrays[name] = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=tuple(shape))
    except (TypeError, ValueError, KeyError, AttributeError, OSError):
        return None
    if not _consistent(header, arrays):
        return None
    return header, arrays


def _consistent(header: dict, arrays: dict[str, np.ndarray]) -> bool:
    """The arrays agree with each other and the header (positions, CSR offsets within the candidates)."""
    try:
        positions = int(header["positions"])
        offsets = arrays["cand_offsets"]
        if len(offsets) != positions + 1 or (positions and (offsets[0] != 0 or np.any(np.diff(offsets) < 0))):
            return False
        per_position = [a for name, a in arrays.items() if name in ("hcp", "eval", "move16", "result", "label",
                                                                    "game", "ply", "winprob", "count")]
        per_candidate = [a for name, a in arrays.items() if name.startswith("cand_") and name != "cand_offsets"]
        return all(len(a) == positions for a in per_position) and \
            all(len(a) == int(offsets[-1]) for a in per_candidate)
    except (KeyError, TypeError, ValueError):
        return False


def _warn_once(key: str, text: str, warn: typing.Callable[[str], None] | None) -> None:
    if key in _warned_unwritable:
        return
    _warned_unwritable.add(key)
    (warn or (lambda line: print(f"warning: {line}", file=sys.stderr)))(text)


def load_or_build(path: Path, warn: typing.Callable[[str], None] | None = None,
                  progress: typing.Callable[[int, int], None] | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """The positions cache of `path`: read if it matches the file, else built (and written when possible)."""
    path = Path(path)
    readable_size(path, "hcpe3")
    fingerprint = source_fingerprint(path)
    cache = cache_path(path)
    found = read_arrays(cache, CACHE_FORMAT)
    if found is not None and found[0].get("source") == fingerprint:
        return found
    if progress is None:  # in the trainer: say why the start takes a while (once per file and version)
        print(f"hcpe3: decoding {path} ({fingerprint['size']:,} bytes) into {cache} (once)", flush=True)
    built = build_positions(path, progress)
    meta = {**built["meta"], "source": fingerprint}
    try:
        write_arrays(cache, meta, built["arrays"], CACHE_FORMAT)
    except UserError as exc:
        _warn_once(str(cache), f"{path}: decoded in memory, the positions cache could not be written ({exc}); "
                   f"every run decodes it again", warn)
        return {"format": CACHE_FORMAT, "version": CACHE_VERSION, **meta}, built["arrays"]
    found = read_arrays(cache, CACHE_FORMAT)
    if found is None:  # written but unreadable (replaced meanwhile?): use what was built
        return {"format": CACHE_FORMAT, "version": CACHE_VERSION, **meta}, built["arrays"]
    return found


class Hcpe3Positions:
    """The decoded positions of one hcpe3 file (memory-mapped cache arrays); see the module docstring."""

    def __init__(self, path: Path, header: dict, arrays: dict[str, np.ndarray]):
        self.path = Path(path)
        self.header = header
        self._set_arrays(arrays)
        self.games = int(header["games"])
        self.repetitions = int(header["repetitions"])

    def _set_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        for name, array in arrays.items():
            setattr(self, name, array)

    def __getstate__(self) -> dict:
        """Pickles (for worker processes that are not forked) without the arrays when they are mapped from
        the cache: the other process maps the same file."""
        mapped = all(isinstance(a, np.memmap) or a.size == 0 for a in self.arrays.values())
        if not mapped:
            return dict(self.__dict__)
        return {"path": self.path, "header": self.header, "games": self.games, "repetitions": self.repetitions,
                "mapped": True}

    def __setstate__(self, state: dict) -> None:
        mapped = state.pop("mapped", False)
        self.__dict__.update(state)
        if mapped:
            found = read_arrays(cache_path(self.path), CACHE_FORMAT)
            if found is None or found[0].get("source") != self.header.get("source"):
                raise UserError(f"{cache_path(self.path)}: the positions cache of {self.path} changed or went away "
                                f"while the run used it; restart the run")
            self._set_arrays(found[1])

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

    def candidates(self, index: int) -> np.ndarray:
        """Position `index`'s MoveVisits (move16, visitNum) as stored."""
        start, stop = int(self.cand_offsets[index]), int(self.cand_offsets[index + 1])
        out = np.empty(stop - start, MOVE_VISITS_DTYPE)
        out["move16"], out["visitNum"] = self.cand_move16[start:stop], self.cand_visits[start:stop]
        return out

    def targets(self, indices: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(labels [n, K] int64, probabilities [n, K] float32, most visited label [n] int64) of `indices`."""
        indices = np.asarray(indices, dtype=np.int64)
        starts, stops = self.cand_offsets[indices], self.cand_offsets[indices + 1]
        return policy_targets(starts, stops - starts, self.cand_label, self.cand_visits.astype(np.float64),
                              self.label[indices].astype(np.int64), temperature)

    def describe(self, index: int) -> str:
        return f"{self.path}: game {int(self.game[index])} move {int(self.ply[index])}"


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
        raise UserError("policy label out of range in decoded hcpe3 data; delete the .positions cache files")
    return labels, probs.astype(np.float32), top


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
    if not argv:
        print("usage: python -m tideborn.data.hcpe3 FILE.hcpe3 ...  (decode without the cache; positions/s)")
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
