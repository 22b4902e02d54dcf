"""Runs side by side: one metric of several runs overlaid on one plot (x is the step), each run its own
colour (and, in ASCII mode, its own glyph), with a legend naming the runs. Opened from the run picker
with the selected runs; each run's events.jsonl is folded by `tideborn.tui.history.load_history` in a worker."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from tideborn.humanize import compact
from tideborn.rundir import EVENTS_FILE
from tideborn.rundir.files import file_size
from tideborn.tui.history import RunHistory, load_history
from tideborn.tui.options import TuiOptions
from tideborn.tui.plotting import Curve, PlotOptions, format_step, render_plot

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
)
RUN_STYLES = ("#e5c07b", "#61afef", "#e06c75", "#98c379", "#c678dd", "#56b6c2", "#d19a66", "#abb2bf")
RUN_GLYPHS = ("#", "o", "*", "@", "%", "&", "=", "$")
"""One per run, in order; none of them is a glyph the plot uses for something else (`.` raw values, `x`
NaN, `^`/`v` infinities). Past eight runs they repeat: the legend still names each run."""


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
    def __init__(self, loaded: list[LoadedRun]) -> None:
        super().__init__()
        self.loaded = loaded


def metrics_present(loaded: list[LoadedRun]) -> list[tuple[str, str]]:
    """The metrics at least one of the runs has points for, in METRICS order."""
    return [(name, label) for name, label in METRICS if any(len(r.history.series[name]) for r in loaded)]


class CompareChart(Widget):
    """One metric of every run, overlaid (`tideborn.tui.plotting.render_plot`, one curve a run)."""

    def __init__(self, options: PlotOptions, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.options = options
        self.loaded: list[LoadedRun] = []
        self.metric: tuple[str, str] | None = None

    def curves(self) -> list[Curve]:
        if self.metric is None:
            return []
        name = self.metric[0]
        return [Curve(r.history.series[name], r.run.name, r.style, r.glyph) for r in self.loaded
                if len(r.history.series[name])]

    def render(self) -> Text:
        size = self.content_size
        if self.metric is None:
            return Text("reading the runs..." if not self.loaded else "no step or eval events in these runs")
        return render_plot(self.curves(), [], self.options, size.width, size.height, title=self.metric[1])


class CompareScreen(Screen):
    HELP = ("One metric of the selected runs, overlaid: x is the training step, each run its own colour (in "
            "--ascii its own glyph), named in the legend below the plot with its state and its latest value. "
            "n and p step through the metrics the runs have; m smooths (raw values stay faint underneath), l "
            "switches to a log scale, r reads the runs again, Esc goes back to the picker.")
    BINDINGS = [
        Binding("n", "metric(1)", "Next metric"),
        Binding("p", "metric(-1)", "Prev metric"),
        Binding("m", "smooth", "Smooth"),
        Binding("l", "log_scale", "Log"),
        Binding("r", "reload", "Reload", show=False),
        Binding("escape", "back", "Runs"),
    ]

    def __init__(self, runs: list[ComparedRun], options: TuiOptions) -> None:
        super().__init__()
        self.runs = runs
        self.options = options
        self.loaded: list[LoadedRun] = []
        self.metric_index = 0
        self.ready = False
        """The runs have been read (tests wait on it)."""

    def compose(self) -> ComposeResult:
        o = self.options
        yield Static(id="compare-title")
        yield CompareChart(PlotOptions(ascii=o.ascii, colour=o.colour), id="compare-plot")
        yield Static(id="compare-legend")
        yield Footer()

    def on_mount(self) -> None:
        self._show_title()
        self._load()

    @property
    def chart(self) -> CompareChart:
        return self.query_one("#compare-plot", CompareChart)

    @work(thread=True, group="compare", exclusive=True)
    def _load(self) -> None:
        loaded = []
        for index, run in enumerate(self.runs):
            events = run.run_dir / EVENTS_FILE
            weight = self.options.smoothing
            history = load_history(events, file_size(events), weight) or RunHistory(weight)
            loaded.append(LoadedRun(run, history, RUN_STYLES[index % len(RUN_STYLES)],
                                    RUN_GLYPHS[index % len(RUN_GLYPHS)]))
        self.post_message(HistoriesLoaded(loaded))

    def on_histories_loaded(self, message: HistoriesLoaded) -> None:
        current = self.metric
        self.loaded = message.loaded
        names = [name for name, _label in self.metrics()]
        self.metric_index = names.index(current[0]) if current and current[0] in names else 0
        self._show()
        self.ready = True

    def metrics(self) -> list[tuple[str, str]]:
        return metrics_present(self.loaded)

    @property
    def metric(self) -> tuple[str, str] | None:
        metrics = self.metrics()
        return metrics[self.metric_index % len(metrics)] if metrics else None

    def _show(self) -> None:
        chart = self.chart
        chart.loaded = self.loaded
        chart.metric = self.metric
        chart.refresh()
        self.query_one("#compare-legend", Static).update(self.legend())
        self._show_title()

    def _show_title(self) -> None:
        metrics = self.metrics()
        metric = self.metric
        where = f"{metric[1]} ({self.metric_index % len(metrics) + 1}/{len(metrics)})" if metric else "-"
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f" compare {len(self.runs)} runs", style="bold")
        line.append(f": {where}   n/p metric, Esc back")
        self.query_one("#compare-title", Static).update(line)

    def legend(self) -> Text:
        """A line a run: its mark, name, state and latest value of the metric (or that it has none)."""
        lines = []
        metric = self.metric
        colour, ascii_mode = self.options.colour, self.options.ascii
        width = max((len(r.run.name) for r in self.loaded), default=0)
        for r in self.loaded:
            line = Text(no_wrap=True, overflow="ellipsis")
            mark = f"{r.glyph}{r.glyph}" if ascii_mode else "━━"
            line.append(mark, style=r.style if colour else "")
            line.append(f" {r.run.name:<{width}}  {r.run.state:<11}", style="bold" if colour else "")
            series = r.history.series[metric[0]] if metric else None
            if series is None or not len(series):
                line.append(f" no {metric[1] if metric else 'points'}")
            else:
                step, value = float(series.x.view[-1]), float(series.y.view[-1])
                line.append(f" {compact(value)} at step {format_step(step)} ({len(series):,} points)")
            lines.append(line)
        return Text("\n").join(lines) if lines else Text("reading the runs...")

    # -- keys -----------------------------------------------------------------------------------------
    def action_metric(self, delta: int) -> None:
        metrics = self.metrics()
        if not metrics:
            return
        self.metric_index = (self.metric_index + delta) % len(metrics)
        self._show()

    def action_smooth(self) -> None:
        chart = self.chart
        chart.options = replace(chart.options, smooth=not chart.options.smooth)
        chart.refresh()
        self.notify(f"smoothing {'on' if chart.options.smooth else 'off'}", timeout=2)

    def action_log_scale(self) -> None:
        chart = self.chart
        chart.options = replace(chart.options, log=not chart.options.log)
        chart.refresh()
        self.notify(f"{'log' if chart.options.log else 'linear'} scale", timeout=2)

    def action_reload(self) -> None:
        self._load()

    def action_back(self) -> None:
        self.app.pop_screen()
