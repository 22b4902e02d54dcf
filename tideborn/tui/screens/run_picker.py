"""A folder of runs at a glance: each run's state, progress, latest losses, anomalies and last event,
refreshed by a worker that keeps one tracker per run (reading only what is new); Enter opens a run.
The list sorts (name, last update, state, step) and filters (state, a part of the name); runs marked with
space are compared (`tideborn.tui.screens.compare`)."""

from __future__ import annotations

import threading
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from tideborn.humanize import compact, duration
from tideborn.rundir.state import STATES, RunTracker
from tideborn.tui.messages import ListedRun, RunsListed
from tideborn.tui.options import TuiOptions, runs_in
from tideborn.tui.widgets.header import STATE_STYLES

REFRESH_SECONDS = 3.0
SORTS = ("name", "last update", "state", "step")
"""The `s` key cycles through these: name A-Z, newest event first, by state (as STATES lists them), most
steps first."""


def runs_report(folder: Path, trackers: dict[Path, RunTracker], options: TuiOptions) -> list[ListedRun]:
    """One status report per run directory in `folder` (trackers are kept and reused between calls)."""
    reports = []
    now = options.clock()
    for run_dir in runs_in(folder):
        tracker = trackers.get(run_dir)
        if tracker is None:
            tracker = trackers[run_dir] = RunTracker(run_dir, options.thresholds, start="tail", strict_pid_file=False)
        tracker.refresh(now=now, keep_events=False)
        reports.append(ListedRun(run_dir.name, tracker.status(now)))
    return reports


COLUMNS = ("", "run", "state", "step", "loss", "anomalies", "last event")


