"""Whether this user may use a run directory: one to read (the run tools, the monitor), and one to train in,
which must be ours alone (nobody else can swap its checkpoints or plant links in it) and writable."""

from __future__ import annotations

import errno
import os
import shlex
import stat
from pathlib import Path

from tideborn.errors import UserError
from tideborn.humanize import clipped
from tideborn.rundir.layout import ARCHIVE_DIR, EVENTS_FILE, LOG_FILE, TRAINER_LOCK_FILE, is_run_entry
from tideborn.safefile import (
    RUN_DIR_CHANGES,
    LinkRefused,
    os_error_text,
    user_text,
    whose,
    writable_by_others,
    write_probe,
)


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
            raise LinkRefused(path, RUN_DIR_CHANGES, in_run_dir=True)
        wanted_dir = entry.name == ARCHIVE_DIR
        if stat.S_ISDIR(found.st_mode) != wanted_dir or not (wanted_dir or stat.S_ISREG(found.st_mode)):
            kind = "a directory" if wanted_dir else "a regular file"
            raise UserError(f"runtime.out_dir: {path} is not {kind}; move it away, or choose another runtime.out_dir")
        _check_owned(path, found, "the directory" if wanted_dir else "the file")
        if entry.name in (EVENTS_FILE, LOG_FILE, TRAINER_LOCK_FILE) and not os.access(path, os.W_OK):
            raise UserError(f"runtime.out_dir: cannot write {path}: permission denied (mode "
                            f"{stat.S_IMODE(found.st_mode):o}); chmod u+w it, or choose another runtime.out_dir")
    check_writable(run_dir)


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
