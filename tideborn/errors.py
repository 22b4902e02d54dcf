"""User errors: bad input that gets one clear line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import sys

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


def report_interrupted(program: str) -> int:
    """One line for Ctrl-C in a tool whose outputs are written whole or not at all (not a traceback)."""
    clear = "\r\x1b[K" if sys.stderr.isatty() else ""  # over a progress line, if one is showing
    print(f"{clear}{program}: interrupted (Ctrl-C); nothing half-written is left", file=sys.stderr)
    return INTERRUPTED_EXIT
