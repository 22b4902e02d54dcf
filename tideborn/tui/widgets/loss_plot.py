"""The metrics view: a chart per metric group (losses, accuracy, learning rate, gradient norm,
throughput, data wait) of a `RunHistory`, each with its own y axis, drawn by `tideborn.tui.plotting`. Several in
a grid where the terminal has room for them, else one at a time (`g` cycles). Zoom and pan on the x axis
(keys and the mouse wheel), step or wall-time x, a cursor that reads each curve's value.

Redraws at once when a view setting changes; when data arrives, at most every two seconds or every twenty
times its own drawing time, whichever is longer (at most every four), and then only the charts whose
data changed, repainting only those whose lines came out different (following a fast trainer costs a few
percent of a core, not one).
"""

from __future__ import annotations

import time
import typing
from collections import Counter
from dataclasses import replace

import numpy as np
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.widget import Widget

from tideborn.tui.history import COLUMN_NAMES, ELO_SERIES, RunHistory
from tideborn.tui.plotting import (
    Y_LABEL_WIDTH,
    Chart,
    ChartCache,
    Curve,
    GridCell,
    Marker,
    PlotOptions,
    format_x,
    grid_cells,
    grid_shape,
    join_cells,
    shared_x_range,
    x_values,
)

CURVES = (  # series name, label, colour, ASCII glyph
    # Colours far apart in CIELAB within each chart (tests/unit/test_tui_elo_chart.py checks it): the
    # earlier palette had two blues and two pinks a few units apart in the same chart.
    ("loss", "loss", "#f0e442", "#"),
    ("policy_loss", "policy", "#56b4e9", "p"),
    ("value_loss", "value", "#ff5fd7", "v"),
    ("eval_policy_loss", "eval-pol", "#d55e00", "P"),
    ("eval_value_loss", "eval-val", "#5fffaf", "V"),
    ("eval_policy_accuracy", "acc-pol", "#d55e00", "a"),
    ("eval_value_accuracy", "acc-val", "#5fffaf", "A"),
    ("eval_policy_accuracy_legal", "acc-legal", "#3a7bff", "L"),
    ("lr", "lr", "#f0e442", "r"),
    ("grad_norm", "grad-norm", "#56b4e9", "g"),
    ("positions_per_second", "pos/s", "#5fffaf", "s"),
    ("data_wait_fraction", "wait-share", "#ff5fd7", "w"),
    (ELO_SERIES, "elo", "#e69f00", "E"),
)
SPARSE = frozenset(name for name, *_ in CURVES if name.startswith("eval_") or name == ELO_SERIES)
"""Curves of a point every so many steps (eval, match): each point drawn as a marker."""
GROUPS = (  # title, series
    ("losses", ("loss", "policy_loss", "value_loss", "eval_policy_loss", "eval_value_loss")),
    ("accuracy", ("eval_policy_accuracy", "eval_value_accuracy", "eval_policy_accuracy_legal")),
    ("learning rate", ("lr",)),
    ("grad norm", ("grad_norm",)),
    ("throughput", ("positions_per_second",)),
    ("data wait", ("data_wait_fraction",)),
)
ELO_GROUP = ("Elo vs reference", (ELO_SERIES,))
"""A chart of its own, after GROUPS, in runs that play matches (runtime.match_every): the line is the Elo, the
shaded band its 95% interval."""
VIEWS = {  # the `c` key: which curves the charts show
    "all": tuple(name for name, *_ in CURVES),
    "train": COLUMN_NAMES,
    "eval": tuple(name for name, *_ in CURVES if name.startswith("eval_") or name == ELO_SERIES),
}
MIN_CHART = (40, 9)
"""The smallest chart of a grid (cells); where six do not fit, one is shown at a time."""
ZOOM_FACTOR = 2.0
PAN_FRACTION = 0.25
REDRAW_FACTOR = 20
MIN_REDRAW_INTERVAL = 2.0
"""New data redraws the charts at most this often (a view key at once): redrawing the grid and Textual converting
it was most of what following a run cost (docs/benchmarks.md, issue 28); a trainer logs every few seconds."""
MAX_REDRAW_INTERVAL = 4.0


