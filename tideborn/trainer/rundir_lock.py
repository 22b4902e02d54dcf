"""One trainer per run directory: an advisory `flock` held for the trainer's lifetime.

The kernel drops the lock when the process dies, however it dies, so a crash never leaves a stale
lock behind; a second trainer aimed at the same directory is refused and told which pid holds it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tideborn.errors import UserError
from tideborn.rundir import TRAINER_LOCK_FILE, open_run_file, os_error_text


class RunDirLock:
    def __init__(self, run_dir: Path):
        self.path = run_dir / TRAINER_LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        try:
            fd = open_run_file(self.path, os.O_RDWR)  # never through a link (O_NOFOLLOW)
        except OSError as exc:
            raise UserError(f"runtime.out_dir: cannot open {self.path}: {os_error_text(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(f"{self.path.parent}: another trainer (pid {holder}) is using this run "
                            "directory; stop it first or choose another runtime.out_dir") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise UserError(f"runtime.out_dir: cannot write {self.path}: {os_error_text(exc)}") from None
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
