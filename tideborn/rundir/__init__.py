"""The run directory, the one contract between the trainer, the run tools and the TUI (no torch here).

This package holds the whole concept: here the names of the files in it, and how step checkpoints are named
and listed; `events` (events.jsonl: writing, bounded reading, following), `files` (train.pid, launch.json, the
process identity), `state` (what a run is doing, from its files), `lock` (one trainer per run directory) and
`anomaly` (the rules `status`, `watch` and the monitor report); starting and signalling a run is
`tideborn.tools.control`. Only files named exactly `step-XXXXXXXXX.pt` count as checkpoints; a save in
progress is a hidden temp file that never matches. How files are opened, written and moved is
`tideborn.safefile`; here only what the run directory asks on top (its wording, whose it may be).
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import stat
import time
import typing
from pathlib import Path

from tideborn.errors import UserError
from tideborn.humanize import clipped
from tideborn.safefile import (
    NotARegularFile,
    make_dirs,
    move_files,
    open_nofollow,
    open_regular_fd,
    os_error_text,
    user_text,
    writable_by_others,
    write_probe,
)

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


def open_run_file(path: Path, flags: int) -> int:
    """`os.open` of a run-directory file, created with FILE_MODE: the file descriptor. Never through a
    symbolic link (O_NOFOLLOW): a link planted in a run directory would have us write to its target."""
    try:
        return open_nofollow(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(_link_refused(path)) from None
        raise


def open_run_file_for_reading(path: Path) -> int:
    """`os.open` of a run file for reading, never through a symbolic link (O_NOFOLLOW: a link planted in a run
    directory, now or since start-up, would have us read its target) and only a regular file (checked on the
    descriptor, opened non-blocking so that a FIFO cannot hang the reader). `UserError` for a link or another
    file type; `OSError` as the OS says otherwise (FileNotFoundError for a missing file)."""
    try:
        fd, _ = open_regular_fd(path, follow_links=False)
    except NotARegularFile as exc:
        raise UserError(f"{path}: not a regular file (mode {stat.filemode(exc.mode)}); tideborn reads only regular "
                        "files in a run directory: move it away") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(_link_refused(path, "reads")) from None
        raise
    return fd


def run_dir_of(settings: Settings) -> Path:
    """The run directory: `runtime.out_dir`, relative to `paths.runs_root` (itself relative to the cwd)."""
    out = Path(settings.runtime.out_dir)
    return out if out.is_absolute() else Path(settings.paths.runs_root) / out


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


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def temp_checkpoints(run_dir: Path) -> list[Path]:
    """Leftovers of saves that were killed before `os.replace` (never taken for checkpoints)."""
    if not is_directory(run_dir):
        return []
    return sorted(p for p in run_dir.iterdir() if TEMP_CHECKPOINT_RE.match(p.name))


# -- a run directory nobody else controls, and one we can write ------------------------------------------

MATCH_REFERENCE_FILE = "match-reference.pt"
"""The run's first checkpoint, kept (a hard link) as the reference of `runtime.match_every` (docs/match.md)."""
RUN_FILES = (EVENTS_FILE, LOG_FILE, PID_FILE, LAUNCH_FILE, TRAINER_LOCK_FILE, MATCH_REFERENCE_FILE)
"""The files tideborn writes, appends to, replaces or locks in a run directory (checkpoints aside)."""
_ATOMIC_TEMP_RE = re.compile(r"^\.(train\.pid|launch\.json)\.tmp-\d+$")


def whose(path: Path) -> str:
    """Why this user may not read or write `path`, for a permission error: whose it is, its mode, and who
    we are (`it belongs to root (uid 0), mode 600, and you are nobody (uid 65534)`). The nearest ancestor
    that can be examined speaks for a path behind a directory we may not enter."""
    you = user_text(os.geteuid())
    for where in (path, *path.parents):
        try:
            info = os.stat(where)
        except OSError:
            continue
        owner = f"{where} belongs to" if where != path else "it belongs to"
        return f"{owner} {user_text(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):o}, and you are {you}"
    return f"you are {you}"


def check_readable_dir(run_dir: Path) -> None:
    """`UserError` naming whose it is if this user may not list `run_dir` (another user's 0700 run): the
    run tools and the monitor then say so in one line instead of failing on the first file they look at."""
    try:
        os.listdir(run_dir)
        os.stat(os.path.join(run_dir, "."))  # its entries can be examined too (search permission)
    except PermissionError:
        raise UserError(f"{run_dir}: cannot read the run directory: permission denied ({whose(run_dir)}); "
                        "run this as its owner, or ask them to let you read it (chmod go+rx)") from None
    except OSError:
        return  # absent, not a directory, ...: the caller's own checks name those


def _link_refused(path: Path, what: str = "writes, moves or deletes") -> str:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return (f"runtime.out_dir: {path} is a symbolic link{target}; tideborn never {what} "
            "through a link in a run directory: remove it, or choose another runtime.out_dir")


def refuse_link(path: Path) -> None:
    """`UserError` if `path` is a symbolic link: run files are never moved, written or deleted through one."""
    if path.is_symlink():
        raise UserError(_link_refused(path))


def is_run_entry(name: str) -> bool:
    """Whether `name` is one the run directory contract gives a file of its own (events, log, pid, launch, lock,
    match reference, archive, step checkpoints and their temp files): never an output of a tool."""
    return (name in RUN_FILES or name == ARCHIVE_DIR or bool(CHECKPOINT_RE.match(name))
            or bool(TEMP_CHECKPOINT_RE.match(name)) or bool(_ATOMIC_TEMP_RE.match(name)))


