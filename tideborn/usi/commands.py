"""What a GUI's commands say, read for `tideborn usi` (tideborn.usi.engine): `go`'s limits, the options' values,
and the GUI's own words as an error line quotes them (cut short, without control characters: they may be anything,
a 5 MB token or a terminal's escape sequence)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from tideborn.errors import UserError
from tideborn.usi.thinking import Clock

_WHOLE_NUMBER = re.compile(r"-?[0-9]+")
MAX_ECHO_CHARS = 40
"""A word of the GUI's quoted in an error line is cut to this many characters (a 5 MB token is not sent back)."""
MAX_ERROR_WORD_CHARS = 100
"""Any word of an error line is cut to this many: the words other modules quote (a SFEN's board is seldom past 80)."""


def printable(text: str) -> str:
    """`text` without control characters (escape sequences, bidi overrides, NUL): a GUI's log or a terminal shows
    an error line as it is."""
    return "".join(char for char in text if unicodedata.category(char) not in ("Cc", "Cf", "Cs"))


def error_text(message: str) -> str:
    """An error message as one line: whitespace runs made one space, every word cut to `MAX_ERROR_WORD_CHARS`
    and rid of control characters (messages from other modules quote the GUI's words too)."""
    words = (printable(word[:MAX_ERROR_WORD_CHARS]) + ("..." if len(word) > MAX_ERROR_WORD_CHARS else "")
             for word in message.split())
    return " ".join(word for word in words if word)


def echo(word: str) -> str:
    """A word of the GUI's as an error line quotes it: cut to `MAX_ECHO_CHARS`, control characters removed."""
    if len(word) <= MAX_ECHO_CHARS:
        return repr(printable(word))
    return f"{printable(word[:MAX_ECHO_CHARS])!r}... ({len(word):,} characters)"


@dataclass
class Option:
    name: str
    kind: str
    """USI's option types used here: `check` or `spin`."""
    default: int | bool
    low: int = 0
    high: int = 0

    def declaration(self) -> str:
        if self.kind == "check":
            return f"option name {self.name} type check default {'true' if self.default else 'false'}"
        return f"option name {self.name} type spin default {self.default} min {self.low} max {self.high}"

    def parse(self, text: str) -> int | bool:
        if self.kind == "check":
            if text not in ("true", "false"):
                raise UserError(f"option {self.name}: {echo(text)} is not true or false")
            return text == "true"
        if not _WHOLE_NUMBER.fullmatch(text):
            raise UserError(f"option {self.name}: {echo(text)} is not a whole number")
        if len(text.lstrip("-0")) > len(str(self.high)) or not self.low <= int(text) <= self.high:
            raise UserError(f"option {self.name}: {echo(text)} is outside {self.low}..{self.high}")
        return int(text)


@dataclass(frozen=True)
class Go:
    clock: Clock
    nodes: int | None = None
    infinite: bool = False
    ponder: bool = False


_GO_NUMBERS = ("btime", "wtime", "binc", "winc", "byoyomi", "nodes")
REFUSED_GO = Go(Clock(byoyomi=0), nodes=0)
"""What a `go` the engine cannot read gets: the net's first evaluation at once, no search."""


def parse_go(tokens: list[str]) -> Go:
    """The `go` command's limits; `UserError` for a field it cannot read or a negative limit (the engine then
    answers at once, without a search)."""
    numbers: dict[str, int] = {}
    flags = set()
    index = 0
    while index < len(tokens):
        word = tokens[index]
        if word in _GO_NUMBERS:
            if index + 1 >= len(tokens):
                raise UserError(f"go: {word} without a number")
            numbers[word] = _limit(word, tokens[index + 1])
            index += 2
            continue
        if word in ("infinite", "ponder"):
            flags.add(word)
        elif word == "mate":
            raise UserError("go mate: this engine does not search for mates (no `go mate`)")
        else:
            raise UserError(f"go: unknown field {echo(word)}")
        index += 1
    clock = Clock(**{key: numbers[key] for key in ("btime", "wtime", "binc", "winc", "byoyomi") if key in numbers})
    return Go(clock, numbers.get("nodes"), "infinite" in flags, "ponder" in flags)


def _limit(field: str, text: str) -> int:
    """A `go` field's number: a whole number, 0 or more (milliseconds, or playouts for `nodes`)."""
    if not _WHOLE_NUMBER.fullmatch(text):
        raise UserError(f"go: {field} {echo(text)} is not a whole number")
    try:
        value = int(text)
    except ValueError:  # past Python's limit on the digits it converts: no clock or node count is that long
        raise UserError(f"go: {field} {echo(text)} is too large") from None
    if value < 0:
        raise UserError(f"go: {field} {echo(text)} is negative; a limit is 0 or more")
    return value
