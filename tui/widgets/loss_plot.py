"""The loss plot: step and eval curves of a `RunHistory`, drawn by `tui.plotting`.

Redraws at once when a view setting changes; when data arrives, at most once a second or every twenty
times its own drawing time, whichever is longer (following a fast trainer costs a few percent of a
core, not one).
"""

from __future__ import annotations

import time
from dataclasses import replace

from rich.text import Text
from textual.widget import Widget

from tui.history import RunHistory
from tui.plotting import Curve, Marker, PlotOptions, render_plot

CURVES = (  # series name, label, colour, ASCII glyph
    ("loss", "loss", "#e5c07b", "#"),
    ("policy_loss", "policy", "#61afef", "p"),
    ("value_loss", "value", "#c678dd", "v"),
    ("eval_policy_loss", "eval-pol", "#56b6c2", "P"),
    ("eval_value_loss", "eval-val", "#98c379", "V"),
    ("eval_policy_accuracy", "acc-pol", "#d19a66", "a"),
    ("eval_value_accuracy", "acc-val", "#e06c9f", "A"),
)
VIEWS = {
    "all": tuple(name for name, *_ in CURVES),
    "losses": ("loss", "policy_loss", "value_loss", "eval_policy_loss", "eval_value_loss"),
    "eval": ("eval_policy_loss", "eval_value_loss", "eval_policy_accuracy", "eval_value_accuracy"),
}
REDRAW_FACTOR = 20
MIN_REDRAW_INTERVAL = 1.0
MAX_REDRAW_INTERVAL = 2.0


class LossPlot(Widget):
    """Curves over steps, with checkpoint, resume and anomaly markers on the x axis."""

    def __init__(self, history: RunHistory, options: PlotOptions, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history = history
        self.options = options
        self.view = "all"
        self.anomaly_markers: list[Marker] = []
        self.last_draw_seconds = 0.0
        self.draws = 0
        self.drawn_points = 0
        """Step points the last drawing had (the benchmark and tests wait on it)."""
        self._last_draw_at = 0.0
        self.redraw_pending = False

    def curves(self) -> list[Curve]:
        shown = VIEWS[self.view]
        return [Curve(self.history.series[name], label, colour, glyph) for name, label, colour, glyph in CURVES
                if name in shown and len(self.history.series[name])]

    def render(self) -> Text:
        started = time.perf_counter()
        size = self.content_size
        markers = self.history.markers + self.anomaly_markers
        text = render_plot(self.curves(), markers, self.options, size.width, size.height,
                           title="" if self.view == "all" else self.view)
        self.last_draw_seconds = time.perf_counter() - started
        self._last_draw_at = time.monotonic()
        self.draws += 1
        self.drawn_points = self.history.points()
        return text

    def data_changed(self) -> None:
        """New points: redraw soon (at once if the last drawing was cheap)."""
        if self.redraw_pending:
            return
        wait = min(max(self.last_draw_seconds * REDRAW_FACTOR, MIN_REDRAW_INTERVAL), MAX_REDRAW_INTERVAL)
        delay = self._last_draw_at + wait - time.monotonic()
        if delay <= 0:
            self.refresh()
            return
        self.redraw_pending = True
        self.set_timer(delay, self._redraw_now)

    def _redraw_now(self) -> None:
        self.redraw_pending = False
        self.refresh()

    def set_history(self, history: RunHistory) -> None:
        self.history = history
        self.refresh()

    # -- view settings (the dashboard's keys) ---------------------------------------------------------
    def toggle_smoothing(self) -> bool:
        self.options = replace(self.options, smooth=not self.options.smooth)
        self.refresh()
        return self.options.smooth

    def toggle_log(self) -> bool:
        self.options = replace(self.options, log=not self.options.log)
        self.refresh()
        return self.options.log

    def show_window(self, window: int | None) -> None:
        self.options = replace(self.options, window=window)
        self.refresh()

    def next_view(self) -> str:
        names = list(VIEWS)
        self.view = names[(names.index(self.view) + 1) % len(names)]
        self.refresh()
        return self.view
