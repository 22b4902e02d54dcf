"""Progress of the long data tools, on stderr: an updating line on a terminal, a line every few seconds
otherwise (a log stays readable), and nothing for runs that finish quickly: how much of a known total is done.
(The trainer's per-step line is `trainer.progress`.)"""

from __future__ import annotations

import sys
import time
import typing

PLAIN_INTERVAL_SECONDS = 10.0
TERMINAL_INTERVAL_SECONDS = 0.25
QUIET_SECONDS = 1.0


class CountProgress:
    def __init__(self, label: str, total: int, unit: str, stream: typing.TextIO | None = None,
                 enabled: bool = True):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.terminal = self.stream.isatty()
        self.started = time.monotonic()
        self.last_shown = self.started
        self.shown = False

    def update(self, done: int, extra: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        interval = TERMINAL_INTERVAL_SECONDS if self.terminal else PLAIN_INTERVAL_SECONDS
        if now - self.started < QUIET_SECONDS or now - self.last_shown < interval:
            return
        self.last_shown = now
        self._show(done, extra)

    def _show(self, done: int, extra: str) -> None:
        percent = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        text = f"{self.label}: {done:,}/{self.total:,} {self.unit}{percent}{', ' + extra if extra else ''}"
        if self.terminal:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown and self.terminal:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
