"""What a run directory holds, by name: its files, its archive folders, its step checkpoints and exported
models, how those are named and listed, and the run directory a setting names.

Only files named exactly `step-XXXXXXXXX.pt` count as checkpoints; a save in progress is a hidden temp file that
never matches.
"""

from __future__ import annotations

import re
import time
import typing
from pathlib import Path

from tideborn.safefile import is_directory, make_dirs, move_files, refuse_link

if typing.TYPE_CHECKING:
    from tideborn.config.schema import Settings

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
WATCHDOG_ARCHIVE = "watchdog"
"""`archive/watchdog-STAMP/`: checkpoints saved during the streak of exploding gradient norms that tripped the
gradient watchdog (their weights already took those updates), moved there when it halts the run."""
TRAINER_LOCK_FILE = ".trainer.lock"
"""The flock a trainer holds on its run directory for its lifetime."""

EXPORT_DIR = "export"
"""`export/`: the engine's weights during a run (`runtime.export_every`): `step-XXXXXXXXX.onnx`, parity-checked,
and `latest.onnx`, a second name of the newest, replaced by a rename (docs/training.md, Weights for the engine)."""
LATEST_EXPORT_FILE = "latest.onnx"

CHECKPOINT_RE = re.compile(r"^step-(\d{9})\.pt$")
EXPORT_RE = re.compile(r"^step-(\d{9})\.onnx$")
TEMP_CHECKPOINT_RE = re.compile(r"^\.step-\d{9}\.pt\.tmp-\d+$")

MATCH_REFERENCE_FILE = "match-reference.pt"
"""The run's first checkpoint, kept (a hard link) as the reference of `runtime.match_every` (docs/match.md)."""
RUN_FILES = (EVENTS_FILE, LOG_FILE, PID_FILE, LAUNCH_FILE, TRAINER_LOCK_FILE, MATCH_REFERENCE_FILE)
"""The files tideborn writes, appends to, replaces or locks in a run directory (checkpoints aside)."""
_ATOMIC_TEMP_RE = re.compile(r"^\.(train\.pid|launch\.json)\.tmp-\d+$")


def run_dir_of(settings: Settings) -> Path:
    """The run directory: `runtime.out_dir`, relative to `paths.runs_root` (itself relative to the cwd)."""
    out = Path(settings.runtime.out_dir)
    return out if out.is_absolute() else Path(settings.paths.runs_root) / out


def is_run_entry(name: str) -> bool:
    """Whether `name` is one the run directory contract gives a file of its own (events, log, pid, launch, lock,
    match reference, archive, step checkpoints and their temp files): never an output of a tool."""
    return (name in RUN_FILES or name == ARCHIVE_DIR or bool(CHECKPOINT_RE.match(name))
            or bool(TEMP_CHECKPOINT_RE.match(name)) or bool(_ATOMIC_TEMP_RE.match(name)))


def checkpoint_name(step: int) -> str:
    if not 0 <= step <= 999_999_999:
        raise ValueError(f"step {step} does not fit the 9-digit checkpoint name")
    return f"step-{step:09d}.pt"


def export_name(step: int) -> str:
    """The file `runtime.export_every` writes in `export/` for `step`: `step-XXXXXXXXX.onnx`."""
    return checkpoint_name(step)[:-len(".pt")] + ".onnx"


def list_exports(folder: Path) -> list[tuple[int, Path]]:
    """The step models in an `export/` folder (regular files named `step-XXXXXXXXX.onnx`), oldest first."""
    if not is_directory(folder):
        return []
    found = []
    for path in folder.iterdir():
        match = EXPORT_RE.match(path.name)
        if match and path.is_file() and not path.is_symlink():
            found.append((int(match.group(1)), path))
    return sorted(found)


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete step checkpoints in `run_dir`, oldest first."""
    if not is_directory(run_dir):
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


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def temp_checkpoints(run_dir: Path) -> list[Path]:
    """Leftovers of saves that were killed before `os.replace` (never taken for checkpoints)."""
    if not is_directory(run_dir):
        return []
    return sorted(p for p in run_dir.iterdir() if TEMP_CHECKPOINT_RE.match(p.name))


def new_archive_folder(run_dir: Path, kind: str) -> Path:
    """Create and return `run_dir/archive/KIND-YYYYmmdd-HHMMSS` (UTC), with a suffix if that exists already."""
    refuse_link(run_dir / ARCHIVE_DIR)  # a planted `archive -> /elsewhere` would carry the files out
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
    move_files(paths, folder)
    return folder
