"""Duplicate-position averaging (`data.use_average`, dlshogi's `--use_average`): identical positions across
all training files become one, whose targets are the averages of the duplicates'.

Key: the packed position, HuffmanCodedPos (what dlshogi keys by). hcpe and hcpe3 positions are hcp already;
psv positions are converted with cshogi (`set_psfen`, `to_hcp`), so a position in a psv file and the same
position in an hcpe file merge. Per merged position, as in dlshogi's `load_hcpe3` + `hcpe3_decode_with_value`:

- policy: the sum of the duplicates' distributions divided by their count (hcpe/psv records count as
  one-hot on their move; hcpe3 positions as their visit distribution at `data.policy_temperature`);
- value: the mean of `sigmoid(eval / data.eval_scale)`; result: the mean of the side to move's result. The
  value target is `(1 - lambda) * mean result + lambda * mean sigmoid`, the mean of the duplicates' targets.

Records that training would skip (an empty or illegal move; `data.bad_records`) are left out (or stop the
run, with `error`). The merged set is built in bounded memory by an external sort/merge in chunks on disk
(`average_merge`; merged positions in the order of their packed bytes) and written once as a cache beside the
first training file,
`.NAME.average-DIGEST.positions`, DIGEST covering the inputs' paths and the options the set depends on
(temperature, eval scales, bad-record handling). The cache is used only when every input's content is the
one it was built from (`input_identities`): for an hcpe3 file, the whole-content hash its positions cache
carries (checked against the file by `hcpe3.load_or_build`); for an hcpe or psv file, a whole-content hash
kept in the merged set's header, trusted while the file is the very one it was hashed from (device, inode,
ctime: a change in place moves the ctime, which, unlike the mtime, cannot be set back) and computed again
otherwise. Size, mtime and sampled pieces alone are not enough: results flipped in place at the same size,
with the mtime restored, leave them all as they were. The training process reports inputs and merged
positions in `run_started` (`data`).
"""

from __future__ import annotations

import hashlib
import json
import typing
from pathlib import Path

import cshogi
import numpy as np
from cshogi.dlshogi import make_move_label

from tideborn.data.cache.cachefile import CacheArray, DamagedCache, HostileCache, close_arrays, warn_about_cache
from tideborn.data.cache.hcpe3 import (
    RESULT_MASK,
    LabelOutOfRange,
    _rows,
    content_hash,
    policy_targets,
    read_arrays,
    source_fingerprint,
    source_identity,
    trusted_owners,
    write_arrays,
)
from tideborn.data.cache.hcpe3_compact import labels_of
from tideborn.data.decode.features import (
    BadRecord,
    DecodedBatch,
    evals_for_side_to_move,
    packed_positions,
    results_for_side_to_move,
    sane_kings,
    stored_move,
)
from tideborn.data.sets.average_merge import ExternalMerge, Scratch, ScratchUnwritable, SpooledArray
from tideborn.errors import UserError

if typing.TYPE_CHECKING:
    from tideborn.config.schema import DataSettings
    from tideborn.data.sets.sources import BatchDecoder, TeacherSource

CACHE_FORMAT = "tideborn-averaged-positions"
CHUNK = 65536


def _sigmoid(evals: np.ndarray, eval_scale: float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(evals, dtype=np.float64) / eval_scale))


class _Entries:
    """The input positions as they are read (`add`: per position its key, result and win probability; per
    policy entry its position among them, label, move16 and probability), merged by `average_merge`."""

    def __init__(self, merge: ExternalMerge) -> None:
        self.merge = merge
        self.count = 0
        self.skipped = 0

    def add(self, hcp, result, winprob, entry_pos, entry_label, entry_move16, entry_prob) -> None:
        hcp = np.asarray(hcp, dtype=np.uint8).reshape(-1, 32)
        self.merge.add(hcp, np.asarray(result, dtype=np.float64), np.asarray(winprob, dtype=np.float64),
                       np.asarray(entry_pos, dtype=np.int64), np.asarray(entry_label, dtype=np.int64),
                       np.asarray(entry_move16, dtype=np.uint16), np.asarray(entry_prob, dtype=np.float64))
        self.count += len(hcp)


def _add_records(entries: _Entries, part, data: DataSettings, scales: dict[str, float] | None) -> None:
    """hcpe or psv records: one-hot on the move; psv positions re-packed as hcp."""
    file_scale = np.array([scales[str(p)] if scales else data.eval_scale for p in part.records.paths])
    records_set = part.records
    kind = part.kind
    board = cshogi.Board()
    set_position = board.set_hcp if kind == "hcpe" else board.set_psfen
    from_stored = board.move_from_move16 if kind == "hcpe" else board.move_from_psv
    for start in range(0, len(records_set), CHUNK):
        indices = np.arange(start, min(start + CHUNK, len(records_set)), dtype=np.int64)
        records = records_set.read(indices)
        packed = packed_positions(records)
        results = results_for_side_to_move(records, kind)
        kings = sane_kings(packed)
        moves = stored_move(records, kind).tolist()
        keep = np.zeros(len(records), dtype=bool)
        hcp = np.zeros((len(records), 32), dtype=np.uint8)
        labels = np.zeros(len(records), dtype=np.int64)
        moves16 = np.zeros(len(records), dtype=np.uint16)
        for i in range(len(records)):
            where = records_set.describe(int(indices[i]))
            if not kings[i] or np.isnan(results[i]):
                reason = "undecodable position (king squares off the board)" if not kings[i] else \
                    "game result out of range"
                raise UserError(f"{where}: {reason}")
            try:
                set_position(packed[i])
            except RuntimeError as exc:
                raise UserError(f"{where}: undecodable position ({exc})") from None
            move = from_stored(moves[i]) if moves[i] else 0
            if not move or not board.is_legal(move):
                if data.bad_records == "error":
                    raise UserError(f"{where}: {'empty move' if not moves[i] else 'illegal move'} "
                                    f"(data.bad_records=\"error\")")
                entries.skipped += 1
                continue
            keep[i] = True
            if kind == "hcpe":
                hcp[i] = packed[i]
            else:
                board.to_hcp(hcp[i])
            labels[i] = make_move_label(move, board.turn)
            moves16[i] = cshogi.move16(move)
        rows = np.flatnonzero(keep)
        scale = file_scale[np.searchsorted(records_set.offsets, indices[rows], side="right") - 1]
        entries.add(hcp[rows], results[rows], _sigmoid(evals_for_side_to_move(records, kind)[rows], scale),
                    np.arange(len(rows)), labels[rows], moves16[rows], np.ones(len(rows)))


def _add_hcpe3(entries: _Entries, part, data: DataSettings, scales: dict[str, float] | None) -> None:
    """hcpe3 positions: their visit distributions at `data.policy_temperature`."""
    for positions in part.files:
        scale = scales[str(positions.path)] if scales else data.eval_scale
        for start in range(0, len(positions), CHUNK):
            index = np.arange(start, min(start + CHUNK, len(positions)), dtype=np.int64)
            hcp = np.asarray(positions.hcp[index])
            turn = (hcp[:, 0] & 1).astype(np.int64)
            stored = (np.asarray(positions.result[index]) & RESULT_MASK).astype(np.int64)
            result = np.where(stored == cshogi.DRAW, 0.5,
                              np.where((stored == cshogi.BLACK_WIN) == (turn == cshogi.BLACK), 1.0, 0.0))
            # the chunk's candidates are one contiguous range of the candidate arrays: read just that
            bounds = np.asarray(positions.cand_offsets[index[0]:index[-1] + 2]).astype(np.int64)
            base = int(bounds[0])
            starts, counts = bounds[:-1] - base, np.diff(bounds)
            cand_visits = np.asarray(positions.cand_visits[base:int(bounds[-1])])
            cand_move16 = np.asarray(positions.cand_move16[base:int(bounds[-1])])
            cand_label = labels_of(np.repeat(turn, counts), cand_move16)  # as the decoder labels them
            selected = np.asarray(positions.move16[index])
            try:
                labels, probs, _ = policy_targets(starts, counts, cand_label, cand_visits.astype(np.float64),
                                                  positions.label[index].astype(np.int64), data.policy_temperature)
            except LabelOutOfRange as bad:
                raise positions.damaged(str(bad), int(index[bad.row])) from None
            # move16 of each target column: the candidate's; the selected move's in a one-hot fallback row
            width = labels.shape[1]
            column = np.arange(width)
            present = column[None, :] < counts[:, None]
            flat = (starts[:, None] + column[None, :])[present]
            move16 = np.zeros((len(index), width), dtype=np.uint16)
            visits = np.zeros((len(index), width), dtype=np.float64)
            move16[present], visits[present] = cand_move16[flat], cand_visits[flat]
            fallback = visits.sum(axis=1) == 0
            move16[fallback] = 0
            move16[fallback, 0] = selected[fallback]
            nonzero = probs > 0
            pos = np.broadcast_to(np.arange(len(index))[:, None], labels.shape)
            entries.add(hcp, result, _sigmoid(positions.eval[index], scale), pos[nonzero],
                        labels[nonzero], move16[nonzero], probs[nonzero])


