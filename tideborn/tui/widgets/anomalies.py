"""Anomalies, from the rules `train_run status` uses: each with its time, step and evidence. New ones
light the pane up, scroll into view and raise a notification; focus stays where it was. The pane keeps
its alert colour while any anomaly holds (as `status` reports it)."""

from __future__ import annotations

import json

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tideborn.humanize import clock
from tideborn.rundir.anomaly import Anomaly

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
        self.holding = False

    def on_mount(self) -> None:
        self._title()

    def _title(self) -> None:
        self.border_title = f"anomalies ({len(self.anomalies)})" if self.anomalies else "anomalies: none"

    def add_anomalies(self, anomalies: list[Anomaly], earlier: bool = False) -> list[Anomaly]:
        """Add those not shown yet; returns them. `earlier`: found in the history before the tail that was
        read first, so they go before those shown (the list stays oldest first)."""
        if earlier:
            fresh = [a for a in anomalies if anomaly_key(a) not in self._seen]
            if fresh:
                self._seen.update(anomaly_key(a) for a in fresh)
                self.anomalies[:0] = fresh
                at = self.highlighted
                self.clear_options()
                self.add_options([Option(self._prompt(a), id=f"a{i + 1}") for i, a in enumerate(self.anomalies)])
                self.highlighted = None if at is None else at + len(fresh)
                self._title()
            return fresh
        followed = self.highlighted is None or self.highlighted == self.option_count - 1
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
            if followed:  # on the newest already (or none yet): the highlight follows, into view
                self.highlighted = self.option_count - 1
                self.scroll_to_highlight()
            else:  # the reader moved up to one: it stays, and the new ones still come into view
                self.scroll_end(animate=False)
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
        """New anomalies: the alert colour, for ALERT_SECONDS at least and while any anomaly holds."""
        self.add_class("-alert")
        self.set_timer(ALERT_SECONDS, lambda: self.set_class(self.holding, "-alert"))

    def hold(self, holding: bool) -> None:
        """Whether anomalies hold now (the run's status lists some): the alert colour stays meanwhile."""
        self.holding = holding
        if holding:
            self.add_class("-alert")

    def selected_anomaly(self) -> Anomaly | None:
        if self.highlighted is None or not 0 <= self.highlighted < len(self.anomalies):
            return None
        return self.anomalies[self.highlighted]
