"""File safety for the whole package: how tideborn opens, creates, replaces and moves files.

Files are read only when regular (a FIFO would hang the reader) and, where a link could have been planted, never
through a symbolic link (O_NOFOLLOW); a file is trusted only when it is ours alone (`trust_problem`); a file is
written whole or not at all (a new temp file, fsync, rename, directory fsync; `write_atomically`); a directory
is shown writable by a probe; the files of a run directory get the run directory's wording on top
(`open_run_file`, `refuse_link`). Nothing else in tideborn creates a file with O_CREAT or renames one (ruff's
banned-api, pyproject.toml [tool.ruff.lint.flake8-tidy-imports], holds it so), so each of these rules is written
once. No torch, no numpy: the run tools and the monitor use it.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import re
import shutil
import stat
import typing
from pathlib import Path

from tideborn.errors import UserError

FILE_MODE = 0o644
"""Files tideborn creates: readable by others (status, the TUI, a colleague), written only by their owner.
A stricter umask still applies; a looser one (000) cannot make them group- or world-writable."""
DIR_MODE = 0o755
"""Directories tideborn creates, on the same terms."""


# -- what a file is, and whose ----------------------------------------------------------------------------

def file_type(mode: int) -> str:
    """What `mode` (st_mode) is, for people: "a directory", "a FIFO (named pipe)", ..."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def user_text(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def private_group(gid: int, uid: int) -> bool:
    """The owner's own group (a "user private group": same name, their primary group, no other members),
    whose write bit a umask of 002 sets and nobody else can use."""
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == user.pw_name and user.pw_gid == gid and set(group.gr_mem) <= {user.pw_name}


def writable_by_others(info: os.stat_result) -> bool:
    """Whether someone but the owner may write it: world-writable, or group-writable by a group that is not
    the owner's private one."""
    return bool(info.st_mode & stat.S_IWOTH
                or (info.st_mode & stat.S_IWGRP and not private_group(info.st_gid, info.st_uid)))


def trust_problem(info: os.stat_result, owners: typing.Collection[int] | None = None,
                  single_link: bool = False) -> str | None:
    """Why a file with these facts (an fstat of what was opened) must not be used or written: not a regular
    file, owned by someone not in `owners` (by default only us), writable by others, or (`single_link`)
    reachable under another name too; None when it is ours alone. Said as the end of "PATH ..."."""
    if not stat.S_ISREG(info.st_mode):
        return f"is {file_type(info.st_mode)}, not a regular file"
    if info.st_uid not in ({os.geteuid()} if owners is None else owners):
        return f"belongs to {user_text(info.st_uid)}"
    if single_link and info.st_nlink > 1:
        return "has other hard links"
    if writable_by_others(info):
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def link_target(path: Path) -> str:
    """` (to TARGET)` for a symbolic link at `path`, for messages; empty when it cannot be read."""
    try:
        return f" (to {os.readlink(path)})"
    except OSError:
        return ""


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


RUN_DIR_CHANGES = "writes, moves or deletes"
"""What tideborn never does through a link in a run directory (`refuse_link`, `open_run_file`)."""


class LinkRefused(UserError):
    """A symbolic link where tideborn was to write a file (or, in a run directory, `doing` something else to
    one): it never goes through one. `in_run_dir`: said as a problem of `runtime.out_dir`."""

    def __init__(self, path: Path, doing: str = "writes", in_run_dir: bool = False):
        said = f"{path} is a symbolic link{link_target(path)}; tideborn never {doing} through a link"
        if in_run_dir:
            said = f"runtime.out_dir: {said} in a run directory: remove it, or choose another runtime.out_dir"
        else:
            said += ": remove it"
        super().__init__(said)


class NotARegularFile(OSError):
    """A file that is a directory, FIFO, socket or device: never read (a FIFO would block the reader)."""

    def __init__(self, path: Path, mode: int):
        self.mode = mode
        self.what = f"{file_type(mode)}, not a regular file"
        super().__init__(f"{path}: {self.what}")


def os_error_text(exc: OSError) -> str:
    """An `OSError` as the end of a one-line message, with what to do about the common ones."""
    hints = {
        errno.EROFS: "the filesystem is mounted read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.ENAMETOOLONG: "a name in the path is too long for the filesystem",
        errno.ENOTDIR: "a part of the path is a file, not a directory",
        errno.ELOOP: "too many symbolic links (or a link where none is allowed)",
    }
    return f"{hints.get(exc.errno, exc.strerror or str(exc))} [{errno.errorcode.get(exc.errno or 0, exc.errno)}]"


# -- reading ------------------------------------------------------------------------------------------------

