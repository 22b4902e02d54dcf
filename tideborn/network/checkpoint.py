"""Step checkpoints: written atomically, read only with `torch.load(weights_only=True)`.

A save goes to a hidden temp file in the run directory, is fsynced, renamed over its final name with
`os.replace`, and the directory is fsynced, so a crash leaves either the complete file or no file of
that name (a stray temp file is never taken for a checkpoint). Everything in a checkpoint is tensors
and plain data, so loading never needs pickle; a file that does is refused and nothing in it runs.
"""

from __future__ import annotations

import os
import pickle
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import torch

from tideborn.errors import UserError
from tideborn.network.payload_check import PayloadError, check_payload
from tideborn.rundir.layout import checkpoint_name, list_checkpoints, parse_step
from tideborn.safefile import open_run_file_for_reading, write_atomically

FORMAT = "tideborn-checkpoint"
FORMAT_VERSION = 1
REFERENCE_STEP_KEY = "match_reference_step"
"""With `runtime.match_every` against the run's own reference: the step of match-reference.pt (an int)."""
REQUIRED_KEYS = ("format", "format_version", "step", "settings", "model", "optimizer", "scheduler",
                 "rng", "data_cursor")


class CheckpointError(Exception):
    """A checkpoint file that cannot be used: missing, corrupt, truncated, foreign, or needing pickle."""


@dataclass(frozen=True)
class SavedCheckpoint:
    path: Path
    bytes: int
    seconds: float


def save_checkpoint(run_dir: Path, step: int, payload: dict) -> SavedCheckpoint:
    started = time.perf_counter()
    final = run_dir / checkpoint_name(step)
    try:
        write_atomically(final, lambda handle: torch.save(payload, handle))
    except Exception as exc:
        cause = _os_error_within(exc)
        if cause is not None and cause.errno is not None:
            # torch reports a failed write (a full disk) as an opaque "unexpected pos" RuntimeError, the
            # OSError only in its context: name the real cause, and what it cost.
            raise CheckpointSaveError(cause.errno, f"{cause.strerror or cause} while writing checkpoint {final} "
                                      "(the partial file was removed; earlier checkpoints are intact)") from exc
        raise
    return SavedCheckpoint(final, final.stat().st_size, time.perf_counter() - started)


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (a full disk, a quota, an I/O error); the message names it."""


def _os_error_within(exc: BaseException) -> OSError | None:
    """The OSError that `exc` is, or that it was raised while handling (torch wraps write errors)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _check_container(path: Path, file: typing.BinaryIO) -> None:
    """Name a file that is no PyTorch save at all (empty, text, another format) before torch.load does,
    whose errors for such files say little ("list index out of range")."""
    try:
        head = file.read(4)
        file.seek(0)
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if not head:
        raise CheckpointError(f"{path}: empty file, not a checkpoint")
    # torch.save writes a zip archive; the legacy format is a pickle stream (protocol 2+ starts with 0x80).
    if not (head.startswith(b"PK\x03\x04") or head[0] == 0x80):
        raise CheckpointError(f"{path}: not a checkpoint (neither a PyTorch zip archive nor a pickle stream)")


def _open(path: Path, run_file: bool) -> typing.BinaryIO:
    """`path` opened for reading. A run file (`run_file`: a step checkpoint or the match reference in a run
    directory) is opened without following a link, at the moment of use (a link may be planted mid-run)."""
    if not run_file:
        if not path.exists():
            raise CheckpointError(f"{path}: no such checkpoint")
        if not path.is_file():
            raise CheckpointError(f"{path}: not a file")
        try:
            return open(path, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            raise CheckpointError(f"{path}: unreadable ({exc.strerror or exc})") from None
    try:
        return os.fdopen(open_run_file_for_reading(path), "rb")
    except UserError as exc:
        raise CheckpointError(str(exc)) from None
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable ({exc.strerror or exc})") from None


def _torch_load(path: Path, file: typing.BinaryIO) -> object:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: refused: loading it would need pickle to run code "
                              f"(weights_only load failed: {first})") from None
    except Exception as exc:  # noqa: BLE001 - a damaged file makes torch.load raise almost anything
        # (RuntimeError, EOFError, BadZipFile, KeyError, IndexError from its unpickler, MemoryError for a
        # size field gone wild, ...: tests/e2e/test_reliability_fuzz.py); all of it means the same to a user.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if len(first) > 120:  # torch's zip reader appends a paragraph of advice to its one-line reason
            first = first.split(". ")[0]
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({first})") from None


def load_checkpoint(path: Path, run_file: bool = False) -> dict:
    """Load and check a checkpoint on the CPU. Raises `CheckpointError` with a one-line reason. `run_file`:
    `path` is a file of a run directory, never read through a symbolic link."""
    with _open(path, run_file) as file:
        _check_container(path, file)
        payload = _torch_load(path, file)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tideborn checkpoint")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload.get('format_version')!r}; "
                              f"this tideborn reads version {FORMAT_VERSION}")
    missing = [key for key in REQUIRED_KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    try:
        check_payload(payload)
    except PayloadError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    return payload


def newest_loadable(run_dir: Path) -> tuple[Path | None, dict | None, list[tuple[Path, str]]]:
    """The newest checkpoint in `run_dir` that loads, and each newer one skipped with the reason (one line)."""
    skipped: list[tuple[Path, str]] = []
    for step, path in reversed(list_checkpoints(run_dir)):
        try:
            payload = load_checkpoint(path, run_file=True)
        except CheckpointError as exc:
            skipped.append((path, str(exc)))
            continue
        if payload["step"] != step:  # a file copied or renamed over another name: resume would take the wrong step
            skipped.append((path, f"{path}: holds step {payload['step']}, not the step its name says"))
            continue
        return path, payload, skipped
    return None, None, skipped


def prune_checkpoints(run_dir: Path, keep: int, saved: Path, healthy: Path | None = None) -> list[Path]:
    """Delete the oldest checkpoints up to `saved` (the one just written) so that `keep` of them remain;
    returns what was deleted.

    Only checkpoints older than `saved` are candidates. A file with a later step is not this run's
    lineage (start-up moves such files to archive/, see `tideborn.trainer.lineage`), so it is neither
    deleted nor counted, and however many there are, `saved` is never deleted. Nor is `healthy`, the newest
    checkpoint saved with no gradient spike streak open: if the run is diverging, it is the way back.
    """
    saved_step = parse_step(saved)
    lineage = [path for step, path in list_checkpoints(run_dir) if step <= saved_step]
    doomed = [path for path in lineage[:-keep] if path not in (saved, healthy)] if keep > 0 else []
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed
