"""User errors and Ctrl-C: one clear line on stderr (exit status 2, or 130 for Ctrl-C), never a traceback."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator

# Light imports only (no typing, no threading): the entry points import this module before their Ctrl-C guard.

USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad input from the user (settings, files, arguments). The message is the whole story."""


def report_user_error(error: UserError, program: str = "tideborn") -> int:
    report_error(str(error), program)
    return USER_ERROR_EXIT


def report_error(message: str, program: str) -> None:
    """Every command's one error line: `PROGRAM: error: MESSAGE` (as argparse's usage errors), on stderr."""
    message = " ".join(message.split("\n"))
    print(f"{program}: error: {message}", file=sys.stderr)


INTERRUPTED_EXIT = 130
"""128 + SIGINT, what a shell reports for a command ended by Ctrl-C."""

NOTHING_HALF_WRITTEN = "; nothing half-written is left"
"""What Ctrl-C leaves of a tool whose outputs are written whole or not at all."""


def report_interrupted(program: str, tail: str = NOTHING_HALF_WRITTEN) -> int:
    """One line for Ctrl-C, `tail` saying when it came and what it left (not a traceback)."""
    clear = "\r\x1b[K" if sys.stderr.isatty() else ""  # over a progress line, if one is showing
    print(f"{clear}{program}: interrupted (Ctrl-C){tail}", file=sys.stderr)
    return INTERRUPTED_EXIT


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, raised where it is known when it came and what it left: `tail` ends the one line
    (`report_interrupted`)."""

    def __init__(self, tail: str):
        super().__init__(tail)
        self.tail = tail


_ctrl_c_noted = False


def interrupt(signum: int = signal.SIGINT, frame: object = None) -> None:
    """SIGINT's handler in a command (`ctrl_c_noted`): raises KeyboardInterrupt, as Python's own handler does, and
    notes it. A C extension's module init that a Ctrl-C interrupts can swallow the KeyboardInterrupt and raise
    another error in its place with no trace of it (cshogi's `numpy.core.multiarray failed to import`, an
    ImportError whose cause and context are None): the note is what is left to tell that error from a bug."""
    global _ctrl_c_noted
    _ctrl_c_noted = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_noted() -> Iterator[None]:
    """For the block, Ctrl-C is `interrupt`: a KeyboardInterrupt, noted. Only over Python's own handler: SIGINT
    ignored (a background job) or handled by someone else is left as it is."""
    global _ctrl_c_noted
    if signal.getsignal(signal.SIGINT) is interrupt:  # a command inside another (`tideborn data`): the outer one's
        yield
        return
    _ctrl_c_noted = False
    installed = False
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        try:
            signal.signal(signal.SIGINT, interrupt)
            installed = True
        except ValueError:  # not the main thread: only the main thread receives signals, so nothing to note
            pass
    try:
        yield
    finally:
        if installed and signal.getsignal(signal.SIGINT) is interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def caused_by_ctrl_c(error: BaseException) -> bool:
    """A KeyboardInterrupt; an error raised from one or while handling one; or any error once a Ctrl-C was
    noted (`interrupt`): the user asked the command to end, and this is how it ended."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__ if link.__cause__ is not None else link.__context__
    return _ctrl_c_noted


def run_reporting_ctrl_c(command: Callable[[], int], program: str) -> int:
    """`command()`, a whole command with its imports, with Ctrl-C at any moment reported as one line and exit
    status 130: a KeyboardInterrupt, or an error that Ctrl-C caused (`caused_by_ctrl_c`)."""
    with ctrl_c_noted():
        try:
            return command()
        except (Exception, KeyboardInterrupt) as exc:
            if not caused_by_ctrl_c(exc):
                raise
            return report_interrupted(program, getattr(exc, "tail", NOTHING_HALF_WRITTEN))


def run_command(handler: Callable[[object], int], args: object, program: str) -> int:
    """A subcommand's `handler(args)` as its `main` runs it: a user error is one line and exit 2, a closed pipe
    (`| head`) a quiet 0, and Ctrl-C at any moment one line and exit 130 (`run_reporting_ctrl_c`)."""
    def run() -> int:
        try:
            return handler(args)
        except UserError as exc:
            return report_user_error(exc, program)
        except BrokenPipeError:
            return 0

    return run_reporting_ctrl_c(run, program)
