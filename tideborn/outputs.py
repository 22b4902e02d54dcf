"""Files the tools write where the user says (`export --out`, `data convert --output`, `data split --train
--test`): regular files only, created like run-directory files (0o644, directories 0o755, whatever the
umask), published whole by a rename, several of them as a group, and a failed write said in one line.

No torch and no numpy here: the data tools' argument checks use it before anything heavy loads.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import threading
import typing
from pathlib import Path

from tideborn.errors import UserError
from tideborn.rundir.layout import is_run_entry
from tideborn.safefile import (
    file_type,
    make_dirs,
    os_error_text,
    publish,
    remove_stale_temps,
    temp_path,
    write_probe,
    write_temp,
)


class OutputError(UserError):
    """An output could not be written (a full disk, no permission): one line naming the file."""


def check_output_path(path: Path, flag: str) -> None:
    """Refuse an output path that exists and is not a regular file (a directory, a device node such as
    /dev/null, a FIFO): the tools replace their outputs whole, and replacing those would be a surprise
    at best (run as root, `--out /dev/null` would replace the device node). Refuse, wherever it is, a name the
    run directory contract gives a run file (events.jsonl, train.pid, step-*.pt, ...): an output named so
    would replace a run's own file, and a run's history or checkpoint is never an output."""
    if is_run_entry(path.name):
        raise UserError(f"{flag} {path}: {path.name} is the name of a run directory's own file (the run directory "
                        "contract, docs/run-tools.md); name the output otherwise, e.g. model.onnx")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot use it: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{flag} {path}: is {file_type(mode)}; name a regular file to write (it is "
                        f"replaced whole)")


def probe_directory(directory: Path, flag: str, output: Path | None = None) -> None:
    """Refuse (`UserError`, one line) a directory that outputs cannot be written to, before any work: a
    read-only mount, a full disk, no permission, /proc. The evidence is a hidden probe file created (O_EXCL,
    O_NOFOLLOW), written a block (a full disk still lets an empty file be created) and removed, in `directory`
    or, when it does not exist yet, in the nearest ancestor it would be created in. Nothing stays. The message
    names `output` (the file to be written there), else the directory."""
    named = directory if output is None else output
    where = directory
    while not os.path.lexists(where) and where.parent != where:  # a dangling link counts: it is in the way
        where = where.parent
    if not where.is_dir():
        raise UserError(f"{flag} {named}: {where} is not a directory")
    try:
        write_probe(where)
    except OSError as exc:
        doing = f"cannot write in {where}" if where == directory else f"cannot create {directory} in {where}"
        raise UserError(f"{flag} {named}: {doing}: {os_error_text(exc)}") from None


def check_output_before_work(path: Path, flag: str) -> None:
    """Everything about an output file that can be known before the work (`export --out`, and the monitor's
    export dialog before it starts one): a regular file or nothing, not a run directory's own file, in an
    existing directory that can be written."""
    check_output_path(path, flag)
    if not path.parent.is_dir():
        raise UserError(f"{flag} {path}: directory {path.parent} does not exist")
    probe_directory(path.parent, flag, output=path)


def same_output(a: Path, b: Path) -> bool:
    """Whether two paths would write the same file: the same path once normalised, equal but for case (one
    file on a case-insensitive file system), or, where both exist, the same inode (a link, a bind mount)."""
    ra, rb = a.resolve(), b.resolve()
    if ra == rb or str(ra).casefold() == str(rb).casefold():
        return True
    try:
        return os.path.samefile(ra, rb)
    except OSError:  # one of them does not exist yet: then they cannot be one file
        return False


def describe_write_error(exc: OSError, path: Path) -> str:
    if exc.errno == errno.ENOSPC:
        return f"disk full writing {path}; nothing was replaced (free some space and run it again)"
    if exc.errno == errno.EDQUOT:
        return f"disk quota exceeded writing {path}; nothing was replaced"
    return f"cannot write {path}: {exc.strerror or exc}; nothing was replaced"


@contextlib.contextmanager
def _signals_held() -> typing.Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while a group of renames runs (they arrive after it), so that an
    interrupt cannot publish half a group. Only the main thread receives them; elsewhere, nothing to do."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class StagedOutputs:
    """Outputs written to hidden temp files, then published together by renames (in the order written).

    Use as a context manager: whatever was not published when the block ends (an error, Ctrl-C) is
    removed, so no temp file is left behind by anything short of SIGKILL, and the next writer of the same
    output removes those (`safefile.remove_stale_temps`). Writes that fail are `OutputError`s naming the output.
    """

    def __init__(self) -> None:
        self.staged: list[tuple[Path, Path]] = []

    def __enter__(self) -> StagedOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def prepare(self, path: Path, flag: str) -> None:
        """Check `path` can be written (a regular file or nothing). Its directory is made only when the
        output is written, so a refusal found later (the next output's path, the input) leaves nothing."""
        check_output_path(path, flag)

    def write(self, path: Path, fill: typing.Callable[[typing.BinaryIO], object]) -> Path:
        """Stage `path`: `fill` writes its content into the temp file, which is then fsynced. Returns
        the temp file's path (to read the content back before publishing)."""
        try:
            make_dirs(path.parent)
        except OSError as exc:
            raise OutputError(describe_write_error(exc, path.parent)) from None
        remove_stale_temps(path)
        temp = temp_path(path)
        self.staged.append((temp, path))
        try:
            write_temp(temp, fill, refuse_links=False)  # whatever is at our temp name is replaced, not followed
        except OSError as exc:
            raise OutputError(describe_write_error(exc, path)) from None
        return temp

    def publish(self) -> None:
        """Rename every staged file over its output, Ctrl-C held back until all are done, then fsync
        their directories."""
        try:
            with _signals_held():
                publish(self.staged)
        except OSError as exc:
            raise OutputError(f"cannot publish {exc.filename2 or exc.filename}: {exc.strerror or exc}") from None
        self.staged = []

    def discard(self) -> None:
        for temp, _ in self.staged:
            temp.unlink(missing_ok=True)
        self.staged = []
