"""The command lines' argparse: a usage error is one line on stderr, `PROG COMMAND: error: ... (see
--help)`, and exit status 2, in every command's own name (tideborn.errors has the same for bad input)."""

from __future__ import annotations

import argparse
import sys
import typing

USAGE_EXIT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2, named for the subcommand."""

    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(USAGE_EXIT)

    def parse_args(self, args: typing.Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        # argparse reports unknown options with the top parser's name (`tideborn: error: unrecognized
        # arguments`), though they were given to a subcommand: let the subcommand's parser say it.
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self._chosen(parsed).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost subcommand's parser that `parsed` came through (this one, without subcommands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(sub, OneLineParser):
                    return sub._chosen(parsed)
        return self


def _whole_number(text: str, least: int, rule: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {rule}; got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse `type`: a whole number of at least 0 (playouts, where 0 means none)."""
    return _whole_number(text, 0, "0 or more")


def positive_int(text: str) -> int:
    """An argparse `type`: a whole number of at least 1 (games, threads, batches, copies)."""
    return _whole_number(text, 1, "at least 1")