class LossPlot(Widget):
    """Charts over steps (or wall time), with checkpoint, resume and anomaly markers on the x axes."""

    KEYS: typing.ClassVar[list[Binding]] = [
        # The chart's keys, the same in every screen that shows a chart (`screen_bindings`).
        Binding("v", "cursor", "Cursor: values at a step", show=False),
        Binding("t", "wall_time", "x axis: step / wall time", show=False),
        Binding("plus", "zoom_in", "Zoom in (x axis)", show=False),
        Binding("minus", "zoom_out", "Zoom out", show=False),
        Binding("left_square_bracket", "pan(-1)", "Pan left (cursor left while it is on)", show=False),
        Binding("right_square_bracket", "pan(1)", "Pan right (cursor right while it is on)", show=False),
        Binding("0", "reset_zoom", "Zoom: all", show=False),
        Binding("m", "smooth", "Smooth", show=False),
        Binding("l", "log_scale", "Log", show=False),
    ]

    class ViewChanged(Message):
        """A chart key changed the view; `note` says how, for a screen that says it (the dashboard does, in a
        notification; the comparison's legend shows it instead)."""

        def __init__(self, note: str | None = None, seconds: float = 2.0) -> None:
            super().__init__()
            self.note = note
            self.seconds = seconds

    @classmethod
    def keys_with(cls, *worded: Binding) -> list[Binding]:
        """KEYS, some of them (matched by action) worded as another chart says them, in the same order."""
        by_action = {key.action: key for key in worded}
        return [by_action.get(key.action, key) for key in cls.KEYS]

    @classmethod
    def screen_bindings(cls) -> list[Binding]:
        """The chart's keys as a screen binds them, each running the chart's action (the screen's `chart` action
        hands it on with `run_action`). Bound on the screen, they reach the chart wherever the focus is: a widget's
        own bindings fire only while it or a child has focus, and the chart never has it (the dashboard's focus
        is in its log, and Tab moves between the anomalies and the log)."""
        return [replace(key, action=f"chart({key.action!r})") for key in cls.KEYS]

    def __init__(self, history: RunHistory, options: PlotOptions, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history = history
        self.options = options
        self.view = "all"
        self.chart: int | None = None
        """The one chart shown (an index into GROUPS), or None for the grid (where it fits)."""
        self.zoom: tuple[float, float] | None = None
        """The x range shown after zooming or panning; None: all (or the last N steps)."""
        self.cursor: float | None = None
        self.anomaly_markers: list[Marker] = []
        self.hidden: set[str] = set()
        """Curves hidden with `h` (series names)."""
        self.last_draw_seconds = 0.0
        self.draws = 0
        self.drawn_points = 0
        """Step points the last drawing had (the benchmark and tests wait on it)."""
        self.last_text = Text()
        self._last_draw_at = 0.0
        self._layout: tuple[tuple[int, int] | None, int, int] = (None, 0, 0)
        self.redraw_pending = False
        self._cache = ChartCache()
        self._shown: dict[str, GridCell] = {}
        """The charts as last drawn (on screen, or about to be), by title: what new data is compared with."""
        self.repaints: Counter[str] = Counter()
        """Charts (by title) repainted because their data changed: what tests count."""

    @property
    def chart_draws(self) -> Counter[str]:
        """How often each chart (by title) was drawn; one whose inputs did not change is not."""
        return self._cache.draws

    # -- what is drawn --------------------------------------------------------------------------------
    def groups(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The charts there are: GROUPS, and the Elo's once the run has played a match."""
        return GROUPS + ((ELO_GROUP,) if len(self.history.series[ELO_SERIES]) else ())

    def curve(self, name: str) -> Curve:
        _name, label, colour, glyph = next(entry for entry in CURVES if entry[0] == name)
        band = self.history.elo_interval.band() if name == ELO_SERIES else None
        return Curve(self.history.series[name], label, colour, glyph, points=name in SPARSE, band=band)

    def curve_names(self) -> list[tuple[str, str]]:
        """(series name, label) of every curve with points, for the `h` list."""
        labels = {name: label for name, label, *_ in CURVES}
        return [(name, labels[name]) for _title, names in self.groups() for name in names
                if len(self.history.series[name])]

    def charts(self) -> list[Chart]:
        """Every group's chart, with the curves the view (`c`) shows that have points and are not hidden (`h`)."""
        shown = VIEWS[self.view]
        charts = []
        for title, names in self.groups():
            curves = [self.curve(name) for name in names
                      if name in shown and name not in self.hidden and len(self.history.series[name])]
            charts.append(Chart(title, curves))
        return charts

    def shape(self, width: int | None = None, height: int | None = None) -> tuple[int, int] | None:
        """The grid's (columns, rows) at this size, or None where the charts do not fit together."""
        size = self.content_size
        return grid_shape(len(self.groups()), size.width if width is None else width,
                          size.height if height is None else height, *MIN_CHART)

    def showing_grid(self) -> bool:
        return self.chart is None and self.shape() is not None

    def shown_charts(self) -> list[Chart]:
        charts = self.charts()
        return charts if self.showing_grid() else [charts[min(self.chart or 0, len(charts) - 1)]]

    def curves(self) -> list[Curve]:
        """The curves on screen, in every chart shown."""
        return [curve for chart in self.shown_charts() for curve in chart.curves]

    def chart_name(self) -> str:
        """"grid", or the chart shown alone with its place: "2/6 accuracy"."""
        if self.showing_grid():
            return "grid"
        groups = self.groups()
        number = min(self.chart or 0, len(groups) - 1)
        return f"{number + 1}/{len(groups)} {groups[number][0]}"

    def full_range(self) -> tuple[float, float] | None:
        """The x range of all the data, every chart (zoom and pan stay inside it)."""
        return shared_x_range(self.charts(), replace(self.options, window=None, x_range=None))

    def span(self) -> tuple[float, float] | None:
        """The x range on screen."""
        return self.zoom or shared_x_range(self.charts(), replace(self.options, x_range=None))

    def draw_options(self) -> PlotOptions:
        span = self.span()
        label = None
        if self.zoom is not None:
            wall = self.options.wall_time
            width = self.zoom[1] - self.zoom[0]
            label = f"zoom {format_x(self.zoom[0], width, wall)}-{format_x(self.zoom[1], width, wall)}"
        return replace(self.options, x_range=span, cursor=self.cursor, view_label=label)

    def render(self) -> Text:
        self.draws += 1
        return self._drawing()[0]

    def _drawing(self) -> tuple[Text, list[GridCell]]:
        """The whole drawing and each chart's place in it; charts unchanged since the last drawing come from
        the cache, so this is cheap when little changed."""
        started, drawn_before = time.perf_counter(), self._cache.draws.total()
        size = self.content_size
        markers = self.history.markers + self.anomaly_markers
        options = self.draw_options()
        shape = self.shape()
        if self.chart is None and shape is not None:
            cells = grid_cells(self.charts(), markers, options, size.width, size.height, shape, self._cache)
            columns = shape[0]
            text = join_cells(cells, columns * ((size.width - (columns - 1)) // columns + 1) - 1)
            self._layout = (shape, size.width, size.height)
        else:
            charts = self.charts()
            number = min(self.chart or 0, len(charts) - 1)
            chart = charts[number]
            title = f"{number + 1}/{len(charts)} {chart.title}"
            lines = self._cache.lines(chart, markers, options, size.width, size.height, title, {})
            cells = [GridCell(chart, 0, 0, size.width, size.height, lines)]
            text = Text("\n").join(lines)
            self._layout = (None, size.width, size.height)
        self.last_text = text
        if self._cache.draws.total() != drawn_before:  # what paces the redraws: a drawing, not a cache hit
            self.last_draw_seconds = time.perf_counter() - started
        self._last_draw_at = time.monotonic()
        self.drawn_points = self.history.points()
        self._shown = {cell.chart.title: cell for cell in cells}
        return text, cells

    def data_changed(self) -> None:
        """New points: redraw soon (at once if the last drawing was cheap, or showed no points yet)."""
        if self.redraw_pending:
            return
        wait = min(max(self.last_draw_seconds * REDRAW_FACTOR, MIN_REDRAW_INTERVAL), MAX_REDRAW_INTERVAL)
        delay = self._last_draw_at + wait - time.monotonic()
        if delay <= 0 or self.drawn_points == 0:  # the first points are drawn at once: the first screen
            self._repaint_changed()
            return
        self.redraw_pending = True
        self.set_timer(delay, self._redraw_now)

    def _redraw_now(self) -> None:
        self.redraw_pending = False
        self._repaint_changed()

    def _repaint_changed(self) -> None:
        """Repaint only the charts whose lines changed. New points change the data of some charts (and often
        the x range of all); a chart whose lines come out as they were is left alone, so Textual neither
        converts nor sends it again (a chart costs as much there as here)."""
        before, layout = self._shown, self._layout
        self._drawing()
        if layout != self._layout or set(before) != set(self._shown):
            self.refresh()
            return
        changed = [cell for title, cell in self._shown.items() if cell.lines != before[title].lines]
        for cell in changed:
            self.repaints[cell.chart.title] += 1
        if changed:
            self.refresh(*(Region(cell.x, cell.y, cell.width, cell.height) for cell in changed))

    def set_history(self, history: RunHistory) -> None:
        self.history = history
        self.zoom = self.cursor = None
        self.refresh()

    # -- view settings (the keys') ---------------------------------------------------------------------
    def toggle_smoothing(self) -> bool:
        self.options = replace(self.options, smooth=not self.options.smooth)
        self.refresh()
        return self.options.smooth

    def set_smoothing(self, on: bool) -> None:
        self.options = replace(self.options, smooth=on)
        self.refresh()

    def toggle_log(self) -> bool:
        self.options = replace(self.options, log=not self.options.log)
        self.refresh()
        return self.options.log

    def show_window(self, window: int | None) -> None:
        self.options = replace(self.options, window=window)
        self.zoom = None
        self.refresh()

    def next_view(self) -> str:
        names = list(VIEWS)
        self.view = names[(names.index(self.view) + 1) % len(names)]
        self.refresh()
        return self.view

    def next_chart(self) -> str:
        """The grid, then each chart alone, then the grid again (where it fits; else chart after chart)."""
        if self.chart is None:
            self.chart = 1 if self.shape() is None else 0
        elif self.chart + 1 < len(self.groups()):
            self.chart += 1
        else:
            self.chart = None if self.shape() is not None else 0
        self.refresh()
        return self.chart_name()

    def toggle_wall_time(self) -> bool:
        self.options = replace(self.options, wall_time=not self.options.wall_time)
        self.zoom = self.cursor = None  # both are in the other axis's units
        self.refresh()
        return self.options.wall_time

    def zoom_by(self, factor: float, centre: float | None = None) -> tuple[float, float] | None:
        """Zoom the x axis by `factor` (> 1 in, < 1 out) about `centre` (default: the cursor, else the
        middle), inside the data's range; all of it again once zoomed out that far."""
        span, full = self.span(), self.full_range()
        if span is None or full is None:
            return None
        lo, hi = span
        if centre is None:
            centre = self.cursor if self.cursor is not None and lo <= self.cursor <= hi else (lo + hi) / 2
        width = max((hi - lo) / factor, 2.0)
        if width >= (full[1] - full[0]) * (1 - 1e-9):
            self.zoom = None
        else:
            share = (centre - lo) / (hi - lo) if hi > lo else 0.5
            self.zoom = self._clamped(centre - width * share, width, full)
        self.refresh()
        return self.zoom

    def pan(self, direction: int) -> tuple[float, float] | None:
        """Move the x range a quarter of its width left (-1) or right (+1), inside the data's range."""
        span, full = self.span(), self.full_range()
        if span is None or full is None:
            return None
        width = span[1] - span[0]
        if width >= (full[1] - full[0]) * (1 - 1e-9):
            return self.zoom
        self.zoom = self._clamped(span[0] + direction * width * PAN_FRACTION, width, full)
        self.refresh()
        return self.zoom

    @staticmethod
    def _clamped(lo: float, width: float, full: tuple[float, float]) -> tuple[float, float]:
        lo = min(max(lo, full[0]), full[1] - width)
        return lo, lo + width

    def set_hidden(self, hidden: set[str]) -> None:
        """Hide these curves (`h`); the others show again."""
        self.hidden = set(hidden)
        self.refresh()

    def reset_zoom(self) -> None:
        self.zoom = None
        self.refresh()

    def toggle_cursor(self) -> float | None:
        """The cursor on, at the logged step nearest the middle of the view; or off."""
        span = self.span()
        self.cursor = None if self.cursor is not None or span is None else self._snap((span[0] + span[1]) / 2)
        self.refresh()
        return self.cursor

    def pan_or_move_cursor(self, direction: int) -> None:
        """`[` and `]`: move the cursor while it is on, else pan the view (both screens' keys)."""
        if self.cursor is not None:
            self.move_cursor(direction)
        else:
            self.pan(direction)

    def move_cursor(self, direction: int) -> float | None:
        """To the logged step nearest one cell left or right (at least the next one); past the edge of a
        zoomed view the view pans with it."""
        span = self.span()
        if self.cursor is None or span is None:
            return None
        cells = max(self._chart_width() - Y_LABEL_WIDTH, 1)
        moved = self._snap(self.cursor + direction * (span[1] - span[0]) / cells)
        if (moved - self.cursor) * direction <= 0:
            moved = self._snap(self.cursor, direction)
        self.cursor = moved
        if not span[0] <= self.cursor <= span[1]:
            self.pan(direction)
        self.refresh()
        return self.cursor

    def _snap(self, at: float, beyond: int = 0) -> float:
        """The x of the logged point nearest `at` (beyond: the first strictly right (+1) or left (-1) of
        it), so the readout is of a real point; `at` itself where there is none. The points are those of the
        curves shown (the step columns share one array, read once)."""
        found: list[float] = []
        arrays: dict[int, tuple[np.ndarray, list[tuple[int, int]]]] = {}
        for curve in self.curves() or [Curve(self.history.steps.columns["loss"], "", "", "")]:
            xs = x_values(curve.series, self.options.wall_time)
            if xs is not None:
                arrays.setdefault(id(xs.base if xs.base is not None else xs), (xs, curve.series.segment_bounds()))
        for xs, bounds in arrays.values():
            for begin, end in bounds:
                part = xs[begin:end]
                if part.size == 0:
                    continue
                if beyond > 0:
                    i = int(np.searchsorted(part, at, "right"))
                    found += [float(part[i])] if i < part.size else []
                elif beyond < 0:
                    i = int(np.searchsorted(part, at, "left")) - 1
                    found += [float(part[i])] if i >= 0 else []
                else:
                    i = int(np.searchsorted(part, at))
                    found += [float(part[j]) for j in (i - 1, i) if 0 <= j < part.size]
        found = [x for x in found if np.isfinite(x)]
        if not found:
            return at
        return min(found, key=lambda x: abs(x - at))

    def _chart_width(self) -> int:
        shape, width, _height = self._layout
        if shape is None:
            return width or self.content_size.width
        return (width - (shape[0] - 1)) // shape[0]

    def x_at(self, column: int) -> float | None:
        """The x under a column of this widget (in whichever chart of the grid it falls)."""
        span = self.span()
        if span is None:
            return None
        cell_w = self._chart_width()
        inside = column % (cell_w + 1) if self._layout[0] is not None else column
        plot_w = max(cell_w - Y_LABEL_WIDTH, 1)
        fraction = min(max((inside - Y_LABEL_WIDTH + 0.5) / plot_w, 0.0), 1.0)
        return span[0] + fraction * (span[1] - span[0])

    # -- the keys (KEYS): each changes the view and says so --------------------------------------------
    def action_zoom_in(self) -> None:
        self.zoom_by(ZOOM_FACTOR)
        self.post_message(self.ViewChanged())

    def action_zoom_out(self) -> None:
        self.zoom_by(1 / ZOOM_FACTOR)
        self.post_message(self.ViewChanged())

    def action_pan(self, direction: int) -> None:
        self.pan_or_move_cursor(direction)
        self.post_message(self.ViewChanged())

    def action_reset_zoom(self) -> None:
        self.reset_zoom()
        self.post_message(self.ViewChanged())

    def action_cursor(self) -> None:
        on = self.toggle_cursor() is not None
        self.post_message(self.ViewChanged("cursor on: [ and ] move it, the legends read the values there" if on
                                           else "cursor off", seconds=3))

    def action_wall_time(self) -> None:
        wall = self.toggle_wall_time()
        self.post_message(self.ViewChanged(f"x axis: {'wall time' if wall else 'step'}"))

    def action_smooth(self) -> None:
        on = self.toggle_smoothing()
        self.post_message(self.ViewChanged(f"smoothing {'on' if on else 'off'}"))

    def action_log_scale(self) -> None:
        on = self.toggle_log()
        self.post_message(self.ViewChanged(f"{'log' if on else 'linear'} scale"))

    # -- the mouse: the wheel zooms about the pointer, sideways scrolling pans ---------------------------
    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.zoom_by(ZOOM_FACTOR, self.x_at(event.x))

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.zoom_by(1 / ZOOM_FACTOR, self.x_at(event.x))

    def on_mouse_scroll_left(self, event: events.MouseScrollLeft) -> None:
        event.stop()
        self.pan(-1)

    def on_mouse_scroll_right(self, event: events.MouseScrollRight) -> None:
        event.stop()
        self.pan(1)
