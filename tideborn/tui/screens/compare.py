"""Runs side by side: each metric of several runs overlaid (a chart a metric, one at a time or all in a
grid), each run its own colour (and, in ASCII mode, its own glyph), with a legend naming the runs. Opened
from the run picker with the selected runs; each run's events.jsonl is folded by
`tideborn.tui.history.load_history` in a worker, then followed from where that read ended, so live runs
grow on screen. The chart is the dashboard's (`LossPlot`): the same zoom, pan, cursor and wall-time keys."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from tideborn.humanize import compact
from tideborn.rundir.events import EventReader
from tideborn.rundir.files import file_size
from tideborn.rundir.layout import EVENTS_FILE
from tideborn.tui.framing import cut_label, framed_range
from tideborn.tui.history import ELO_SERIES, RunHistory, load_history
from tideborn.tui.options import TuiOptions
from tideborn.tui.plotting import (
    Chart,
    Curve,
    PlotOptions,
    format_x,
    render_grid,
    render_plot,
    shared_x_range,
    value_at,
    x_range,
)
from tideborn.tui.screens.curves import CurvePickerScreen
from tideborn.tui.toasts import keep_off
from tideborn.tui.widgets.loss_plot import SPARSE, LossPlot

METRICS = (  # series name (tideborn.tui.history), what people call it
    ("loss", "loss"),
    ("policy_loss", "policy loss"),
    ("value_loss", "value loss"),
    ("eval_policy_loss", "eval policy loss"),
    ("eval_value_loss", "eval value loss"),
    ("eval_policy_accuracy", "eval policy accuracy"),
    ("eval_value_accuracy", "eval value accuracy"),
    ("eval_policy_accuracy_legal", "eval policy accuracy (legal moves)"),
    ("lr", "learning rate"),
    ("grad_norm", "gradient norm"),
    ("positions_per_second", "positions/s"),
    ("data_wait_fraction", "data wait"),
    (ELO_SERIES, "Elo vs reference"),
)
RUN_STYLES = ("#e69f00", "#00d7ff", "#ff5f5f", "#87d700", "#cc79a7", "#3a7bff", "#ffffff", "#009e73")
"""One per run, in order, far apart in CIELAB (tests/unit/test_tui_elo_chart.py): the earlier palette had a
blue and a cyan a few units apart. Past eight runs they repeat: the legend still names each run."""
RUN_GLYPHS = ("#", "o", "*", "@", "%", "&", "=", "$")
"""One per run, in order; none of them is a glyph the plot uses for something else (`.` raw values, `x`
NaN, `^`/`v` infinities). Past eight runs they repeat: the legend still names each run."""
FOLLOW_SECONDS = 2.0
"""How often the runs' events files are read for new events (what the picker's refresh takes too)."""
STATES_BY_END = {"run_finished": "finished", "run_stopped": "stopped", "run_failed": "failed"}


@dataclass(frozen=True)
class ComparedRun:
    name: str
    run_dir: Path
    state: str = "?"


@dataclass
class LoadedRun:
    run: ComparedRun
    history: RunHistory
    style: str
    glyph: str


class HistoriesLoaded(Message):
    def __init__(self, loaded: list[LoadedRun], readers: list[EventReader]) -> None:
        super().__init__()
        self.loaded = loaded
        self.readers = readers


class RunsGrew(Message):
    """New events of the compared runs, by run (the follower's read since the last)."""

    def __init__(self, readers: list[EventReader], events: list[list[dict]], restarted: bool) -> None:
        super().__init__()
        self.readers = readers
        """Whose reads these are: the runs read again since (r, a replaced file) drop them."""
        self.events = events
        self.restarted = restarted


def metrics_present(loaded: list[LoadedRun]) -> list[tuple[str, str]]:
    """The metrics at least one of the runs has points for, in METRICS order."""
    return [(name, label) for name, label in METRICS if any(len(r.history.series[name]) for r in loaded)]


class CompareChart(LossPlot):
    """A chart a metric, every run's curve in it: one metric at a time (`chart` its index), or all in a grid
    (`chart` None) where they fit. Without a zoom, each chart's x range is its own data's (runs and metrics
    of different lengths are not squashed into the longest's range), cut where runs are far longer than
    the shortest (`tideborn.tui.framing`) until `0` shows all."""

    KEYS = LossPlot.keys_with(
        Binding("v", "cursor", "Cursor", tooltip="Cursor: every run's value at a step"),  # the footer has room for it
        Binding("t", "wall_time", "x: step / wall time", show=False),
        Binding("0", "reset_zoom", "Zoom: all (again: cut)", show=False),
    )

    def __init__(self, options: PlotOptions, *, id: str | None = None) -> None:
        super().__init__(RunHistory(), options, id=id)
        self.loaded: list[LoadedRun] = []
        self.chart = 0
        self._metric_before_grid = 0
        self.show_all = False
        """`0` (or zooming out to everything): every run whole, never cut; `0` again: the default view."""
        self._extents: tuple[tuple, dict[str, tuple[float, float]]] = ((), {})

    def groups(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return tuple((label, (name,)) for name, label in metrics_present(self.loaded))

    def run_curve(self, run: LoadedRun, name: str) -> Curve:
        band = run.history.elo_interval.band() if name == ELO_SERIES else None
        return Curve(run.history.series[name], run.run.name, run.style, run.glyph, points=name in SPARSE, band=band)

    def charts(self) -> list[Chart]:
        return [Chart(label, [self.run_curve(r, names[0]) for r in self.loaded
                              if r.run.name not in self.hidden and len(r.history.series[names[0]])])
                for label, names in self.groups()]

    def curve_names(self) -> list[tuple[str, str]]:
        return [(r.run.name, r.run.name) for r in self.loaded]

    def full_range(self) -> tuple[float, float] | None:
        return shared_x_range(self.shown_charts(), replace(self.options, window=None, x_range=None))

    def own_range(self, chart: Chart) -> tuple[float, float] | None:
        """The chart's x range without a zoom: its curves' own, or cut (`cut_range`)."""
        return self.cut_range(chart) or shared_x_range([chart], replace(self.options, x_range=None))

    def span(self) -> tuple[float, float] | None:
        if self.zoom is not None:
            return self.zoom
        ranges = [r for r in (self.own_range(chart) for chart in self.shown_charts()) if r is not None]
        return (min(lo for lo, _hi in ranges), max(hi for _lo, hi in ranges)) if ranges else None

    def run_extents(self) -> dict[str, tuple[float, float]]:
        """Each run's x range, every metric of it together (a run's length is its steps', not one metric's:
        a short run's single eval point must not make the view a point wide)."""
        wall = self.options.wall_time
        # asked for by every chart at every drawing and by the keys: found again only when a run grew
        key = (wall, tuple((id(run.history), run.run.name, *map(len, run.history.series.values()))
                           for run in self.loaded))
        if self._extents[0] == key:
            return self._extents[1]
        extents = {}
        for run in self.loaded:
            curves = [Curve(series, "", "", "") for series in run.history.series.values() if len(series)]
            extent = x_range(curves, None, wall)
            if extent is not None:
                extents[run.run.name] = extent
        self._extents = (key, extents)
        return extents

    def cut_range(self, chart: Chart) -> tuple[float, float] | None:
        """The default view's x range of a chart whose runs include one far longer than the others (None:
        not cut): only without a zoom and until `0` shows all."""
        if self.zoom is not None or self.show_all:
            return None
        extents = self.run_extents()
        return framed_range([extents[curve.label] for curve in chart.curves if curve.label in extents])

    def chart_options(self, chart: Chart, options: PlotOptions) -> PlotOptions:
        """A chart's own options: its cut x range, and the legend saying so, where the default view cuts it."""
        cut = self.cut_range(chart)
        full = shared_x_range([chart], replace(self.options, x_range=None))
        if cut is None or full is None:
            return options
        return replace(options, x_range=cut, view_label=cut_label(cut, full[1], self.options.wall_time))

    def zoom_by(self, factor: float, centre: float | None = None) -> tuple[float, float] | None:
        zoomed = super().zoom_by(factor, centre)
        if self.zoom is None:  # zoomed out to everything: all of it, not back to the cut view
            self.show_all = True
        return zoomed

    def reset_zoom(self) -> None:
        """All, whole (from a zoom or from the default view); from all, the default view again."""
        self.show_all = self.zoom is not None or not self.show_all
        super().reset_zoom()

    def _repaint_changed(self) -> None:
        # The overlay draws through `render` alone (no per-chart cache of the dashboard's): new points repaint it
        # whole, at the pace `data_changed` keeps.
        self.refresh()

    def render(self) -> Text:
        started = time.perf_counter()
        size = self.content_size
        if not self.groups():
            return Text("reading the runs..." if not self.loaded else "no step, eval or match events in these runs")
        options = self.draw_options()
        shape = self.shape()
        if self.showing_grid() and shape is not None:
            if self.zoom is None:
                options = replace(options, x_range=None)
            self._layout = (shape, size.width, size.height)
            text = render_grid(self.charts(), [], options, size.width, size.height, shape, own_ranges=True,
                               chart_options=self.chart_options)
        else:
            charts = self.charts()
            chart = charts[min(self.chart or 0, len(charts) - 1)]
            self._layout = (None, size.width, size.height)
            options = self.chart_options(chart, options)
            text = render_plot(chart.curves, [], options, size.width, size.height, title=chart.title)
        self.last_text = text
        self.last_draw_seconds = time.perf_counter() - started
        self._last_draw_at = time.monotonic()
        self.draws += 1
        self.drawn_points = sum(len(r.history.series["loss"]) for r in self.loaded)
        return text

    @property
    def metric_index(self) -> int:
        """The metric shown alone, or the one `n` and `p` go on from while the grid is shown."""
        return self.chart if self.chart is not None else self._metric_before_grid

    def step_metric(self, delta: int) -> str:
        """The next (+1) or previous (-1) metric, shown alone."""
        count = len(self.groups())
        if count:
            self.chart = (self.metric_index + delta) % count
        self.refresh()
        return self.chart_name()

    def toggle_grid(self) -> bool:
        """All the metrics in a grid (where they fit), or one at a time again. True: the grid is shown."""
        if self.chart is None:
            self.chart = self._metric_before_grid
        elif self.shape() is not None:
            self._metric_before_grid, self.chart = self.chart, None
        self.refresh()
        return self.showing_grid()


class CompareScreen(Screen):
    HELP = ("Each metric of the selected runs, overlaid: each run its own colour (in --ascii its own glyph), "
            "named in the legend below the plot with its state and the metric's latest value (with the cursor "
            "on: its value at the cursor). The runs are followed: live ones grow as they train. n and p step "
            "through the metrics the runs have; g shows all of them in a grid (where they fit: about 160x40 and "
            "up), each over its own data's steps. Where a run is more than four times as long as the shortest, "
            "a chart ends where the shorter runs end (its legend says \"cut ... of ...\"), so short runs are "
            "readable. + and - zoom the x axis, [ and ] pan (the cursor, when on), 0 shows every run whole (again: "
            "the cut view), "
            "v puts a cursor on a logged point, t switches x between the step and the wall "
            "time (runs that ran at the same time line up). Eval and match points are marked with a dot; the "
            "Elo chart shades the 95% interval. m smooths (raw values stay faint underneath), l switches to a "
            "log scale, h hides single runs, r reads the runs again, Esc goes back to the picker.")
    BINDINGS = [
        # Short names: "? Help" still fits 80 columns after them (the help says the rest)
        Binding("n", "metric(1)", "Next", tooltip="Next metric"),
        Binding("p", "metric(-1)", "Prev", tooltip="Prev metric"),
        Binding("g", "grid", "All", tooltip="All the metrics in a grid (where they fit), or one at a time"),
        Binding("h", "hide", "Hide", tooltip="Hide or show single runs"),
        *CompareChart.screen_bindings(),  # Cursor in the footer; zoom, pan, wall time, smoothing, log scale
        Binding("r", "reload", "Reload", show=False),
        Binding("escape", "back", "Runs"),
    ]

    def __init__(self, runs: list[ComparedRun], options: TuiOptions) -> None:
        super().__init__()
        self.runs = runs
        self.options = options
        self.loaded: list[LoadedRun] = []
        self.readers: list[EventReader] = []
        self.ready = False
        """The runs have been read (tests wait on it)."""
        self.polls = 0
        """Reads of the runs for new events since they were loaded (tests wait on it)."""

    def compose(self) -> ComposeResult:
        o = self.options
        yield Static(id="compare-title")
        yield CompareChart(PlotOptions(ascii=o.ascii, colour=o.colour), id="compare-plot")
        yield Static(id="compare-legend")
        yield Footer()

    def on_mount(self) -> None:
        self._show_title()
        self._load()
        if self.options.follow:
            self.set_interval(FOLLOW_SECONDS, self._poll)

    def on_resize(self) -> None:
        self.call_after_refresh(keep_off, self, self.chart)

    @property
    def chart(self) -> CompareChart:
        return self.query_one("#compare-plot", CompareChart)

    # -- reading and following the runs --------------------------------------------------------------
    @work(thread=True, group="compare", exclusive=True)
    def _load(self) -> None:
        loaded, readers = [], []
        for index, run in enumerate(self.runs):
            events = run.run_dir / EVENTS_FILE
            weight = self.options.smoothing
            history = load_history(events, file_size(events), weight) or RunHistory(weight)
            loaded.append(LoadedRun(run, history, RUN_STYLES[index % len(RUN_STYLES)],
                                    RUN_GLYPHS[index % len(RUN_GLYPHS)]))
            readers.append(EventReader(events, history.read_to))  # on from the last complete line read
        self.post_message(HistoriesLoaded(loaded, readers))

    def _poll(self) -> None:
        if self.ready and self.readers:
            self._read_new(list(self.readers))

    @work(thread=True, group="compare-follow", exclusive=True)
    def _read_new(self, readers: list[EventReader]) -> None:
        restarts = [reader.restarts for reader in readers]
        events = [reader.read_new() for reader in readers]
        restarted = any(reader.restarts != before for reader, before in zip(readers, restarts))
        self.post_message(RunsGrew(readers, events, restarted))

    def on_histories_loaded(self, message: HistoriesLoaded) -> None:
        self.loaded, self.readers = message.loaded, message.readers
        chart = self.chart
        chart.loaded = self.loaded
        chart.refresh()
        self._show()
        self.call_after_refresh(keep_off, self, chart)  # the legend's height is known now
        self.ready = True

    def on_runs_grew(self, message: RunsGrew) -> None:
        if message.readers != self.readers:
            return  # read before the runs were read again from the top: those events are in the new read
        self.polls += 1
        if message.restarted:  # a file replaced or truncated: read them again from the top
            self._load()
            return
        grew = False
        for run, events in zip(self.loaded, message.events):
            for event in events:
                if event.get("kind") in STATES_BY_END:
                    self._set_state(run, STATES_BY_END[str(event["kind"])])
                elif event.get("kind") == "run_started":
                    self._set_state(run, "running")
            grew = run.history.add(events) or grew
        if grew:
            self.chart.data_changed()
            self._show()

    @staticmethod
    def _set_state(run: LoadedRun, state: str) -> None:
        run.run = replace(run.run, state=state)

    # -- what is shown --------------------------------------------------------------------------------
    def _show(self) -> None:
        self.query_one("#compare-legend", Static).update(self.legend())
        self._show_title()

    def metrics(self) -> list[tuple[str, str]]:
        return metrics_present(self.loaded)

    @property
    def metric(self) -> tuple[str, str] | None:
        """The metric shown alone, or that `n` and `p` start from while the grid is shown."""
        metrics = self.metrics()
        return metrics[min(self.chart.metric_index, len(metrics) - 1)] if metrics else None

    def _show_title(self) -> None:
        chart = self.chart
        metrics, metric = self.metrics(), self.metric
        if metric is None:
            where = "-"
        elif chart.showing_grid():
            where = f"all {len(metrics)} metrics"
        else:
            where = f"{metric[1]} ({min(chart.metric_index, len(metrics) - 1) + 1}/{len(metrics)})"
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f" compare {len(self.runs)} runs", style="bold")
        line.append(f": {where}   n/p metric, g all, Esc back")
        self.query_one("#compare-title", Static).update(line)

    def legend(self) -> Text:
        """A line a run: its mark, name, state and the metric's latest value, or its value at the cursor
        (or that it has none)."""
        lines = []
        chart = self.chart
        metric = None if chart.showing_grid() else self.metric
        colour, ascii_mode = self.options.colour, self.options.ascii
        width = max((len(r.run.name) for r in self.loaded), default=0)
        cursor, wall = chart.cursor, chart.options.wall_time
        span = chart.span()
        for r in self.loaded:
            line = Text(no_wrap=True, overflow="ellipsis")
            mark = f"{r.glyph}{r.glyph}" if ascii_mode else "━━"
            line.append(mark, style=r.style if colour and r.run.name not in chart.hidden else "")
            line.append(f" {r.run.name:<{width}}  {r.run.state:<11}", style="bold" if colour else "")
            if r.run.name in chart.hidden:
                line.append(" hidden (h)")
                lines.append(line)
                continue
            series = r.history.series[metric[0]] if metric else None
            if metric is None:
                line.append(f" {len(r.history.series['loss']):,} steps logged")
            elif series is None or not len(series):
                line.append(f" no {metric[1]}")
            elif cursor is not None:
                found = value_at(Curve(series, "", "", ""), cursor, wall)
                if found is not None:
                    at, value = found
                    where = format_x(at, span[1] - span[0] if span else 0.0, wall)
                    line.append(f" {compact(value)} at {'' if wall else 'step '}{where}")
            else:
                step, value = float(series.x.view[-1]), float(series.y.view[-1])
                line.append(f" {compact(value)} at step {format_x(step, 0.0, False)} ({len(series):,} points)")
            lines.append(line)
        return Text("\n").join(lines) if lines else Text("reading the runs...")

    # -- keys -----------------------------------------------------------------------------------------
    def action_metric(self, delta: int) -> None:
        self.chart.step_metric(delta)
        self._show()

    def action_grid(self) -> None:
        if not self.chart.toggle_grid() and self.chart.chart is not None and self.chart.shape() is None:
            self.notify("all the metrics need a bigger terminal (about 160x40); n and p step through them",
                        timeout=4)
        self._show()

    def action_hide(self) -> None:
        chart = self.chart

        def chosen(hidden: set[str] | None) -> None:
            if hidden is not None:
                chart.set_hidden(hidden)
                self._show()

        self.app.push_screen(CurvePickerScreen("runs shown", chart.curve_names(), chart.hidden), chosen)

    async def action_chart(self, action: str) -> None:
        """One of the chart's keys (`CompareChart.KEYS`), handed on to the chart."""
        await self.chart.run_action(action)

    def on_loss_plot_view_changed(self, message: LossPlot.ViewChanged) -> None:
        # The legend reads the view (the cursor's values, the smoothing and log flags): no notification over the chart
        self._show()

    def action_reload(self) -> None:
        self._load()

    def action_back(self) -> None:
        self.app.pop_screen()
