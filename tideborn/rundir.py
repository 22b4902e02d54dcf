"""The run directory, the one contract between the trainer, the run tools and the TUI (no torch here).

Names of the files in it, and how step checkpoints are named and listed. Only files named exactly
`step-XXXXXXXXX.pt` count as checkpoints; a save in progress is a hidden temp file that never matches.
"""

from __future__ import annotations

import os
import re
import time
import typing
from pathlib import Path

if typing.TYPE_CHECKING:
    from tideborn.config import Settings

EVENTS_FILE = "events.jsonl"
LOG_FILE = "train.log"
PID_FILE = "train.pid"
LAUNCH_FILE = "launch.json"
ARCHIVE_DIR = "archive"
BRANCH_ARCHIVE = "branch"
"""`archive/branch-STAMP/`: checkpoints newer than the one a run resumed from (an abandoned branch), moved
there at start-up so that they are never resumed from, pruned or shown as the run's checkpoint."""
QUARANTINE_ARCHIVE = "quarantine"
"""`archive/quarantine-STAMP/`: step files that did not load (truncated, corrupt, foreign, crafted), moved there
at start-up by the run that skipped them, kept for inspection."""
TRAINER_LOCK_FILE = ".trainer.lock"
"""The flock a trainer holds on its run directory for its lifetime."""

FILE_MODE = 0o644
"""Files in a run directory: readable by others (status, the TUI, a colleague), written only by their owner.
A stricter umask still applies; a looser one (000) cannot make them group- or world-writable."""
DIR_MODE = 0o755
"""Directories the trainer and `train_run start` create, on the same terms."""

CHECKPOINT_RE = re.compile(r"^step-(\d{9})\.pt$")
TEMP_CHECKPOINT_RE = re.compile(r"^\.step-\d{9}\.pt\.tmp-\d+$")


def make_dirs(path: Path) -> None:
    """Create `path` and any missing parents with DIR_MODE (so a umask of 000 leaves none world-writable)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not directory.is_dir():
                raise


def open_run_file(path: Path, flags: int) -> int:
    """`os.open` of a run-directory file, created with FILE_MODE: the file descriptor."""
    return os.open(path, flags | os.O_CREAT, FILE_MODE)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, write: typing.Callable[[typing.BinaryIO], object]) -> None:
    """Write `path` whole or not at all: `write` fills a hidden temp file beside it (`.NAME.tmp-PID`, created
    with FILE_MODE), which is fsynced and renamed over `path`; then the directory is fsynced. If anything
    fails, the temp file is removed and the old `path`, if any, is untouched."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with os.fdopen(open_run_file(temp, os.O_WRONLY | os.O_TRUNC), "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


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


def parse_step(path: Path) -> int:
    """The step in a checkpoint's file name (`step-000000020.pt` -> 20)."""
    match = CHECKPOINT_RE.match(path.name)
    if match is None:
        raise ValueError(f"{path.name} is not a checkpoint name (step-XXXXXXXXX.pt)")
    return int(match.group(1))


def new_archive_folder(run_dir: Path, kind: str) -> Path:
    """Create and return `run_dir/archive/KIND-YYYYmmdd-HHMMSS` (UTC), with a suffix if that exists already."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    folder = run_dir / ARCHIVE_DIR / f"{kind}-{stamp}"
    suffix = 1
    while folder.exists():  # two starts within a second must not mix their archives
        suffix += 1
        folder = run_dir / ARCHIVE_DIR / f"{kind}-{stamp}-{suffix}"
    make_dirs(folder)
    return folder


def move_to_archive(run_dir: Path, paths: typing.Sequence[Path], kind: str) -> Path:
    """Move `paths` (files in `run_dir`) into a new `archive/KIND-STAMP/` folder; returns the folder. Renames
    within the run directory's file system: a file is in one place or the other, never copied half."""
    folder = new_archive_folder(run_dir, kind)
    for path in paths:
        os.replace(path, folder / path.name)
    fsync_directory(folder)
    fsync_directory(run_dir)
    return folder


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def temp_checkpoints(run_dir: Path) -> list[Path]:
    """Leftovers of saves that were killed before `os.replace` (never taken for checkpoints)."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if TEMP_CHECKPOINT_RE.match(p.name))
