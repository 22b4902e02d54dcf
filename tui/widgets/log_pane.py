"""The tail of train.log, error lines (OOM, CUDA, NCCL) and tracebacks highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

MAX_LINES = 2000
STYLES = {"error": "bold red", "traceback": "red", "": ""}


class LogPane(RichLog):
    def __init__(self, colour: bool = True, id: str | None = None) -> None:
        super().__init__(max_lines=MAX_LINES, wrap=False, highlight=False, markup=False, auto_scroll=True, id=id)
        self.colour = colour
        self.errors = 0

    def on_mount(self) -> None:
        self.border_title = "train.log"

    def add_lines(self, lines: list[tuple[int, str, str]], reset: bool = False) -> None:
        if reset:
            self.clear()
            self.write(Text("(train.log was truncated or replaced: reading it again)", style="dim italic"))
        for _number, text, kind in lines:
            if kind:
                self.errors += 1
            style = STYLES.get(kind, "") if self.colour else ("bold" if kind else "")
            self.write(Text(text.expandtabs(), style=style, no_wrap=True))
        if self.errors:
            self.border_title = f"train.log ({self.errors} error lines)"
