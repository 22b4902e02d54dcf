"""Checks of a training request that need neither torch nor the checkpoints' contents (no torch here).

`train` runs them first; `train_run start` runs them before launching, so a request the trainer would
refuse is refused at the terminal, with the same message, and nothing is launched.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path

from tideborn.config import Settings
from tideborn.errors import UserError
from tideborn.rundir import ARCHIVE_DIR, run_dir_of


def preflight(settings: Settings, resume: Path | None = None, fresh: bool = False,
              stop_at_step: int | None = None, environ: typing.Mapping[str, str] | None = None) -> Path:
    """Raise `UserError` for what is wrong with the request; return the run directory."""
    environ = os.environ if environ is None else environ
    if settings.data.resolved_kind != "synthetic":
        # Every teacher file is opened and size-checked now, so a bad one is named before anything starts.
        from tideborn.data.records import held_out_records, training_records

        for records in (training_records(settings), held_out_records(settings)):
            if records is not None:
                records.close()
    if fresh and resume is not None:
        raise UserError("--fresh and --resume exclude each other")
    if resume is not None and not resume.is_file():
        raise UserError(f"--resume {resume}: no such checkpoint file")
    if stop_at_step is not None and not 0 < stop_at_step <= settings.runtime.max_steps:
        raise UserError(f"--stop-at-step {stop_at_step}: must be between 1 and runtime.max_steps "
                        f"({settings.runtime.max_steps})")
    run_dir = run_dir_of(settings)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"runtime.out_dir: {run_dir} exists and is not a directory")
    archive = run_dir / ARCHIVE_DIR
    if fresh and (archive.exists() or archive.is_symlink()) and not archive.is_dir():
        raise UserError(f"--fresh: {archive} exists and is not a directory (old checkpoints and events move "
                        "into it); move it out of the way")
    return run_dir
