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
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tideborn.rundir import checkpoint_name, list_checkpoints

FORMAT = "tideborn-checkpoint"
FORMAT_VERSION = 1
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
    temp = run_dir / f".{final.name}.tmp-{os.getpid()}"
    try:
        with open(temp, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_directory(run_dir)
    return SavedCheckpoint(final, final.stat().st_size, time.perf_counter() - started)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Path) -> dict:
    """Load and check a checkpoint on the CPU. Raises `CheckpointError` with a one-line reason."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: refused: loading it would need pickle to run code "
                              f"(weights_only load failed: {first})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({first})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tideborn checkpoint")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload.get('format_version')!r}; "
                              f"this tideborn reads version {FORMAT_VERSION}")
    missing = [key for key in REQUIRED_KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    return payload


def newest_loadable(run_dir: Path) -> tuple[Path | None, dict | None, list[str]]:
    """The newest checkpoint in `run_dir` that loads, and a warning for each newer one skipped."""
    skipped: list[str] = []
    for _, path in reversed(list_checkpoints(run_dir)):
        try:
            return path, load_checkpoint(path), skipped
        except CheckpointError as exc:
            skipped.append(f"skipped unusable checkpoint: {exc}")
    return None, None, skipped


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step checkpoints; returns what was deleted."""
    checkpoints = list_checkpoints(run_dir)
    doomed = [path for _, path in checkpoints[:-keep]] if keep > 0 else []
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed
