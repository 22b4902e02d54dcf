"""The trainer's progress on stdout: one updating line per logged step on a TTY, else one line per logged step,
and its messages between them. (The data tools' counter of records or files done is `data.tools.progress`.)"""

from __future__ import annotations

import sys
import typing

from tideborn.humanize import duration


class StepProgress:
    def __init__(self, style: str, stream: typing.TextIO | None = None):
        self.stream = stream or sys.stdout
        if style == "auto":
            style = "line" if self.stream.isatty() else "plain"
        self.style = style
        self._open_line = False

    def step(self, step: int, max_steps: int, record: dict, eta_seconds: float) -> None:
        if self.style == "off":
            return
        text = (f"step {step}/{max_steps} | loss {record['loss']:.4f} "
                f"(policy {record['policy_loss']:.4f}, value {record['value_loss']:.4f}) | "
                f"lr {record['lr']:.2e} | {record['positions_per_second']:,.0f} pos/s | "
                f"eta {duration(eta_seconds)}")
        if self.style == "line":
            self.stream.write("\r\033[K" + text)
            self._open_line = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.style == "off":
            return
        self.end_line()
        self.stream.write(text + "\n")
        self.stream.flush()

    def end_line(self) -> None:
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False
