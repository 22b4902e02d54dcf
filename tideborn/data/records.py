"""Teacher record files: the two fixed-size formats, file and glob expansion, memory-mapped access.

Files are opened with `np.memmap`: a record is read from disk (or the page cache) only when a batch uses
it, so a 100 GB teacher set costs address space, not RAM. Every problem with a file is a `UserError`
that names it (and the record, where one record is at fault).
"""

from __future__ import annotations

import glob
import os
import typing
from pathlib import Path

import cshogi
import numpy as np

from tideborn.errors import UserError

if typing.TYPE_CHECKING:
    from tideborn.config.schema import Settings

RECORD_DTYPES: dict[str, np.dtype] = {
    "hcpe": np.dtype(cshogi.HuffmanCodedPosAndEval),  # dlshogi: hcp[32], eval, bestMove16, gameResult, pad
    "psv": np.dtype(cshogi.PackedSfenValue),  # YaneuraOu: sfen[32], score, move, gamePly, game_result, pad
}
EXTENSION_KINDS = {".hcpe": "hcpe", ".bin": "psv", ".psv": "psv"}


def kind_from_extension(path: str | os.PathLike) -> str | None:
    """`hcpe` or `psv` from the file name's extension, or None when it does not tell."""
    return EXTENSION_KINDS.get(Path(path).suffix.lower())


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
                raise UserError(f"{key}: {pattern!r} matches no files (looked for {path})")
            files.extend(matches)
        else:
            files.append(path)
    return files


def readable_size(path: Path, kind: str) -> int:
    """The size of `path` in bytes, after checking it exists, is a file and can be read."""
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a {kind} file (name its files, e.g. {path / ('*.' + kind)})")
    try:
        with open(path, "rb") as handle:
            handle.read(1)
            return os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None


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


def open_records(path: Path, kind: str) -> np.memmap:
    """A read-only memory map of `path`'s records (checked first with `check_record_file`)."""
    check_record_file(path, kind)
    return np.memmap(path, dtype=RECORD_DTYPES[kind], mode="r")


class RecordSet:
    """Files of one kind seen as one sequence: record `i` of the set is record `i - offsets[f]` of file `f`.

    Pickles without its memory maps (workers reopen them), so handing it to worker processes copies
    only the file list.
    """

    def __init__(self, paths: typing.Sequence[Path], kind: str):
        self.paths = [Path(p) for p in paths]
        self.kind = kind
        self.dtype = RECORD_DTYPES[kind]
        counts = [check_record_file(path, kind) for path in self.paths]
        self.counts = np.asarray(counts, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self._maps: list[np.memmap | None] = [None] * len(self.paths)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_maps"] = [None] * len(self.paths)
        return state

    def file_map(self, file_index: int) -> np.memmap:
        mapped = self._maps[file_index]
        if mapped is None:
            mapped = np.memmap(self.paths[file_index], dtype=self.dtype, mode="r")
            self._maps[file_index] = mapped
        return mapped

    def read(self, indices: np.ndarray) -> np.ndarray:
        """The records at global `indices`, in that order (a copy; the maps stay untouched)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(self.paths) == 1:
            return np.asarray(self.file_map(0)[indices])
        file_ids = np.searchsorted(self.offsets, indices, side="right") - 1
        out = np.empty(len(indices), dtype=self.dtype)
        for file_index in np.unique(file_ids):
            chosen = file_ids == file_index
            out[chosen] = self.file_map(int(file_index))[indices[chosen] - self.offsets[file_index]]
        return out

    def locate(self, index: int) -> tuple[Path, int]:
        """(file, record index within that file) of global record `index`."""
        file_index = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return self.paths[file_index], int(index - self.offsets[file_index])

    def describe(self, index: int) -> str:
        path, local = self.locate(index)
        return f"{path}: record {local}"

    def close(self) -> None:
        self._maps = [None] * len(self.paths)


def training_records(settings: Settings) -> RecordSet:
    """The `data.train` files as one record set (every file checked; `UserError` names a bad one)."""
    data = settings.data
    paths = expand_paths(data.train, settings.paths.data_root, "data.train")
    return RecordSet(paths, resolve_kind(paths, data.resolved_kind, "data.kind"))


def held_out_records(settings: Settings) -> RecordSet | None:
    """The `data.test` files, or None when there are none; a file also in `data.train` is an error."""
    data = settings.data
    if not data.test:
        return None
    paths = expand_paths(data.test, settings.paths.data_root, "data.test")
    train = {p.resolve() for p in expand_paths(data.train, settings.paths.data_root, "data.train")}
    for path in paths:
        if path.resolve() in train:
            raise UserError(f"data.test: {path} is also in data.train; held-out data must not be trained on")
    return RecordSet(paths, resolve_kind(paths, data.resolved_kind, "data.kind"))