def _check_owned(path: Path, info: os.stat_result, what: str, check_mode: bool = True) -> None:
    """Ours, and writable by nobody else: otherwise someone else can swap checkpoints or plant links."""
    euid = os.geteuid()
    if info.st_uid != euid:
        raise UserError(f"runtime.out_dir: {what} {path} belongs to {user_text(info.st_uid)}, and you are "
                        f"{user_text(euid)}; tideborn writes only in a run directory that is yours alone: "
                        "choose another runtime.out_dir (or run as its owner)")
    if check_mode and writable_by_others(info):
        mode = stat.S_IMODE(info.st_mode)
        raise UserError(f"runtime.out_dir: {what} {path} is writable by others (mode {mode:o}), who could swap "
                        f"its checkpoints or plant links in it: {shlex.join(['chmod', 'go-w', str(path)])}, or choose "
                        "another runtime.out_dir")


def check_run_dir(run_dir: Path) -> None:
    """Refuse (`UserError`, one line) a run directory that someone else controls or that cannot be written.

    Someone else's: owned by another user (root included: a root trainer in a user's directory is the
    classic target of a planted link), or group- or world-writable, or holding a run file (events, log,
    pid, launch, lock, checkpoints, archive) that is a symbolic link, belongs to another user or is
    writable by others. Unwritable: see `check_writable`. A run directory that does not exist yet only
    has to be creatable (`make_dirs` then creates it ours)."""
    try:
        link = os.lstat(run_dir)
    except OSError:
        check_writable(run_dir)  # not there, or not reachable: this names why it cannot be created
        return
    info = link
    if stat.S_ISLNK(link.st_mode):
        # A link to the run directory is a user's own convenience (runs/x -> /big/disk/x); it must be
        # theirs, and what it points to is checked as the run directory itself.
        _check_owned(run_dir, link, "the link", check_mode=False)  # a link's own mode is always 777
        try:
            info = os.stat(run_dir)
        except OSError as exc:
            raise UserError(f"runtime.out_dir: {run_dir}: {os_error_text(exc)}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"runtime.out_dir: {run_dir} exists and is not a directory")
    _check_owned(run_dir, info, "the run directory")
    try:
        entries = [entry for entry in os.scandir(run_dir) if is_run_entry(entry.name)]
    except OSError as exc:
        raise UserError(f"runtime.out_dir: cannot list {run_dir}: {os_error_text(exc)}") from None
    for entry in entries:
        path = run_dir / entry.name
        try:
            found = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed meanwhile (a temp file of a save that just finished)
        if stat.S_ISLNK(found.st_mode):
            raise UserError(_link_refused(path))
        wanted_dir = entry.name == ARCHIVE_DIR
        if stat.S_ISDIR(found.st_mode) != wanted_dir or not (wanted_dir or stat.S_ISREG(found.st_mode)):
            kind = "a directory" if wanted_dir else "a regular file"
            raise UserError(f"runtime.out_dir: {path} is not {kind}; move it away, or choose another runtime.out_dir")
        _check_owned(path, found, "the directory" if wanted_dir else "the file")
        if entry.name in (EVENTS_FILE, LOG_FILE, TRAINER_LOCK_FILE) and not os.access(path, os.W_OK):
            raise UserError(f"runtime.out_dir: cannot write {path}: permission denied (mode "
                            f"{stat.S_IMODE(found.st_mode):o}); chmod u+w it, or choose another runtime.out_dir")
    check_writable(run_dir)


def is_directory(path: Path) -> bool:
    """`path.is_dir()`, and False for a path no directory can have (a name too long): readers never crash on it."""
    try:
        return path.is_dir()
    except OSError as exc:
        if no_such_file(exc):
            return False
        raise


def no_such_file(exc: OSError) -> bool:
    """Whether `exc` means the path holds no file: missing, under something that is not a directory, or
    with a name longer than the filesystem takes. Readers treat all three as "not written yet"."""
    return isinstance(exc, (FileNotFoundError, NotADirectoryError)) or exc.errno == errno.ENAMETOOLONG


def _existing_ancestor(run_dir: Path) -> Path:
    """The run directory, or the nearest ancestor that exists (where creating it starts)."""
    path = run_dir
    while True:
        try:
            os.stat(path)
            return path
        except (FileNotFoundError, NotADirectoryError):  # not there, or a file stands where a directory should
            if path.parent == path:
                return path
            path = path.parent


def check_writable(run_dir: Path) -> None:
    """Refuse (`UserError`, one line naming the cause) a run directory that cannot be created or written:
    a read-only mount, a path under a regular file, a name too long, a full disk, a directory we may not
    enter. The evidence is a probe: a hidden file created (O_EXCL, O_NOFOLLOW), written, and removed, in
    the run directory or, when it does not exist yet, in the ancestor it would be created in. Nothing stays."""
    where = run_dir
    try:
        where = _existing_ancestor(run_dir)
        if not stat.S_ISDIR(os.stat(where).st_mode):
            raise UserError(f"runtime.out_dir: {run_dir}: {where} is a file, not a directory; "
                            "choose another runtime.out_dir")
        write_probe(where)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            longest = max(run_dir.parts, key=lambda part: len(os.fsencode(part)))
            raise UserError(f"runtime.out_dir: the path is too long for the filesystem (its longest name, "
                            f"{clipped(longest, 40)}, is {len(os.fsencode(longest)):,} bytes; most filesystems "
                            f"allow 255, and a whole path {os.pathconf('/', 'PC_PATH_MAX'):,}): choose a shorter "
                            "runtime.out_dir") from None
        doing = f"cannot write in {run_dir}" if where == run_dir else f"cannot create {run_dir} in {where}"
        raise UserError(f"runtime.out_dir: {doing}: {os_error_text(exc)}; choose another runtime.out_dir") from None
