"""Anomalies, from the rules `train_run status` uses: each with its time, step and evidence. New ones
light the pane up and raise a notification; focus stays where it was."""

from __future__ import annotations

import json

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tideborn.anomaly import Anomaly
from tideborn.humanize import clock

ALERT_SECONDS = 10.0


def clock_text(when: float) -> str:
    return clock(when) if when else "--:--:--"


def _evidence_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if isinstance(value, str) else str(value)


def evidence_text(anomaly: Anomaly) -> str:
    shown = {k: v for k, v in anomaly.evidence.items() if v is not None and k != "step"}
    return " ".join(f"{k}={_evidence_value(v)}" for k, v in shown.items())


def anomaly_key(anomaly: Anomaly) -> tuple:
    return anomaly.rule, anomaly.message


class AnomalyList(OptionList):
    """The run's anomalies, newest last; Enter shows one in full."""

    def __init__(self, colour: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.colour = colour
        self.anomalies: list[Anomaly] = []
        self._seen: set[tuple] = set()

    def on_mount(self) -> None:
        self._title()

    def _title(self) -> None:
        self.border_title = f"anomalies ({len(self.anomalies)})" if self.anomalies else "anomalies: none"

    def add_anomalies(self, anomalies: list[Anomaly]) -> list[Anomaly]:
        """Add those not shown yet; returns them."""
        new = []
        for anomaly in anomalies:
            key = anomaly_key(anomaly)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.anomalies.append(anomaly)
            new.append(anomaly)
            self.add_option(Option(self._prompt(anomaly), id=f"a{len(self.anomalies)}"))
        if new:
            self._title()
            self.highlighted = self.option_count - 1 if self.highlighted is None else self.highlighted
        return new

    def _prompt(self, anomaly: Anomaly) -> Text:
        step = anomaly.evidence.get("step")
        text = Text(no_wrap=False)
        text.append(clock_text(anomaly.time) + " ", style="dim" if self.colour else "")
        if isinstance(step, int):
            text.append(f"step {step:,} ")
        text.append(anomaly.rule, style="bold red" if self.colour else "bold")
        text.append(": " + anomaly.message)
        evidence = evidence_text(anomaly)
        if evidence:
            text.append("\n  " + evidence, style="dim" if self.colour else "")
        return text

    def alert(self) -> None:
        self.add_class("-alert")
        self.set_timer(ALERT_SECONDS, lambda: self.remove_class("-alert"))

    def selected_anomaly(self) -> Anomaly | None:
        if self.highlighted is None or not 0 <= self.highlighted < len(self.anomalies):
            return None
        return self.anomalies[self.highlighted]
