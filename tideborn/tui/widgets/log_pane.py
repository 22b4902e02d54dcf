"""The tail of train.log, error lines (OOM, CUDA, NCCL) and tracebacks highlighted.

It follows new lines like `tail -f` until the reader scrolls up (or presses f): then it stays put while
lines arrive, and End (or f again) follows once more. Long lines scroll sideways, or wrap (w). A line
can be jumped to by its number (Enter on a log anomaly)."""

from __future__ import annotations

import collections

from rich.text import Text
from textual import events
from textual.widgets import RichLog

MAX_LINES = 2000
STYLES = {"error": "bold red", "traceback": "red", "": ""}


class LogPane(RichLog):
    def __init__(self, colour: bool = True, id: str | None = None) -> None:
        super().__init__(max_lines=MAX_LINES, wrap=False, highlight=False, markup=False, auto_scroll=False, id=id)
        self.colour = colour
        self.errors = 0
        self.follow = True
        """New lines scroll into view (tail -f); off while the reader looks further up."""
        self._kept: collections.deque[tuple[int | None, Text]] = collections.deque(maxlen=MAX_LINES)
        """What is shown, to draw again when wrapping is switched."""
        self._strip_of: dict[int, int] = {}
        """train.log line number -> the index of its first strip, counted from the first ever written."""

    def on_mount(self) -> None:
        self._title()

    def _title(self) -> None:
        title = "train.log" + (f" ({self.errors} error lines)" if self.errors else "")
        self.border_title = title
        self.border_subtitle = ("following" if self.follow else "paused: f or End follows") + (
            ", wrapped" if self.wrap else "")

    def add_lines(self, lines: list[tuple[int, str, str]], reset: bool = False) -> None:
        if reset:
            self.clear()
            self._kept.clear()
            self._strip_of.clear()
            self._write(None, Text("(train.log was truncated or replaced: reading it again)", style="dim italic"))
        for number, text, kind in lines:
            if kind:
                self.errors += 1
            style = STYLES.get(kind, "") if self.colour else ("bold" if kind else "")
            self._write(number, Text(text.expandtabs(), style=style, no_wrap=not self.wrap))
        self._title()

    def _write(self, number: int | None, text: Text) -> None:
        self._kept.append((number, text))
        if number is not None:
            self._strip_of[number] = self._start_line + len(self.lines)
            if len(self._strip_of) > 2 * MAX_LINES:  # forget lines long gone from the pane
                for old in list(self._strip_of)[:MAX_LINES]:
                    del self._strip_of[old]
        self.write(text, scroll_end=self.follow)

    # -- reading ---------------------------------------------------------------------------------------
    def set_follow(self, on: bool) -> None:
        self.follow = on
        if on:
            self.scroll_end(animate=False, immediate=False, x_axis=False)
        self._title()

    def toggle_follow(self) -> bool:
        self.set_follow(not self.follow)
        return self.follow

    def toggle_wrap(self) -> bool:
        """Long lines wrap, or scroll sideways; what is shown is drawn again either way. Paused, the
        train.log line at the top of the view stays there: drawing again starts from the top, and wrapped
        lines take more rows, so the same scroll offset would show another part of the log."""
        anchor = None if self.follow else self.line_at_top()
        self.wrap = not self.wrap
        kept = list(self._kept)
        self.clear()
        self._kept.clear()
        self._strip_of.clear()
        for number, text in kept:
            text.no_wrap = not self.wrap
            self._write(number, text)
        if anchor is not None:
            self.jump_to(anchor)
        self._title()
        return self.wrap

    def line_at_top(self) -> int | None:
        """The number of the train.log line at the top of the view (the one a wrapped top row belongs to)."""
        top = self._start_line + round(self.scroll_y)
        found: tuple[int, int] | None = None
        for number, first in self._strip_of.items():
            if first <= top and (found is None or first > found[1]):
                found = (number, first)
        return found[0] if found is not None else None

    def jump_to(self, number: int) -> bool:
        """Scroll to train.log line `number` and stop following; False if it is not in the pane."""
        first = self._strip_of.get(number)
        if first is None or first < self._start_line:
            return False
        self.set_follow(False)
        self.scroll_to(y=first - self._start_line, animate=False, immediate=True)
        return True

    def action_scroll_up(self) -> None:
        self.set_follow(False)
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.set_follow(False)
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self.set_follow(False)
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        super().action_scroll_end()
        self.set_follow(True)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.set_follow(False)
