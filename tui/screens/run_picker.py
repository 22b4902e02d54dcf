"""A folder of runs at a glance: each run's state, progress, latest losses, anomalies and last event,
refreshed by a worker that keeps one tracker per run (reading only what is new); Enter opens a run."""

from __future__ import annotations

import threading
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tideborn.humanize import duration, number
from tideborn.runstate import RunTracker
from tui.messages import RunsListed
from tui.options import TuiOptions, runs_in
from tui.widgets.header import STATE_STYLES

REFRESH_SECONDS = 3.0


def runs_report(folder: Path, trackers: dict[Path, RunTracker], options: TuiOptions) -> list[dict]:
    """One status report per run directory in `folder` (trackers are kept and reused between calls)."""
    reports = []
    now = options.clock()
    for run_dir in runs_in(folder):
        tracker = trackers.get(run_dir)
        if tracker is None:
            tracker = trackers[run_dir] = RunTracker(run_dir, options.thresholds, start="tail", strict_pid_file=False)
        tracker.refresh(now=now, keep_events=False)
        report = tracker.status(now)
        report["name"] = run_dir.name
        reports.append(report)
    return reports


class RunPickerScreen(Screen):
    HELP = "Enter (or o) opens the highlighted run; Esc in a run's dashboard comes back here. r refreshes now."
    BINDINGS = [Binding("o", "open", "Open"), Binding("r", "refresh", "Refresh")]

    def __init__(self, folder: Path, options: TuiOptions) -> None:
        super().__init__()
        self.folder = folder
        self.options = options
        self.runs: list[dict] = []
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static(id="picker-title")
        yield DataTable(id="runs", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#picker-title", Static).update(Text.assemble((" runs in ", "bold"), str(self.folder)))
        table = self.query_one("#runs", DataTable)
        for label in ("run", "state", "step", "loss", "anomalies", "last event"):
            table.add_column(label, key=label)
        table.focus()
        self._watch()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()

    @work(thread=True, group="runs", exclusive=True)
    def _watch(self) -> None:
        trackers: dict[Path, RunTracker] = {}
        while not self._stop.is_set():
            self.post_message(RunsListed(runs_report(self.folder, trackers, self.options)))
            if not self.options.follow:
                return
            self._wake.wait(REFRESH_SECONDS)
            self._wake.clear()

    def on_runs_listed(self, message: RunsListed) -> None:
        self.runs = message.runs
        table = self.query_one("#runs", DataTable)
        cursor = table.cursor_row
        table.clear()
        now = self.options.clock()
        colour = self.options.colour
        for run in self.runs:
            state = str(run["state"])
            max_steps = f"/{run['max_steps']:,}" if isinstance(run.get("max_steps"), int) else ""
            loss = (run.get("loss") or {}).get("loss")
            anomalies = len(run.get("anomalies") or [])
            last = run.get("last_event_time")
            table.add_row(
                run["name"],
                Text(state, style=STATE_STYLES.get(state, "") if colour else ""),
                f"{run['step']:,}{max_steps}",
                number(loss) if loss is not None else "-",
                Text(str(anomalies), style="bold red" if anomalies and colour else "") if anomalies else "0",
                f"{duration(now - last)} ago" if isinstance(last, (int, float)) else "-",
                key=run["run_dir"],
            )
        if self.runs:
            table.move_cursor(row=min(cursor, len(self.runs) - 1))
        table.border_title = f"{len(self.runs)} runs" + ("" if self.runs else ": none here yet")
        self.ready.set()

    @on(DataTable.RowSelected, "#runs")
    def _selected(self, event: DataTable.RowSelected) -> None:
        self._open(event.row_key.value)

    def action_open(self) -> None:
        table = self.query_one("#runs", DataTable)
        if table.row_count:
            self._open(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def _open(self, run_dir: str | None) -> None:
        if run_dir is None:
            return
        from tui.screens.dashboard import DashboardScreen

        self.app.push_screen(DashboardScreen(Path(run_dir), self.options, from_picker=True))

    def action_refresh(self) -> None:
        self._wake.set()
