"""The run directory, the one contract between the trainer, the run tools and the TUI (no torch here).

Names of the files in it, and how step checkpoints are named and listed. Only files named exactly
`step-XXXXXXXXX.pt` count as checkpoints; a save in progress is a hidden temp file that never matches.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

if typing.TYPE_CHECKING:
    from tideborn.config import Settings

EVENTS_FILE = "events.jsonl"
LOG_FILE = "train.log"
PID_FILE = "train.pid"
LAUNCH_FILE = "launch.json"
ARCHIVE_DIR = "archive"
TRAINER_LOCK_FILE = ".trainer.lock"
"""The flock a trainer holds on its run directory for its lifetime."""

CHECKPOINT_RE = re.compile(r"^step-(\d{9})\.pt$")
TEMP_CHECKPOINT_RE = re.compile(r"^\.step-\d{9}\.pt\.tmp-\d+$")


def run_dir_of(settings: Settings) -> Path:
    """The run directory: `runtime.out_dir`, relative to `paths.runs_root` (itself relative to the cwd)."""
    out = Path(settings.runtime.out_dir)
    return out if out.is_absolute() else Path(settings.paths.runs_root) / out


def checkpoint_name(step: int) -> str:
    if not 0 <= step <= 999_999_999:
        raise ValueError(f"step {step} does not fit the 9-digit checkpoint name")
    return f"step-{step:09d}.pt"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete step checkpoints in `run_dir`, oldest first."""
    if not run_dir.is_dir():
        return []
    found = []
    for path in run_dir.iterdir():
        match = CHECKPOINT_RE.match(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def temp_checkpoints(run_dir: Path) -> list[Path]:
    """Leftovers of saves that were killed before `os.replace` (never taken for checkpoints)."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if TEMP_CHECKPOINT_RE.match(p.name))
