"""Teacher positions from files of several kinds (hcpe, psv, hcpe3) as one numbered sequence, decoded in batches.

A `TeacherSource` is a list of parts, each one kind: consecutive hcpe or psv files are one `RecordPart` (a
`RecordSet`, read by `pread`), consecutive hcpe3 files one `Hcpe3Part` (their decoded positions caches,
read with `pread`), and a duplicate-averaged set (`tideborn.data.sets.average`) is one `AveragedPart`. Position `i`
of the source is position `i - offsets[p]` of part `p`, so the data order (`dataset.ShardedOrder`) treats
hcpe3 positions exactly like records.

`BatchDecoder.decode(source, indices)` decodes the positions of a batch, grouped by part (in part order, each
group in the order given: deterministic, so a resumed run sees the same batches). Policy targets are the move
label (`policy`, int64) for one-hot data; where a batch holds a distribution (hcpe3 with `data.policy_temperature`
> 0, or averaged positions) it also carries padded sparse targets, `policy_labels` [n, K] int64 and
`policy_probs` [n, K] float32, one-hot rows being a 1.0 in the first column. `policy` is then the most
likely move (the most visited one), what the top-1 accuracy is measured against.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path

import numpy as np

from tideborn.data.decode.features import BadRecord, DecodedBatch, Decoder, kept_positions, record_problems
from tideborn.data.formats.records import (
    EXTENSION_KINDS,
    RecordSet,
    check_record_file,
    expand_paths,
    stream_records,
)
from tideborn.errors import UserError

if typing.TYPE_CHECKING:
    from tideborn.config.schema import DataSettings
    from tideborn.data.cache.hcpe3 import Hcpe3Positions

FILE_KINDS = ("hcpe", "psv", "hcpe3")


def file_kind(path: str | os.PathLike, kind: str = "auto", what: str = "data.kind") -> str:
    """`hcpe`, `psv` or `hcpe3`: `kind` itself unless `auto`/`mixed`, else from `path`'s extension."""
    found = EXTENSION_KINDS.get(Path(path).suffix.lower())
    if kind in FILE_KINDS:
        # An hcpe3 file read as records (or records as hcpe3) decodes garbage, or fails on some record far in:
        # where the extension says the other layout, say so rather than read it.
        if found is not None and (found == "hcpe3") != (kind == "hcpe3"):
            raise UserError(f"{path}: {what} is \"{kind}\" but the extension says {found}; set {what} = "
                            f"\"auto\" (each file's kind from its extension) or rename the file")
        return kind
    if found is None:
        raise UserError(f"{path}: cannot tell the record format from the extension (.hcpe for hcpe; .bin or "
                        f".psv for psv; .hcpe3 for hcpe3); set {what}")
    return found


class RecordPart:
    def __init__(self, records: RecordSet):
        self.records = records
        self.kind = records.kind
        self.paths = list(records.paths)

    def __len__(self) -> int:
        return len(self.records)

    def decode(self, decoder: BatchDecoder, local: np.ndarray, planes: np.ndarray | None) -> DecodedBatch:
        scales = None
        if decoder.file_scales is not None:
            file_ids = np.searchsorted(self.records.offsets, local, side="right") - 1
            scales = np.array([decoder.file_scales[str(p)] for p in self.paths], dtype=np.float64)[file_ids]
        return decoder.decoder(self.kind).decode(self.records.read(local), planes, scales)

    def record_groups(self, local: np.ndarray) -> list[tuple[np.ndarray, str]]:
        return [(self.records.read(local), self.kind)]

    def file_samples(self, pick: typing.Callable[[int], np.ndarray]) -> typing.Iterator[tuple[Path, np.ndarray, str]]:
        """(path, records at `pick(count)` of that file, kind) for each file."""
        for file_index, path in enumerate(self.paths):
            local = pick(int(self.records.counts[file_index]))
            yield path, self.records.read(local + self.records.offsets[file_index]), self.kind

    def describe(self, local: int) -> str:
        return self.records.describe(local)

    def close(self) -> None:
        self.records.close()


