"""User errors: bad input that gets one clear line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import sys

USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad input from the user (settings, files, arguments). The message is the whole story."""


def report_user_error(error: UserError, program: str = "tideborn") -> int:
    message = " ".join(str(error).split("\n"))
    print(f"{program}: error: {message}", file=sys.stderr)
    return USER_ERROR_EXIT