class RunPickerScreen(Screen):
    HELP = ("Enter (or o) opens the highlighted run; Esc in a run's dashboard comes back here. r refreshes now.\n"
            "space marks a run (and unmarks it); c compares the marked runs (two or more) on one plot. s sorts by "
            "name, last update, state or step; t shows only the runs in one state (cycling through those "
            "present); / filters by a part of the name (Enter keeps the filter, Esc in it clears it); Esc here "
            "clears the filters.")
    BINDINGS = [
        # o and r in the help screen, not the footer (Enter opens a run too): with Compare offered, "? Help"
        # must still fit 80 columns
        Binding("o", "open", "Open", show=False),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        # Fewer than two runs marked: c is not offered, and pressed, it says what it needs (check_action).
        Binding("c", "compare_needs_two", "Compare", show=False),
        Binding("s", "sort", "Sort"),
        Binding("t", "state_filter", "State filter"),
        Binding("slash", "name_filter", "Filter"),
        Binding("escape", "clear_filters", "Clear filters", show=False),
        Binding("r", "refresh", "Refresh", show=False),
    ]

    def __init__(self, folder: Path, options: TuiOptions) -> None:
        super().__init__()
        self.folder = folder
        self.options = options
        self.runs: list[ListedRun] = []
        """Every run of the folder, by name (as the worker lists them)."""
        self.shown: list[ListedRun] = []
        """The runs in the table: filtered and sorted."""
        self.marked: set[str] = set()
        """Run directories marked for comparison (they stay marked while filtered out)."""
        self.sort = SORTS[0]
        self.state_filter: str | None = None
        self.name_filter = ""
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static(id="picker-title")
        yield DataTable(id="runs", cursor_type="row")
        yield Input(placeholder="a part of the run's name; Enter keeps it, Esc clears it", id="picker-filter",
                    classes="-hidden")
        yield Footer()

    def on_mount(self) -> None:
        self._show_title()
        table = self.query_one("#runs", DataTable)
        self._set_columns(table, [])
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
        present = {run.status.run_dir for run in self.runs}
        self.marked &= present  # a run that went away is no longer compared
        self._fill()
        self.ready.set()

    def _visible(self) -> list[ListedRun]:
        runs = [run for run in self.runs
                if (self.state_filter is None or run.status.state == self.state_filter)
                and self.name_filter.casefold() in run.name.casefold()]
        if self.sort == "last update":
            runs.sort(key=lambda run: -float(run.status.last_event_time) if run.status.last_event_time is not None
                      else float("inf"))
        elif self.sort == "state":
            order = {state: index for index, state in enumerate(STATES)}
            runs.sort(key=lambda run: order.get(run.status.state, len(order)))
        elif self.sort == "step":
            runs.sort(key=lambda run: -run.status.step)
        return runs  # by name otherwise, and within equal keys (sorts are stable; runs_in lists by name)

    def _fill(self) -> None:
        table = self.query_one("#runs", DataTable)
        highlighted = self.highlighted()
        self.shown = self._visible()
        now = self.options.clock()
        colour = self.options.colour
        rows = []
        for run in self.shown:
            s = run.status
            max_steps = f"/{s.max_steps:,}" if s.max_steps is not None else ""
            loss = (s.loss or {}).get("loss")
            anomalies = len(s.anomalies)
            last = s.last_event_time
            marked = s.run_dir in self.marked
            rows.append((s.run_dir, (
                Text("[x]" if marked else "[ ]", style="bold" if marked else "dim" if colour else ""),
                Text(run.name),  # a str cell is read as markup: "[bold]" in a directory's name is text
                Text(s.state, style=STATE_STYLES.get(s.state, "") if colour else ""),
                Text(f"{s.step:,}{max_steps}"),
                Text(compact(loss) if loss is not None else "-"),
                Text(str(anomalies), style="bold red" if anomalies and colour else "") if anomalies else Text("0"),
                Text(f"{duration(now - last)} ago" if last is not None else "-"),
            )))
        table.clear(columns=True)
        self._set_columns(table, [cells for _, cells in rows])
        for key, cells in rows:
            table.add_row(*cells, key=key)
        keys = [run.status.run_dir for run in self.shown]
        if keys:
            table.move_cursor(row=keys.index(highlighted) if highlighted in keys else 0)
        hidden = len(self.runs) - len(self.shown)
        table.border_title = (f"{len(self.runs)} runs" + ("" if self.runs else ": none here yet")
                              + (f", {hidden} filtered out" if hidden else ""))
        table.border_subtitle = f"{len(self.marked)} marked" if self.marked else ""
        self._show_title()
        self.refresh_bindings()  # c is offered once two runs are marked

    @staticmethod
    def _set_columns(table: DataTable, rows: list[tuple[Text, ...]]) -> None:
        """The columns, each as wide as its widest cell. Given here rather than left to the table's own
        sizing, which measures new rows when the app is next idle and, when a frame was drawn in between,
        can keep showing the cells cut to the labels' widths ("faile" for "failed")."""
        for index, label in enumerate(COLUMNS):
            width = max([len(label), *(row[index].cell_len for row in rows)])
            table.add_column(label, key=label or "mark", width=width)

    def _show_title(self) -> None:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(" runs in ", style="bold")
        line.append(str(self.folder))
        line.append(f"  sort: {self.sort}")
        if self.state_filter is not None:
            line.append(f"  state: {self.state_filter}")
        if self.name_filter:
            line.append(f"  name: *{self.name_filter}*")
        self.query_one("#picker-title", Static).update(line)

    def highlighted(self) -> str | None:
        table = self.query_one("#runs", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    @on(DataTable.RowSelected, "#runs")
    def _selected(self, event: DataTable.RowSelected) -> None:
        self._open(event.row_key.value)

    def action_open(self) -> None:
        self._open(self.highlighted())

    def _open(self, run_dir: str | None) -> None:
        if run_dir is None:
            return
        from tideborn.tui.screens.dashboard import DashboardScreen

        self.app.push_screen(DashboardScreen(Path(run_dir), self.options, from_picker=True))

    def action_refresh(self) -> None:
        self._wake.set()

    # -- marking and comparing ------------------------------------------------------------------------
    def action_mark(self) -> None:
        run_dir = self.highlighted()
        if run_dir is None:
            return
        self.marked ^= {run_dir}
        self._fill()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "compare":
            return len(self.marked) >= 2
        if action == "compare_needs_two":
            return len(self.marked) < 2
        if action == "clear_filters":
            return self.state_filter is not None or bool(self.name_filter)
        return True

    def action_compare_needs_two(self) -> None:
        self.notify(f"mark two or more runs with space to compare them ({len(self.marked)} marked)",
                    severity="warning", timeout=5)

    def action_compare(self) -> None:
        from tideborn.tui.screens.compare import ComparedRun, CompareScreen

        # In the table's order; marked runs the filters hide are compared too (the title says how many).
        order = {run.status.run_dir: index for index, run in enumerate(self.shown)}
        chosen = sorted((run for run in self.runs if run.status.run_dir in self.marked),
                        key=lambda run: (order.get(run.status.run_dir, len(order)), run.name))
        self.app.push_screen(CompareScreen([ComparedRun(run.name, Path(run.status.run_dir), run.status.state)
                                            for run in chosen], self.options))

    # -- sorting and filtering ------------------------------------------------------------------------
    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self._fill()
        self.notify(f"sorted by {self.sort}", timeout=2)

    def action_state_filter(self) -> None:
        states = [state for state in STATES if any(run.status.state == state for run in self.runs)]
        choices: list[str | None] = [None, *states]
        current = choices.index(self.state_filter) if self.state_filter in choices else 0
        self.state_filter = choices[(current + 1) % len(choices)]
        self._fill()
        self.notify(f"state: {self.state_filter or 'all'}", timeout=2)

    def action_name_filter(self) -> None:
        box = self.query_one("#picker-filter", Input)
        box.remove_class("-hidden")
        box.value = self.name_filter
        box.focus()

    @on(Input.Changed, "#picker-filter")
    def _filter_typed(self, event: Input.Changed) -> None:
        self.name_filter = event.value.strip()
        self._fill()

    @on(Input.Submitted, "#picker-filter")
    def _filter_kept(self, event: Input.Submitted) -> None:
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one("#picker-filter", Input).add_class("-hidden")
        self.query_one("#runs", DataTable).focus()

    def action_clear_filters(self) -> None:
        self.state_filter, self.name_filter = None, ""
        self._close_filter()
        self._fill()

    def on_key(self, event) -> None:
        """Esc in the name filter clears it (the Input would otherwise keep the key to itself)."""
        box = self.query_one("#picker-filter", Input)
        if event.key == "escape" and box.has_focus:
            event.stop()
            self.name_filter = ""
            box.value = ""
            self._close_filter()
            self._fill()
