"""Keep the run directory's step files one lineage: the checkpoint a run starts from and what it writes.

A run that starts from a checkpoint older than the newest step file (`--resume` of an earlier one, or an
automatic resume that skipped unusable files) would otherwise share the directory with files it did
not write: pruning counted them as the newest and deleted the new ones, the next `train` resumed from
them, and `status` (which lists by name and cannot load checkpoints) showed them as the run's checkpoint.
So at start-up, under the run directory's lock, such files leave the listing: unusable ones to
`archive/quarantine-STAMP/`, newer ones saved during a gradient spike streak (passed over for the newest healthy
one) to `archive/watchdog-STAMP/`, the other newer usable ones (an abandoned branch) to `archive/branch-STAMP/`,
each move with a warning event. Nothing is deleted; moving a file back makes it a checkpoint again.
"""

from __future__ import annotations

from pathlib import Path

from tideborn.errors import UserError
from tideborn.rundir.layout import (
    BRANCH_ARCHIVE,
    QUARANTINE_ARCHIVE,
    WATCHDOG_ARCHIVE,
    list_checkpoints,
    move_to_archive,
)
from tideborn.trainer.resume import StartPoint


def set_aside_other_lineages(run_dir: Path, start: StartPoint) -> list[str]:
    """Move unusable step files and those newer than the start point out of `run_dir`; the warnings to emit."""
    unusable = {path: reason for path, reason in start.unusable if path.parent == run_dir and path.is_file()}
    unhealthy = [path for path in start.unhealthy if path.parent == run_dir and path.is_file()]
    newer = [path for step, path in list_checkpoints(run_dir)
             if step > start.step and path not in unusable and path not in unhealthy]
    warnings: list[str] = []
    if unusable:
        folder = _move(run_dir, list(unusable), QUARANTINE_ARCHIVE)
        warnings += [f"skipped unusable checkpoint: {reason}; moved it to {folder}/" for reason in unusable.values()]
    if unhealthy:
        folder = _move(run_dir, unhealthy, WATCHDOG_ARCHIVE)
        names = ", ".join(path.name for path in unhealthy)
        warnings.append(f"resuming from {start.checkpoint}, the newest checkpoint saved while the gradient norm was "
                        f"healthy: moved {names}, saved during a spike streak, to {folder}/ (--resume one to use it)")
    if newer:
        folder = _move(run_dir, newer, BRANCH_ARCHIVE)
        names = ", ".join(path.name for path in newer)
        origin = start.checkpoint if start.checkpoint is not None else "step 0"
        warnings.append(f"starting from {origin} (step {start.step}): moved {len(newer)} newer checkpoint(s) "
                        f"of an abandoned branch ({names}) to {folder}/")
    return warnings


def _move(run_dir: Path, paths: list[Path], kind: str) -> Path:
    try:
        return move_to_archive(run_dir, paths, kind)
    except OSError as exc:
        # Starting anyway would let this run's pruning or the next resume pick the wrong files.
        raise UserError(f"cannot move {', '.join(p.name for p in paths)} to {run_dir}/archive/: "
                        f"{exc.strerror or exc}; move them out of the run directory by hand") from None