class Hcpe3Part:
    """Consecutive hcpe3 files' decoded positions."""

    kind = "hcpe3"

    def __init__(self, files: list[Hcpe3Positions]):
        self.files = files
        self.paths = [f.path for f in files]
        self.offsets = np.concatenate([[0], np.cumsum([len(f) for f in files])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def decode(self, decoder: BatchDecoder, local: np.ndarray, planes: np.ndarray | None) -> DecodedBatch:
        file_ids = np.searchsorted(self.offsets, local, side="right") - 1
        pieces, done = [], 0
        for file_id in np.unique(file_ids):
            rows = np.flatnonzero(file_ids == file_id)
            positions = self.files[int(file_id)]
            within = local[rows] - self.offsets[file_id]
            scales = None
            if decoder.file_scales is not None:
                scales = np.full(len(rows), decoder.file_scales[str(positions.path)], dtype=np.float64)
            records, plan = positions.decoder_input(within)
            out = None if planes is None else planes[done:done + len(rows)]
            try:
                part = decoder.decoder("hcpe").decode(records, out, scales, plan)
            except BadRecord as bad:
                raise positions.damaged(bad.reason, int(within[bad.position])) from None
            if part.skipped:  # every game's moves were checked when decoded: a skip here is the cache's fault
                raise positions.damaged(part.skipped[0][1], int(within[part.skipped[0][0]]))
            kept = kept_positions(len(rows), part.skipped)
            labels, probs, top = positions.targets(within[kept], decoder.temperature)
            part.policy = top
            if decoder.temperature != 0:
                part.policy_labels, part.policy_probs = labels, probs
            pieces.append((rows, part))
            done += len(part)
        return _join(pieces, planes)

    def describe(self, local: int) -> str:
        file_id = int(np.searchsorted(self.offsets, local, side="right") - 1)
        return self.files[file_id].describe(int(local - self.offsets[file_id]))

    def record_groups(self, local: np.ndarray) -> list[tuple[np.ndarray, str]]:
        file_ids = np.searchsorted(self.offsets, local, side="right") - 1
        return [(self.files[int(f)].hcpe_records(local[file_ids == f] - self.offsets[f]), "hcpe")
                for f in np.unique(file_ids)]

    def file_samples(self, pick: typing.Callable[[int], np.ndarray]) -> typing.Iterator[tuple[Path, np.ndarray, str]]:
        """(path, hcpe-like records at `pick(count)` of that file's positions, "hcpe") for each file."""
        for positions in self.files:
            yield positions.path, positions.hcpe_records(pick(len(positions))), "hcpe"

    def close(self) -> None:
        from tideborn.data.cache.cachefile import close_arrays

        for positions in self.files:
            close_arrays(positions.arrays.values())


def padded_targets(batches: list[DecodedBatch]) -> tuple[np.ndarray, np.ndarray]:
    """The policy targets of decoded batches as one padded [n, K] pair, K the widest (a one-hot batch: its
    label with probability 1 in column 0)."""
    width = max(b.policy_labels.shape[1] if b.policy_labels is not None else 1 for b in batches)
    total = sum(len(b) for b in batches)
    labels, probs = np.zeros((total, width), np.int64), np.zeros((total, width), np.float32)
    start = 0
    for b in batches:
        stop = start + len(b)
        if b.policy_probs is None:
            labels[start:stop, 0], probs[start:stop, 0] = b.policy, 1.0
        else:
            k = b.policy_labels.shape[1]
            labels[start:stop, :k], probs[start:stop, :k] = b.policy_labels, b.policy_probs
        start = stop
    return labels, probs


def _join(pieces: list[tuple[np.ndarray, DecodedBatch]], planes: np.ndarray | None) -> DecodedBatch:
    """One batch from decoded pieces (rows: each piece's positions in the batch handed to `decode`). The
    board planes of each piece were written right after the previous piece's kept rows."""
    if len(pieces) == 1:
        rows, batch = pieces[0]
        if not np.array_equal(rows, np.arange(len(rows))):
            batch.skipped = [(int(rows[pos]), reason) for pos, reason in batch.skipped]
        return batch
    total = sum(len(b) for _, b in pieces)
    features1 = planes[:total] if planes is not None else np.concatenate([b.features1 for _, b in pieces])
    labels = probs = None
    if any(b.policy_probs is not None for _, b in pieces):
        labels, probs = padded_targets([b for _, b in pieces])
    return DecodedBatch(
        features1, np.concatenate([b.features2 for _, b in pieces]), np.concatenate([b.policy for _, b in pieces]),
        np.concatenate([b.value for _, b in pieces]), np.concatenate([b.result for _, b in pieces]),
        np.concatenate([b.eval_value for _, b in pieces]),
        [(int(rows[pos]), reason) for rows, b in pieces for pos, reason in b.skipped], labels, probs)


class BatchDecoder:
    """One per process: a `Decoder` per record kind, and the policy temperature for hcpe3 visit counts."""

    def __init__(self, eval_scale: float, value_lambda: float, bad_records: str = "skip", temperature: float = 1.0,
                 file_scales: dict[str, float] | None = None):
        self.eval_scale, self.value_lambda, self.bad_records = eval_scale, value_lambda, bad_records
        self.temperature = temperature
        self.file_scales = file_scales
        """Each file's eval scale by path (`data.eval_scale_fit = "per_file"`), else None: `eval_scale` for all."""
        self._decoders: dict[str, Decoder] = {}

    def decoder(self, kind: str) -> Decoder:
        if kind not in self._decoders:
            self._decoders[kind] = Decoder(kind, self.eval_scale, self.value_lambda, self.bad_records)
        return self._decoders[kind]

    def decode(self, source: TeacherSource, indices: np.ndarray, planes: np.ndarray | None = None) -> DecodedBatch:
        """Decode source positions `indices`. `BadRecord.position` is a position in `indices`; skipped
        positions are listed by their position in `indices` too. `planes`: as for `Decoder.decode`."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(source.parts) == 1:
            return source.parts[0].decode(self, indices, planes)
        part_ids = np.searchsorted(source.offsets, indices, side="right") - 1
        pieces, done = [], 0
        for part_id in np.unique(part_ids):
            rows = np.flatnonzero(part_ids == part_id)
            part = source.parts[int(part_id)]
            try:
                batch = part.decode(self, indices[rows] - source.offsets[part_id],
                                    None if planes is None else planes[done:done + len(rows)])
            except BadRecord as bad:
                raise BadRecord(int(rows[bad.position]), bad.reason) from None
            pieces.append((rows, batch))
            done += len(batch)
        return _join(pieces, planes)


class TeacherSource:
    """Teacher files of any kinds as one sequence of positions (see the module docstring)."""

    def __init__(self, parts: list, kind: str, note: dict | None = None, paths: list[Path] | None = None):
        self.parts = parts
        self.kind = kind
        """What the positions came from: `hcpe`, `psv`, `hcpe3`, `mixed`; the settings' `data.kind` when resolved."""
        self.paths = [p for part in parts for p in part.paths] if paths is None else list(paths)
        self.offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        self.note = note or {}
        """Facts for the run_started event (hcpe3 games and repetitions left out, averaging)."""

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def kinds(self) -> list[str]:
        return sorted({part.kind for part in self.parts})

    def record_groups(self, indices: np.ndarray) -> list[tuple[np.ndarray, str]]:
        """The stored records of positions `indices` (sorted), as (records, kind) groups in that order: hcpe3
        positions as hcpe records. What `BatchDecoder.decode` keeps of sorted indices is in the same order."""
        indices = np.asarray(indices, dtype=np.int64)
        part_ids = np.searchsorted(self.offsets, indices, side="right") - 1
        groups = []
        for part_id in np.unique(part_ids):
            part = self.parts[int(part_id)]
            if not hasattr(part, "record_groups"):
                raise UserError(f"{part.path}: averaged positions have no stored records to read")
            groups += part.record_groups(indices[part_ids == part_id] - self.offsets[part_id])
        return groups

    def describe(self, index: int) -> str:
        part_id = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return self.parts[part_id].describe(int(index - self.offsets[part_id]))

    def close(self) -> None:
        for part in self.parts:
            part.close()


def open_source(paths: typing.Sequence[Path], kind: str = "auto", warn: typing.Callable[[str], None] | None = None,
                what: str = "data.kind", decode: bool = True, processes: int | None = None) -> TeacherSource:
    """The files `paths` (each checked; hcpe3 ones decoded into their caches) as one `TeacherSource`.

    `decode=False` (the launcher's preflight) only checks that hcpe3 files can be read and are not empty:
    decoding a large one takes minutes, and the trainer does it (once; then the cache is read), several
    files at a time in up to `processes` child processes (default: the usable cores; `hcpe3.build_caches`)."""
    from tideborn.data.cache.hcpe3 import Hcpe3File, build_caches, check_hcpe3_file

    kinds = [file_kind(path, kind, what) for path in paths]
    if decode:
        build_caches([p for p, k in zip(paths, kinds) if k == "hcpe3"], processes)
    parts: list = []
    repetitions = games = 0
    start = 0
    while start < len(paths):
        stop = start
        while stop < len(paths) and kinds[stop] == kinds[start]:
            stop += 1
        group = list(paths[start:stop])
        if kinds[start] == "hcpe3" and not decode:
            for p in group:
                check_hcpe3_file(p)
        elif kinds[start] == "hcpe3":
            files = [Hcpe3File(p, warn=warn).positions() for p in group]
            for f in files:
                if len(f) == 0:
                    raise UserError(f"{f.path}: holds no training position ({f.games} games)")
                repetitions += f.repetitions
                games += f.games
            parts.append(Hcpe3Part(files))
        else:
            parts.append(RecordPart(RecordSet(group, kinds[start])))
        start = stop
    found = sorted(set(kinds))
    note = {"positions": 0, "files": len(paths), "kinds": found}
    if "hcpe3" in found:
        note["hcpe3"] = {"games": games, "repetitions_left_out": repetitions}
    source = TeacherSource(parts, found[0] if len(found) == 1 else "mixed", note, list(paths))
    source.note["positions"] = len(source)
    return source


def as_source(records: RecordSet | TeacherSource) -> TeacherSource:
    """A `RecordSet` as a one-part source (what `Evaluator` and tests may hand over)."""
    if isinstance(records, TeacherSource):
        return records
    return TeacherSource([RecordPart(records)], records.kind, {"positions": len(records)})


def training_source(data: DataSettings, data_root: str | os.PathLike,
                    warn: typing.Callable[[str], None] | None = None, decode: bool = True) -> TeacherSource:
    """`data.train`'s files (relative ones against `data_root`, `paths.data_root`) as one source."""
    paths = expand_paths(data.train, data_root, "data.train")
    return open_source(paths, data.kind, warn, decode=decode)


def watched_patterns(data: DataSettings, data_root: str | os.PathLike) -> list[str]:
    """`data.train` as absolute paths or globs (relative ones against `data_root`), for `data.watch`."""
    root = Path(data_root)
    return [str(Path(p).expanduser() if Path(p).expanduser().is_absolute() else root / p) for p in data.train]


VERIFY_CHUNK = 65536
"""Records checked at a time as a watched file joins (`count_file`)."""


def count_file(path: Path, kind: str = "auto") -> tuple[int, str]:
    """(positions, hash of the whole content) of one training file, read whole: an hcpe3 file decoded into its
    positions cache, a record file checked record by record as `data verify` checks it. What `data.watch` asks
    before a file joins, so that garbage never joins; `UserError` for a file that does not parse (a game cut
    short, a partial record, an unknown extension) or holds a record training could not use, naming the first."""
    from tideborn.data.cache.hcpe3 import Hcpe3File, content_digest

    found = file_kind(path, kind, "data.kind")
    if found == "hcpe3":
        positions = Hcpe3File(path).positions()
        try:
            return len(positions), str(positions.header["content"])
        finally:
            positions_close(positions)
    count = check_record_file(path, found)
    decoder = Decoder(found, eval_scale=1.0, value_lambda=0.0)
    digest = content_digest()  # in the same pass: the file is read once, in order, as `content_hash` reads it
    for start, chunk in stream_records(path, found, count, VERIFY_CHUNK):
        for index, reason in record_problems(chunk, found, decoder):
            raise UserError(f"{path}: record {start + index}: {reason}")
        digest.update(chunk.tobytes())
    return count, digest.hexdigest()


def derived_files(path: Path, kind: str = "auto") -> list[Path]:
    """The hidden files the project derives from data file `path` on its own: an hcpe3 file's positions cache
    (`.NAME.positions`, `cache.hcpe3.cache_path`); none for a record file."""
    from tideborn.data.cache.hcpe3 import cache_path

    try:
        found = file_kind(path, kind, "data.kind")
    except UserError:
        return []
    return [cache_path(Path(path))] if found == "hcpe3" else []


def positions_close(positions: Hcpe3Positions) -> None:
    from tideborn.data.cache.cachefile import close_arrays

    close_arrays(positions.arrays.values())


def held_out_source(data: DataSettings, data_root: str | os.PathLike,
                    warn: typing.Callable[[str], None] | None = None, decode: bool = True) -> TeacherSource | None:
    """`data.test`'s files as one source (None without any), none of them among the training files."""
    if not data.test:
        return None
    paths = expand_paths(data.test, data_root, "data.test")
    if data.watch:  # the watched globs may match nothing yet: compare with what they match now
        import glob

        train = {Path(m).resolve() for pattern in watched_patterns(data, data_root) for m in glob.glob(pattern)}
    else:
        train = {p.resolve() for p in expand_paths(data.train, data_root, "data.train")}
    for path in paths:
        if path.resolve() in train:
            raise UserError(f"data.test: {path} is also in data.train; held-out data must not be trained on")
    return open_source(paths, data.kind, warn, decode=decode)