def average_key(source: TeacherSource, data: DataSettings, scales: dict[str, float] | None = None) -> str:
    """The digest of what names the merged set: its inputs' paths and the options it depends on. Their
    contents are checked apart (`input_identities`), so that an input changed in place needs no rehash of
    the others to be seen."""
    inputs = [str(Path(p).resolve()) for p in source.paths]
    text = json.dumps({"inputs": inputs, "temperature": data.policy_temperature, "eval_scale": data.eval_scale,
                       "file_scales": scales, "bad_records": data.bad_records, "version": 2}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def input_identities(source: TeacherSource, known: typing.Any = None) -> list[dict]:
    """Each input's path, fingerprint and whole-content hash, in `source.paths` order. An hcpe3 file's hash is
    the one its positions cache carries (already checked against the file). An hcpe or psv file's is taken
    from `known` (a merged set's header) when the file is the one it was hashed from (the same device, inode
    and ctime) and its fingerprint agrees; else the whole file is read to hash it. Its identity is taken
    before it is read, so a change during the read leaves a ctime that no later run trusts."""
    before = {entry.get("path"): entry for entry in known if isinstance(entry, dict)} \
        if isinstance(known, list) else {}
    hcpe3 = {str(positions.path): positions for part in source.parts if part.kind == "hcpe3"
             for positions in part.files}
    kinds = {str(p): part.kind for part in source.parts if part.kind != "hcpe3" for p in part.records.paths}
    found = []
    for path in map(Path, source.paths):
        entry = {"path": str(path.resolve()), "fingerprint": source_fingerprint(path)}
        if str(path) in hcpe3:
            header = hcpe3[str(path)].header
            entry["content"] = header.get("content") or content_hash(path)
        else:
            entry["identity"] = source_identity(path)
            old = before.get(entry["path"], {})
            same = old.get("identity") == entry["identity"] and old.get("fingerprint") == entry["fingerprint"]
            entry["content"] = old["content"] if same and isinstance(old.get("content"), str) else \
                content_hash(path, kinds.get(str(path), "teacher"))
        found.append(entry)
    return found


def _same_contents(header: dict, inputs: list[dict]) -> bool:
    def content(entries: typing.Any) -> list:
        return [[e.get("path"), e.get("content")] for e in entries] if isinstance(entries, list) else []

    return content(header.get("input_files")) == content(inputs)


def average_cache_path(source: TeacherSource, key: str) -> Path:
    first = Path(source.paths[0])
    return first.with_name(f".{first.name}.average-{key[:16]}.positions")


def build_average(source: TeacherSource, data: DataSettings, scales: dict[str, float] | None = None,
                  scratch_beside: Path | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of the merged set of `source`'s positions, in memory; `scales`: each file's eval scale
    by path (`data.eval_scale_fit = "per_file"`), else `data.eval_scale` for all. With `scratch_beside`, the
    runs of the merge go to scratch files beside that path (`average_merge`), and only the result is read
    into memory; `merge_to_arrays` leaves it on disk too."""
    scratch = Scratch(scratch_beside)
    try:
        meta, spooled = merge_to_arrays(source, data, scales, scratch)
        return meta, {name: array.array() for name, array in spooled.items()}
    finally:
        scratch.close()


def merge_to_arrays(source: TeacherSource, data: DataSettings, scales: dict[str, float] | None,
                    scratch: Scratch) -> tuple[dict, dict[str, SpooledArray]]:
    """(meta, the merged set's arrays spooled in `scratch`): an external sort/merge by packed position in
    chunks of `average_merge.CHUNK_POSITIONS` inputs, so that memory stays bounded at any number of inputs
    and of distinct positions. Per merged position, in key order: hcp, result, winprob (the means), count,
    label and move16 (the most likely move, first of equals by label), and its policy in CSR form
    (cand_offsets, cand_label, cand_prob)."""
    entries = _Entries(ExternalMerge(scratch))
    for part in source.parts:
        if part.kind == "hcpe3":
            _add_hcpe3(entries, part, data, scales)
        else:
            _add_records(entries, part, data, scales)
    if entries.count == 0:
        raise UserError("data.train: no usable position to average (every record was skipped)")
    arrays = entries.merge.finish()
    merged = arrays["hcp"].rows
    meta = {"inputs": int(entries.count), "positions": merged, "merged": int(entries.count - merged),
            "skipped": int(entries.skipped)}
    return meta, arrays


def _build_cache(source: TeacherSource, data: DataSettings, scales: dict[str, float] | None, path: Path, key: str,
                 inputs: list[dict], hostile: str | None, say: typing.Callable[[str], None],
                 owners: set[int]) -> tuple[dict, dict]:
    """Merge `source` into the cache at `path` (runs and arrays in scratch files beside it, then the cache
    written whole) and open it; in memory, with a warning, where the cache or its scratch files cannot be
    written (a hostile entry, a read-only directory, a full disk)."""
    what = "the averaged positions of data.train"

    def in_memory() -> tuple[dict, dict]:
        meta, arrays = build_average(source, data, scales)
        meta["key"], meta["input_files"] = key, inputs
        return meta, arrays

    if hostile:  # a link, FIFO, directory or someone else's file: left alone, never written through
        say(f"{path} {hostile}: not used; averaged in memory (every run averages again until it is removed)")
        return in_memory()
    scratch = Scratch(path)
    try:
        try:
            meta, spooled = merge_to_arrays(source, data, scales, scratch)
        except ScratchUnwritable as exc:
            say(f"{path}: the averaged positions could not be cached ({exc}); averaged in memory")
            scratch.close()
            return in_memory()
        meta["key"], meta["input_files"] = key, inputs
        try:
            write_arrays(path, meta, spooled, CACHE_FORMAT)
            found = read_arrays(path, CACHE_FORMAT, what, owners)
        except UserError as exc:
            say(f"{path}: the averaged positions could not be cached ({exc}); averaged in memory")
            found = None
        except (HostileCache, DamagedCache):
            found = None  # replaced by something else since it was written: use what was built
        if found is not None and found[0].get("key") == key and _same_contents(found[0], inputs):
            return found
        # not written, or replaced since by something else: use what was built
        return meta, {name: array.array() for name, array in spooled.items()}
    finally:
        scratch.close()


class AveragedPart:
    """The merged positions (cache arrays read by `pread` as batches need them, or arrays in memory),
    decoded like hcpe with averaged targets. Pickles small: the arrays name their cache file."""

    kind = "average"

    def __init__(self, path: Path, paths: list[Path], header: dict, arrays: dict[str, np.ndarray]):
        self.path = path
        self.paths = paths
        self.header = header
        self.arrays = arrays

    def __len__(self) -> int:
        return int(self.header["positions"])

    def decode(self, decoder: BatchDecoder, local: np.ndarray, planes: np.ndarray | None) -> DecodedBatch:
        a = self.arrays
        records = np.zeros(len(local), dtype=cshogi.HuffmanCodedPosAndEval)
        records["hcp"] = a["hcp"][local]
        records["bestMove16"] = a["move16"][local].view(np.int16)
        try:
            batch = decoder.decoder("hcpe").decode(records, planes)
        except BadRecord as bad:
            raise self.damaged(bad.reason, int(local[bad.position])) from None
        if batch.skipped:
            raise self.damaged(batch.skipped[0][1], int(local[batch.skipped[0][0]]))
        bounds = _rows(a["cand_offsets"], local, 2).reshape(len(local), 2).astype(np.int64)
        starts, counts = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
        if len(local) and ((counts < 0).any() or starts.min() < 0 or (starts + counts).max() > len(a["cand_label"])):
            raise self.damaged("candidate offsets out of order")
        # only these positions' candidates are read, not the whole arrays
        local_starts = (np.cumsum(counts) - counts).astype(np.int64)
        try:
            labels, probs, top = policy_targets(local_starts, counts, _rows(a["cand_label"], starts, counts),
                                                _rows(a["cand_prob"], starts, counts).astype(np.float64),
                                                a["label"][local].astype(np.int64), None)
        except LabelOutOfRange as bad:
            raise self.damaged(str(bad), int(local[bad.row])) from None
        result = np.asarray(a["result"][local], dtype=np.float32)
        lam = decoder.value_lambda
        value = ((1.0 - lam) * result.astype(np.float64) + lam * a["winprob"][local]).astype(np.float32)
        return DecodedBatch(batch.features1, batch.features2, a["label"][local].astype(np.int64), value, result,
                            np.asarray(a["winprob"][local], dtype=np.float32), [], labels, probs)

    def describe(self, local: int) -> str:
        return f"{self.path}: averaged position {local}"

    def damaged(self, reason: str, local: int | None = None) -> UserError:
        """A merged position that fails a check: every input record was checked as it was merged, so it is the
        merged set's fault (changed since it was opened), named as that file."""
        where = "" if local is None else f" at averaged position {local}"
        if not isinstance(self.arrays.get("hcp"), CacheArray):
            return UserError(f"data.train: the averaged positions in memory fail a check{where}: {reason}")
        return UserError(f"{self.path}: the averaged positions of data.train are damaged{where}: {reason}; delete "
                         f"it and resume: it is built again")

    def close(self) -> None:
        close_arrays(self.arrays.values())


def averaged_source(source: TeacherSource, data: DataSettings, warn: typing.Callable[[str], None] | None = None,
                    scales: dict[str, float] | None = None) -> TeacherSource:
    """`source`'s positions with duplicates merged: read from the cache when it is there, else built (and
    written beside the first training file; in memory, with a warning, where that cannot be written)."""
    from tideborn.data.sets.sources import TeacherSource

    key = average_key(source, data, scales)
    path = average_cache_path(source, key)

    def say(text: str) -> None:
        warn_about_cache(text, warn)

    what, owners = "the averaged positions of data.train", trusted_owners(*source.paths)
    hostile = None
    try:
        found = read_arrays(path, CACHE_FORMAT, what, owners)
    except HostileCache as exc:
        found, hostile = None, str(exc)
    except DamagedCache as exc:
        found = None
        say(f"{path}: {what} is damaged ({exc}); it is built again")
    inputs = input_identities(source, None if found is None else found[0].get("input_files"))

    def current(cached: tuple | None) -> bool:
        """A merged set for these options and these very inputs' contents."""
        return cached is not None and cached[0].get("key") == key and _same_contents(cached[0], inputs)

    if not current(found):
        found = _build_cache(source, data, scales, path, key, inputs, hostile, say, owners)
    header, arrays = found
    summary = {"inputs": int(header["inputs"]), "positions": int(header["positions"]),
               "merged": int(header["merged"]), "skipped": int(header["skipped"]), "cache": str(path)}
    note = {**source.note, "positions": int(header["positions"]), "average": summary}
    source.close()
    return TeacherSource([AveragedPart(path, list(source.paths), header, arrays)], source.kind, note)
