"""The run header: state, anomalies and restarts (an elastic job's), step / max_steps with ETA, positions/s, lr,
time since the last event, and the last checkpoint with its age. Ages come from the app's clock (tests fix it)."""

from __future__ import annotations

import math
import typing
from pathlib import Path

from rich.text import Text
from textual.widget import Widget

from tideborn.humanize import duration, number
from tideborn.rundir.report import data_window_text, elo_number
from tideborn.rundir.status import EloPoint, Rebaseline, RunStatus

STATE_STYLES = {
    "running": "bold green", "stalled": "bold yellow", "finished": "bold blue", "stopped": "bold cyan",
    "failed": "bold red", "vanished": "bold red", "unknown": "bold", "not started": "dim", "gone": "bold red",
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
        self.status: RunStatus | None = None
        self.checked_at: float | None = None
        """When the status was taken: the checkpoint's age goes on from there with the clock."""
        self.watch_problem = ""
        """Why the run directory is polled instead of watched, if it is."""
        self.stopping_since: float | None = None
        self.gone = False
        """The run directory was there and is no longer: the status read before is shown as what it was."""
        self.note = ""
        self.shown_text = ""
        self._text = Text()

    def on_mount(self) -> None:
        self.show()
        self.set_interval(1.0, self.show)

    def show_status(self, status: RunStatus, checked_at: float | None = None, watch_problem: str = "",
                    gone: bool = False) -> None:
        self.status, self.checked_at, self.watch_problem, self.gone = status, checked_at, watch_problem, gone
        if status.terminal is not None or status.state not in ("running", "stalled"):
            self.stopping_since = None
        self.show()

    def stopping(self) -> tuple[str, float] | None:
        """(signal, since when) while a stop is in progress: sent from here, or seen in the run's events
        (`stop_requested`: a stop sent from anywhere else)."""
        s = self.status
        if s is None or s.state not in ("running", "stalled") or self.gone:
            return None
        requested = s.stop_requested
        signal = requested.signal if requested is not None else None
        if self.stopping_since is not None:
            return signal or "SIGTERM", self.stopping_since
        when = requested.since() if requested is not None else None
        if when is not None:
            return signal or "a stop signal", when
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
        # One line each, cut with an ellipsis: a wrapped first line would push the second out of the header.
        return Text("\n", no_wrap=True, overflow="ellipsis").join([self._state_line(s, now), self._events_line(s, now)])

    def _state_line(self, s: RunStatus, now: float) -> Text:
        """The state (with the anomalies and restarts as badges beside it) and how far the run is."""
        line = Text(no_wrap=True, overflow="ellipsis")
        state = "gone" if self.gone else s.state
        holding = len(s.anomalies)
        style = "bold red" if holding else STATE_STYLES.get(state, "bold")  # never a green RUNNING over a NaN
        badge = self._style(style) + (" reverse" if self.colour else "")
        line.append(f" {self._state_label(state, s, now)} ", style=badge)
        if holding:
            line.append(f" {holding} {'anomaly' if holding == 1 else 'anomalies'} ", style=badge)
        if s.restarts:  # an elastic job that torchrun's agent restarted is one run that goes on, not a new one
            restarts = f" {s.restarts} {'restart' if s.restarts == 1 else 'restarts'}"
            line.append(restarts + (f", world size {s.world_size} " if s.world_size is not None else " "),
                        style=self._style("bold yellow") + (" reverse" if self.colour else ""))
        _append_progress(line, s)
        return line

    def _state_label(self, state: str, s: RunStatus, now: float) -> str:
        label = state.upper()
        stopping = self.stopping()
        if stopping is not None:
            return label + f" (stopping, {stopping[0]} {duration(now - stopping[1])} ago)"
        if s.waiting_for_data and not self.gone:
            return label + " (waiting for data)"
        return label

    def _events_line(self, s: RunStatus, now: float) -> Text:
        """Why the run failed (first, so a narrow terminal still shows it), how long ago it wrote, its checkpoint,
        data window and Elo, how it ended (or its pid), and how the monitor follows it."""
        second = Text(no_wrap=True, overflow="ellipsis")
        terminal = s.terminal
        if self.gone:  # first: what follows is what was read before it went
            second.append(f" {self.run_dir} is gone (removed or renamed); shown as last read:",
                          style=self._style("bold red"))
        if terminal is not None and terminal.kind == "run_failed":
            detail = " ".join(str(terminal.error or "").split())
            second.append(f" run_failed at step {terminal.step}" + (f": {detail}" if detail else ""),
                          style=self._style("bold red"))
        since = f"event {duration(now - s.last_event_time)} ago" if s.last_event_time is not None else "no events yet"
        second.append(f"{'  ' if second else ' '}{since}")
        self._append_figures(second, s, now)
        self._append_ending(second, s)
        if self.watch_problem:
            second.append(f"  polling every 2 s ({self.watch_problem})", style=self._style("yellow"))
        if self.note:
            second.append(f"  {self.note}", style=self._style("italic"))
        return second

    def _append_ending(self, second: Text, s: RunStatus) -> None:
        """How the run ended (a failure is said first on the line), or while it has not, its pid."""
        terminal = s.terminal
        if terminal is not None and terminal.kind != "run_failed":
            detail = terminal.reason or terminal.error or ""
            second.append(f"  {terminal.kind} at step {terminal.step}" + (f": {detail}" if detail else ""),
                          style=self._style("bold"))
        elif terminal is None and s.pid is not None:
            second.append(f"  pid {s.pid}")

    def _append_figures(self, second: Text, s: RunStatus, now: float) -> None:
        """The checkpoint (its age going on with the clock since the status was taken), the data window, the Elo."""
        checkpoint = s.last_checkpoint
        if checkpoint is not None:
            age = checkpoint.age_seconds + (now - (self.checked_at or now))
            second.append(f"  checkpoint step {checkpoint.step:,} ({duration(age)} ago)")
        else:
            second.append("  no checkpoint")
        if s.data_window is not None:
            second.append("  " + data_window_text(s.data_window, False))
        elo = elo_curve_text(s.elo_curve, self.ascii, s.elo_rebaselines)
        if elo:
            second.append(f"  {elo}")


def _append_progress(line: Text, s: RunStatus) -> None:
    """Step / max_steps, the share done, the ETA, positions/s and lr: those the status has."""
    line.append(f" step {s.step:,}" + (f" / {s.max_steps:,}" if s.max_steps is not None else ""))
    if s.progress is not None:
        line.append(f" ({s.progress * 100:.1f}%)")
    if s.eta_seconds is not None:
        line.append(f"  ETA {duration(s.eta_seconds)}")
    if s.positions_per_second is not None:
        line.append(f"  {number(s.positions_per_second, ',.0f')} pos/s")
    if s.lr is not None:
        line.append(f"  lr {number(s.lr, '.2e')}")


SPARK = "▁▂▃▄▅▆▇█"
ASCII_SPARK = "_.-~=+*#"
ELO_POINTS_SHOWN = 16


def elo_curve_text(curve: typing.Sequence[EloPoint], ascii_only: bool = False,
                   rebaselines: typing.Sequence[Rebaseline] = ()) -> str:
    """The newest `match` result and a sparkline of the Elo curve (runtime.match_every), or ""; with the
    latest re-baseline (`rebaselines`: status's `elo_rebaselines`), where the curve's origin moved."""
    if not curve:
        return ""
    last = curve[-1]
    text = f"Elo {elo_number(last.elo)} [{elo_number(last.elo_low)}, {elo_number(last.elo_high)}] at step {last.step:,}"
    finite = [p.elo for p in curve[-ELO_POINTS_SHOWN:] if p.elo is not None and math.isfinite(p.elo)]
    if len(finite) > 1:
        lo, hi = min(finite), max(finite)
        spread = (hi - lo) or 1.0
        ramp = ASCII_SPARK if ascii_only else SPARK
        text += " " + "".join(ramp[round((v - lo) / spread * (len(ramp) - 1))] for v in finite)
    if rebaselines:
        text += f" (origin moved at step {rebaselines[-1].step}: vs step {rebaselines[-1].reference_step})"
    return text
