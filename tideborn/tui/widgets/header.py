"""The run header: state, step / max_steps with ETA, positions/s, lr, time since the last event, and
the last checkpoint with its age. Ages come from the app's clock (tests fix it)."""

from __future__ import annotations

import typing
from pathlib import Path

from rich.text import Text
from textual.widget import Widget

from tideborn.humanize import duration, number

STATE_STYLES = {
    "running": "bold green", "stalled": "bold yellow", "finished": "bold blue", "stopped": "bold cyan",
    "failed": "bold red", "vanished": "bold red", "unknown": "bold", "not started": "dim",
}


class RunHeader(Widget):
    def __init__(self, run_dir: Path, clock: typing.Callable[[], float], colour: bool = True,
                 id: str | None = None, ascii: bool = False) -> None:
        super().__init__(id=id)
        self.run_dir = run_dir
        self.clock = clock
        self.colour = colour
        self.ascii = ascii
        """Only ASCII characters (`--ascii`): the Elo sparkline too."""
        self.status: dict | None = None
        self.stopping_since: float | None = None
        self.note = ""
        self.shown_text = ""
        self._text = Text()

    def on_mount(self) -> None:
        self.show()
        self.set_interval(1.0, self.show)

    def show_status(self, status: dict) -> None:
        self.status = status
        if status.get("terminal") or status.get("state") not in ("running", "stalled"):
            self.stopping_since = None
        self.show()

    def stopping(self) -> tuple[str, float] | None:
        """(signal, since when) while a stop is in progress: sent from here, or seen in the run's events
        (`stop_requested`: a stop sent from anywhere else)."""
        s = self.status or {}
        if s.get("state") not in ("running", "stalled"):
            return None
        requested = s.get("stop_requested") or {}
        when = requested.get("requested_at") or requested.get("time")
        if self.stopping_since is not None:
            return str(requested.get("signal") or "SIGTERM"), self.stopping_since
        if requested and isinstance(when, (int, float)):
            return str(requested.get("signal") or "a stop signal"), float(when)
        return None

    def show(self) -> None:
        text = self.text()
        if text.plain != self.shown_text:  # ages tick every second; nothing else redraws the header
            self.shown_text = text.plain
            self._text = text
            self.refresh()  # a fixed size: no layout pass

    def render(self) -> Text:
        return self._text

    def _style(self, style: str) -> str:
        return style if self.colour else ("bold" if "bold" in style else "")

    def text(self) -> Text:
        now = self.clock()
        s = self.status
        if s is None:
            return Text.assemble((" reading ", self._style("bold")), str(self.run_dir), "\n")
        state = str(s.get("state"))
        line = Text(no_wrap=True, overflow="ellipsis")
        label = state.upper()
        stopping = self.stopping()
        if stopping is not None:
            label += f" (stopping, {stopping[0]} {duration(now - stopping[1])} ago)"
        holding = len(s.get("anomalies") or [])
        style = "bold red" if holding else STATE_STYLES.get(state, "bold")  # never a green RUNNING over a NaN
        badge = self._style(style) + (" reverse" if self.colour else "")
        line.append(f" {label} ", style=badge)
        if holding:
            line.append(f" {holding} {'anomaly' if holding == 1 else 'anomalies'} ", style=badge)
        step, max_steps = s.get("step") or 0, s.get("max_steps")
        line.append(f" step {step:,}" + (f" / {max_steps:,}" if isinstance(max_steps, int) else ""))
        if s.get("progress") is not None:
            line.append(f" ({s['progress'] * 100:.1f}%)")
        if s.get("eta_seconds") is not None:
            line.append(f"  ETA {duration(s['eta_seconds'])}")
        if s.get("positions_per_second") is not None:
            line.append(f"  {number(s['positions_per_second'], ',.0f')} pos/s")
        if s.get("lr") is not None:
            line.append(f"  lr {number(s['lr'], '.2e')}")
        second = Text(no_wrap=True, overflow="ellipsis")
        terminal = s.get("terminal")
        if terminal and terminal.get("kind") == "run_failed":  # first, so a narrow terminal still shows why
            detail = " ".join(str(terminal.get("error") or "").split())
            second.append(f" run_failed at step {terminal.get('step')}" + (f": {detail}" if detail else ""),
                          style=self._style("bold red"))
        last_event = s.get("last_event_time")
        if isinstance(last_event, (int, float)):
            second.append(f"{'  ' if second else ' '}event {duration(now - last_event)} ago")
        else:
            second.append(f"{'  ' if second else ' '}no events yet")
        checkpoint = s.get("last_checkpoint")
        if checkpoint:
            checked = s.get("checked_at") or now
            age = checkpoint["age_seconds"] + (now - checked)
            second.append(f"  checkpoint step {checkpoint['step']:,} ({duration(age)} ago)")
        else:
            second.append("  no checkpoint")
        elo = elo_curve_text(s.get("elo_curve"), self.ascii, s.get("elo_rebaselines"))
        if elo:
            second.append(f"  {elo}")
        if terminal and terminal.get("kind") != "run_failed":
            detail = terminal.get("reason") or terminal.get("error") or ""
            second.append(f"  {terminal['kind']} at step {terminal.get('step')}" + (f": {detail}" if detail else ""),
                          style=self._style("bold"))
        elif not terminal and s.get("pid") is not None:
            second.append(f"  pid {s['pid']}")
        if s.get("watch_problem"):
            second.append(f"  polling every 2 s ({s['watch_problem']})", style=self._style("yellow"))
        if self.note:
            second.append(f"  {self.note}", style=self._style("italic"))
        # One line each, cut with an ellipsis: a wrapped first line would push the second out of the header.
        return Text("\n", no_wrap=True, overflow="ellipsis").join([line, second])


SPARK = "▁▂▃▄▅▆▇█"
ASCII_SPARK = "_.-~=+*#"
ELO_POINTS_SHOWN = 16


def elo_curve_text(curve: object, ascii_only: bool = False, rebaselines: object = None) -> str:
    """The newest `match` result and a sparkline of the Elo curve (runtime.match_every), or ""; with the
    latest re-baseline (`rebaselines`: status's `elo_rebaselines`), where the curve's origin moved."""
    if not isinstance(curve, list) or not curve or not all(isinstance(p, list) and len(p) >= 4 for p in curve):
        return ""

    def value(x: object) -> float | None:
        if isinstance(x, str) and x in ("inf", "-inf"):
            return float(x)
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    def shown(x: object) -> str:
        v = value(x)
        return "?" if v is None else f"{v + 0.0:+.0f}" if abs(v) != float("inf") else ("+inf" if v > 0 else "-inf")

    step, elo, low, high = curve[-1][:4]
    text = f"Elo {shown(elo)} [{shown(low)}, {shown(high)}] at step {step:,}" if isinstance(step, int) else ""
    finite = [v for p in curve[-ELO_POINTS_SHOWN:] if (v := value(p[1])) is not None and abs(v) != float("inf")]
    if len(finite) > 1:
        lo, hi = min(finite), max(finite)
        spread = (hi - lo) or 1.0
        ramp = ASCII_SPARK if ascii_only else SPARK
        text += " " + "".join(ramp[round((v - lo) / spread * (len(ramp) - 1))] for v in finite)
    if isinstance(rebaselines, list) and rebaselines and isinstance(rebaselines[-1], list) and rebaselines[-1]:
        moved = rebaselines[-1]
        text += f" (origin moved at step {moved[0]}: vs step {moved[2] if len(moved) > 2 else '?'})"
    return text