def open_regular_fd(path: Path, follow_links: bool = True) -> tuple[int, os.stat_result]:
    """(descriptor, its fstat) of `path` opened for reading if it is a regular file; the caller closes it.
    `NotARegularFile` otherwise: the type is checked before opening (a FIFO is never opened, so its writer is
    never disturbed) and again on the descriptor, opened non-blocking, in case the name was swapped in between.
    Without `follow_links`, a symbolic link is an `OSError` with errno ELOOP (O_NOFOLLOW), never its target."""
    mode = os.stat(path, follow_symlinks=follow_links).st_mode
    if stat.S_ISLNK(mode):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
    if not stat.S_ISREG(mode):
        raise NotARegularFile(path, mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)  # O_NONBLOCK: no effect on a regular file
    try:
        facts = os.fstat(fd)
        if not stat.S_ISREG(facts.st_mode):
            raise NotARegularFile(path, facts.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, facts


def open_regular(path: Path, follow_links: bool = True) -> typing.BinaryIO:
    """`path` opened for reading if it is a regular file (`open_regular_fd`), as a binary file object."""
    fd, _ = open_regular_fd(path, follow_links)
    return os.fdopen(fd, "rb")


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
            raise LinkRefused(path, "reads", in_run_dir=True) from None
        raise
    return fd


def no_such_file(exc: OSError) -> bool:
    """Whether `exc` means the path holds no file: missing, under something that is not a directory, or
    with a name longer than the filesystem takes. Readers treat all three as "not written yet"."""
    return isinstance(exc, (FileNotFoundError, NotADirectoryError)) or exc.errno == errno.ENAMETOOLONG


def is_directory(path: Path) -> bool:
    """`path.is_dir()`, and False for a path no directory can have (a name too long): readers never crash on it."""
    try:
        return path.is_dir()
    except OSError as exc:
        if no_such_file(exc):
            return False
        raise


# -- writing ------------------------------------------------------------------------------------------------

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


def fsync_directory(path: Path) -> None:
    """Make the names in `path` durable (a rename or a new file survives a power cut)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_nofollow(path: Path, flags: int) -> int:
    """`os.open` of `path` with `flags`, created with FILE_MODE if missing: the descriptor. Never through a
    symbolic link (O_NOFOLLOW: an `OSError` with errno ELOOP), which would have us write to its target."""
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)


def open_run_file(path: Path, flags: int) -> int:
    """`open_nofollow` of a run-directory file: a symbolic link planted in a run directory (which would have us
    write to its target) is a `LinkRefused` in the run directory's wording."""
    try:
        return open_nofollow(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(path, RUN_DIR_CHANGES, in_run_dir=True) from None
        raise


def create_new_file(path: Path, refuse_links: bool = True) -> int:
    """A new file at `path` for writing (FILE_MODE), the descriptor: O_EXCL and O_NOFOLLOW make it an inode no
    other name shares. A symbolic link at the name is refused (`LinkRefused`) and left alone (`refuse_links`;
    else removed); a file there (our own leftover, or a hard link planted to have us write into its other name)
    is unlinked, never opened."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, FILE_MODE)
    except FileExistsError:
        if refuse_links and path.is_symlink():
            raise LinkRefused(path) from None
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        return os.open(path, flags, FILE_MODE)
    except FileExistsError:  # planted again at once: someone is racing us for the name
        raise UserError(f"{path}: appeared again as it was being replaced; tideborn never writes through an "
                        "entry it did not create: remove it") from None


def temp_path(path: Path) -> Path:
    """The hidden temp file beside `path` that this process writes before the rename (`.NAME.tmp-PID`)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


SCRATCH_MARK = ".scratch-"


def create_scratch_file(beside: Path, serial: int) -> tuple[int, Path]:
    """A new hidden scratch file beside `beside` for a build's intermediate data (`.NAME.scratch-PID-SERIAL`),
    opened for reading and writing by descriptor (`os.pread`/`os.write`): (descriptor, path). It is never
    published; the builder removes it when the build ends, however it ends, and `remove_stale_scratch`
    removes those of a builder killed outright (SIGKILL, a power cut)."""
    path = beside.with_name(f".{beside.name}{SCRATCH_MARK}{os.getpid()}-{serial}")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # a new inode, read back by us
    try:
        return os.open(path, flags, 0o600), path
    except FileExistsError:  # our own leftover (a pid reused after a SIGKILL): never opened, replaced
        os.unlink(path)
    return os.open(path, flags, 0o600), path


def remove_stale_scratch(beside: Path, folders: bool = False) -> list[Path]:
    """Remove the scratch files of `beside` whose builder is gone (`.NAME.scratch-PID-N`, PID not running):
    what a SIGKILL left; with `folders`, scratch folders too (a build's working folder, removed whole, never
    followed through a link). Returns what was removed."""
    named = re.compile(rf"^\.{re.escape(beside.name)}{re.escape(SCRATCH_MARK)}(\d+)(?:-|$)")
    return _remove_stale(beside.parent, named, folders)


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temp files of `path` (`temp_path`) left by writers that died without cleaning up (SIGKILL, a
    power cut): `.NAME.tmp-PID` whose PID is not a running process. Returns what was removed."""
    return _remove_stale(path.parent, re.compile(rf"^\.{re.escape(path.name)}\.tmp-(\d+)$"))


def _remove_stale(folder: Path, named: re.Pattern[str], folders: bool = False) -> list[Path]:
    """Remove the entries of `folder` that `named` matches whose writer (the PID of its first group) is gone."""
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = named.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid() or writer_running(int(match.group(1))):
            continue
        try:
            if folders and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        except FileNotFoundError:  # another writer removed it first
            pass
    return removed


def writer_running(pid: int) -> bool:
    """Whether the process that named a temp or scratch file after itself may still write it. A zombie (killed,
    not yet reaped by its parent: a SIGKILLed pool's children, while their reaper is slow on a busy machine) may
    not: its files are stale."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: running
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[-1].split()[:1]
    except FileNotFoundError:  # gone this moment, or no /proc to ask (not Linux): running, as far as we can tell
        return not os.path.isdir("/proc/self")
    except OSError:
        return True
    return state != [b"Z"]


def write_temp(temp: Path, write: typing.Callable[[typing.BinaryIO], object], refuse_links: bool = True) -> None:
    """Fill a new file at `temp` (`create_new_file`) with `write`, and fsync it: the first half of an atomic
    write, for a caller that checks the content before it publishes it (`publish`). If `write` fails, the temp
    file is removed; a link refused at its name is left alone."""
    fd = create_new_file(temp, refuse_links)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def publish(pairs: typing.Sequence[tuple[Path, Path]]) -> None:
    """Rename each (temp, path) over its `path`, in order, then fsync their directories. A rename replaces a
    link at `path`, never writes through it. An `OSError` names the pair it failed on (filename, filename2)."""
    for temp, path in pairs:
        os.replace(temp, path)
    for directory in dict.fromkeys(path.parent for _, path in pairs):
        fsync_directory(directory)


def refuse_link_at(path: Path) -> None:
    """`LinkRefused` if `path` is a symbolic link (a file to be replaced by one the user did not choose)."""
    if path.is_symlink():
        raise LinkRefused(path)


def refuse_link(path: Path) -> None:
    """`refuse_link_at` for an entry of a run directory, said as a problem of `runtime.out_dir`: run files are
    never moved, written or deleted through a link."""
    if path.is_symlink():
        raise LinkRefused(path, RUN_DIR_CHANGES, in_run_dir=True)


def write_atomically(path: Path, write: typing.Callable[[typing.BinaryIO], object],
                     check: typing.Callable[[Path], object] | None = None, refuse_link: bool = False) -> None:
    """Write `path` whole or not at all: `write` fills a hidden temp file beside it (`.NAME.tmp-PID`, created
    with FILE_MODE), which is fsynced, shown to `check` (which raises to refuse it), and renamed over `path`;
    then the directory is fsynced. If anything fails, the temp file is removed and the old `path`, if any, is
    untouched. Neither name is ever followed: the temp file is a new inode (`create_new_file`), and the rename
    replaces a link at `path`, not its target; with `refuse_link`, a link at `path` is refused instead."""
    if refuse_link:
        refuse_link_at(path)
    temp = temp_path(path)
    write_temp(temp, write)
    try:
        if check is not None:
            check(temp)
        if refuse_link:
            refuse_link_at(path)  # planted while we wrote: still never replaced
        publish([(temp, path)])
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def link_atomically(source: Path, path: Path) -> None:
    """Make `path` a second name of `source` (a hard link; a copy where the filesystem has none), published by a
    rename over whatever `path` was: a link or a file planted there is replaced, never written through."""
    temp = temp_path(path)
    try:
        os.unlink(temp)
    except FileNotFoundError:
        pass
    try:
        os.link(source, temp, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        with open_regular(source, follow_links=False) as original:
            write_atomically(path, lambda handle: shutil.copyfileobj(original, handle, 1024 * 1024))
        return
    try:
        publish([(temp, path)])
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def move_files(paths: typing.Sequence[Path], folder: Path) -> None:
    """Move `paths` into `folder` by renames (one file system: a file is in one place or the other, never
    copied half), then fsync the folder and the directories they left."""
    publish([(path, folder / path.name) for path in paths])
    for directory in dict.fromkeys(path.parent for path in paths):
        fsync_directory(directory)


PROBE_PREFIX = ".tideborn-write-probe-"


def write_probe(directory: Path) -> None:
    """Show that files can be written in `directory`: a hidden probe file created there (O_EXCL, O_NOFOLLOW),
    written a block (on a full disk an empty file can still be created), fsynced and removed; nothing stays.
    `OSError` as the OS says why not."""
    probe = directory / f"{PROBE_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.unlink(probe)
