"""One run's dashboard: header, loss plot, hardware, anomalies and the log, kept current by a worker
that follows the run directory; start and stop by key, through `tideborn.tools.control`."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, OptionList

from tideborn.errors import UserError
from tideborn.humanize import duration
from tideborn.rundir.anomaly import STALLED, VANISHED
from tideborn.rundir.files import file_size, first_event
from tideborn.rundir.kinds import TERMINAL_KINDS
from tideborn.rundir.layout import LAUNCH_FILE, list_checkpoints
from tideborn.rundir.status import RunStatus
from tideborn.tools.control import CheckedLaunch, NotRunning, TrainerExited, check_launch, launch_run, signal_run
from tideborn.tui.follow import RunFollower, follow
from tideborn.tui.history import RunHistory, SeenEvents, load_history, rotated_away, starts_a_new_run
from tideborn.tui.messages import (
    AnomaliesFound,
    EventsArrived,
    HardwareSampled,
    HistoryLoaded,
    HistoryProgressed,
    LaunchFailed,
    LogLinesArrived,
    RunAttached,
    RunLaunched,
    RunRefreshed,
    StartChecked,
    StopFailed,
    StopSent,
)
from tideborn.tui.options import WINDOWS, TuiOptions
from tideborn.tui.plan import LaunchPlan
from tideborn.tui.plotting import Marker, PlotOptions
from tideborn.tui.screens.confirm import ConfirmScreen
from tideborn.tui.screens.help import PLOT_NOTES, TextScreen
from tideborn.tui.toasts import keep_off
from tideborn.tui.widgets.anomalies import AnomalyList, clock_text, evidence_text
from tideborn.tui.widgets.gpu_panel import GpuPanel
from tideborn.tui.widgets.header import RunHeader
from tideborn.tui.widgets.log_pane import LogPane
from tideborn.tui.widgets.loss_plot import LossPlot

LIVE_STATES = ("running", "stalled")
SMOOTHING_WEIGHTS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
"""What < and > step through (0: off)."""


LOG_NOTES = """\
In the panes (Tab moves between them): in the anomalies, Enter jumps to the anomaly's train.log line (or
shows its details when it has none), d shows its details. In the log, up, PgUp and Home stop following
new lines (it stays put while they arrive); End or f follows again; left and right scroll long lines
sideways, w wraps them."""


class DashboardScreen(Screen):
    HELP = LOG_NOTES + "\n\n" + PLOT_NOTES
    BINDINGS = [
        Binding("s", "start", "Start"),
        # While the run is live, Start is not offered; s only says so (check_action).
        Binding("s", "start_while_live", "Start", show=False),
        Binding("x", "stop", "Stop"),
        # While a stop is in progress, x only says so: Stop is not offered again (check_action).
        Binding("x", "stop_in_progress", "Stop", show=False),
        # Nor while the run is not running (finished, stopped, failed...): x says there is nothing to stop.
        Binding("x", "stop_not_running", "Stop", show=False),
        Binding("k", "checkpoints", "Checkpoints"),
        # n, a, c and the chart's keys: in the help screen, not the footer, so that "? Help" still fits 80 columns
        # next to Start / Stop, Checkpoints, Chart, Overrides and Follow log
        Binding("n", "last_steps", "Last N", show=False),
        Binding("a", "all_steps", "All", show=False),
        Binding("c", "curves", "Curves: all, train, eval", show=False),
        Binding("g", "next_chart", "Chart"),
        *LossPlot.screen_bindings(),  # zoom, pan, cursor, wall time, smoothing on/off, log scale
        Binding("less_than_sign", "smoothing_down", "Less smoothing (0 is off)", show=False),
        Binding("greater_than_sign", "smoothing_up", "More smoothing", show=False),
        Binding("e", "edit", "Overrides"),
        # Without a plan (no --config, no launch.json) s and e are not offered; pressed, they say why.
        Binding("s,e", "no_plan", "Start / Overrides (needs --config)", show=False),
        Binding("f", "follow_log", "Follow log"),
        Binding("w", "wrap_log", "Wrap log", show=False),
        Binding("d", "anomaly_details", "Anomaly details", show=False),
        Binding("escape", "back", "Runs", show=False),
        Binding("z", "maximise", "Maximise: the charts, the log, neither", show=False),
        Binding("h", "hide_curves", "Hide or show single curves", show=False),
    ]

    def __init__(self, run_dir: Path, options: TuiOptions, from_picker: bool = False) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.options = options
        self.from_picker = from_picker
        self.history = RunHistory(options.smoothing)
        self.state = "not started"
        self.status: RunStatus | None = None
        self.ready = threading.Event()
        """Set once the first poll and, for a long run, the full history have arrived (tests wait on it)."""
        self._stop = threading.Event()
        self._first_event_kind: str | None = None
        self._history_source: tuple[Path, int, Path | None] | None = None
        """events.jsonl, the offset where the tail read first begins (a long run), and events.jsonl.1 when it
        is this run's earlier part (`rotated_away`); None when the tail read it all."""
        self._generation = 0
        self._events_seen = False
        self._reset_pending = False
        """events.jsonl was read again from the top and its first event has not arrived yet."""
        self._seen = SeenEvents()
        self._launched: list[subprocess.Popen] = []
        self._offered: tuple[bool, bool, bool] | None = None
        self.maximised: str | None = None
        """What `z` shows alone: "chart", "log", or None (everything)."""
        """What the footer last offered: (the run live, a stop in progress, a plan to start)."""

    # -- layout ---------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        o = self.options
        yield RunHeader(self.run_dir, o.clock, colour=o.colour, id="header", ascii=o.ascii)
        yield LossPlot(self.history, PlotOptions(window=o.window, ascii=o.ascii, colour=o.colour), id="plot")
        with Horizontal(id="lower"):
            yield GpuPanel(o.clock, ascii=o.ascii, colour=o.colour, id="gpu")
            with Vertical(id="side"):
                yield AnomalyList(colour=o.colour, id="anomalies")
                yield LogPane(colour=o.colour, id="log")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = str(self.run_dir)
        self.query_one("#log", LogPane).focus()
        self._follow()
        self.set_interval(2.0, self._reap)

    def on_unmount(self) -> None:
        self._stop.set()

    def on_resize(self) -> None:
        self.call_after_refresh(keep_off, self, self.plot)

    @property
    def plot(self) -> LossPlot:
        return self.query_one("#plot", LossPlot)

    @property
    def header(self) -> RunHeader:
        return self.query_one("#header", RunHeader)

    # -- following ------------------------------------------------------------------------------------
    @work(thread=True, group="follow", exclusive=True)
    def _follow(self) -> None:
        follower = RunFollower(self.run_dir, self.options.thresholds, self.options.clock, self.options.use_nvml)
        previous = rotated_away(follower.events_path)
        if follower.tail_start > 0 or previous is not None:
            self._history_source = (follower.events_path, follower.tail_start, previous)
        if self.options.follow:
            follow(follower, self.post_message, self._stop)
            return
        for message in follower.poll():
            self.post_message(message)
        self.post_message(RunAttached())
        follower.close()

    def on_run_attached(self, message: RunAttached) -> None:
        if self._history_source is None:
            self.ready.set()
            return
        # The tail is on screen first; the loader starts after that frame, so it never delays it.
        self.call_after_refresh(self._load_history, *self._history_source, self._generation)

    @work(thread=True, group="history", exclusive=True)
    def _load_history(self, path: Path, end: int, previous: Path | None, generation: int) -> None:
        def read(source: Path, until: int) -> RunHistory | None:
            return load_history(source, until, self.options.smoothing,
                                progress=lambda f: self.post_message(HistoryProgressed(f)),
                                cancelled=lambda: self._stop.is_set() or generation != self._generation)

        history = read(path, end)
        if history is not None and previous is not None:  # the run's earlier part, rotated away: read first
            earlier = read(previous, file_size(previous))
            if earlier is None:
                return
            history.prepend(earlier, continues=(first_event(path) or {}).get("kind") != "run_started")
        if history is not None:
            self.post_message(HistoryLoaded(history, generation))

    def on_events_arrived(self, message: EventsArrived) -> None:
        events = message.events
        if message.reset:  # events.jsonl was replaced or truncated: it is read again from the top
            # A history read in flight read the old file: its result is dropped. Whether the new file is
            # a new run or the same run rotated is told by its first event, which may not be there yet
            # (copytruncate leaves it empty).
            self._generation += 1
            self._reset_pending = True
            self.header.note = ""
            self.ready.set()
        if self._reset_pending and events:
            self._reset_pending = False
            if starts_a_new_run(events[0]):  # --fresh, or a file that holds the run whole from its start
                self.history = RunHistory(self.options.smoothing)
                self.plot.set_history(self.history)
                self.plot.anomaly_markers.clear()
                self._first_event_kind = None
                self._seen = SeenEvents()
            else:  # rotated under the run: the curve so far stays, the new file's events go after it
                self._seen.hold_back()
        events = self._seen.unseen(events)
        if events and self._first_event_kind is None:
            self._first_event_kind = str(events[0].get("kind"))
        if self.history.add(events):
            self.plot.data_changed()
        if self._events_seen:
            self._announce(events)
        self._events_seen = True

    def _announce(self, events: list[dict]) -> None:
        for event in events:
            kind = event.get("kind")
            if kind == "run_started":
                self.notify(f"run started at step {event.get('step')} (pid {event.get('pid')})", title="run")
            elif kind in TERMINAL_KINDS:
                detail = event.get("checkpoint") or event.get("error") or ""
                severity = "error" if kind == "run_failed" else "information"
                self.notify(f"{kind} at step {event.get('step')}" + (f": {detail}" if detail else ""),
                            title="run", severity=severity, timeout=10)

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        if message.generation != self._generation:
            return  # read from a file that has since been replaced
        continues = self._first_event_kind != "run_started"
        if message.history.weight != self.history.weight:  # the weight was changed while it was read
            message.history.set_weight(self.history.weight)
        earlier = message.history.nonfinite_anomalies()
        self.history.prepend(message.history, continues)
        if earlier:  # NaNs before the tail read first: listed and marked as those in the tail are
            self.query_one("#anomalies", AnomalyList).add_anomalies(earlier, earlier=True)
            self.plot.anomaly_markers[:0] = [Marker(float(a.evidence["step"]), "anomaly", a.time or None)
                                             for a in earlier]
        self.plot.data_changed()
        self.header.note = ""
        self.header.show()
        self.ready.set()

    def on_history_progressed(self, message: HistoryProgressed) -> None:
        self.header.note = f"reading the full history: {message.fraction * 100:.0f}%"
        self.header.show()

    def on_run_refreshed(self, message: RunRefreshed) -> None:
        self.status = message.status
        # Gone: what was read of its files still says FINISHED (or RUNNING); nothing there can be started or stopped.
        self.state = "gone" if message.gone else message.status.state
        if self.state == "not started" and not self.header.note:
            self.header.note = ("s starts a run here, e edits its settings first" if self.can_start() else
                                "nothing to start here without --config FILE")
        self.header.show_status(message.status, message.checked_at, message.watch_problem, message.gone)
        holding = list(message.status.anomalies)
        pane = self.query_one("#anomalies", AnomalyList)
        # Whatever status lists is listed here too, but once a rule for a process state (its message
        # counts the seconds of a stall, so it changes at each refresh).
        listed = {a.rule for a in pane.anomalies}
        if pane.add_anomalies([a for a in holding if a.rule not in (STALLED, VANISHED) or a.rule not in listed]):
            pane.alert()
        pane.hold(bool(holding))
        # Start and Stop are offered by whether the run is live and whether a stop is in progress (and Start by
        # whether there is a plan). Only when that changes: redrawing the footer restyles all its keys (while a
        # run is followed, status arrives about once a second, and that restyling was most of the TUI's CPU use).
        offered = (self.state in LIVE_STATES, self._stopping() is not None, self.can_start())
        if offered != self._offered:
            self._offered = offered
            self.refresh_bindings()

    def on_anomalies_found(self, message: AnomaliesFound) -> None:
        pane = self.query_one("#anomalies", AnomalyList)
        new = pane.add_anomalies(message.anomalies)
        for anomaly in new:
            step = anomaly.evidence.get("step")
            if isinstance(step, int):
                self.plot.anomaly_markers.append(Marker(float(step), "anomaly", anomaly.time or None))
        if new:
            self.plot.data_changed()
            pane.alert()
            if not message.initial:
                for anomaly in new:
                    self.notify(anomaly.message, title=f"anomaly: {anomaly.rule}", severity="error", timeout=15)

    def on_log_lines_arrived(self, message: LogLinesArrived) -> None:
        self.query_one("#log", LogPane).add_lines(message.lines, message.reset)

    def on_hardware_sampled(self, message: HardwareSampled) -> None:
        self.query_one("#gpu", GpuPanel).show_sample(message.sample)

    def on_option_list_option_selected(self, message: OptionList.OptionSelected) -> None:
        """Enter on an anomaly: to its line in the log pane when it has one, else its details."""
        anomaly = self.query_one("#anomalies", AnomalyList).selected_anomaly()
        if anomaly is None:
            return
        line = anomaly.evidence.get("line")
        if isinstance(line, int):
            log = self.query_one("#log", LogPane)
            if log.jump_to(line):
                log.focus()
                self.notify(f"train.log line {line}; f or End follows the log again", timeout=3)
                return
            self.notify(f"train.log line {line} is no longer in the log pane (it keeps the last lines)",
                        severity="warning", timeout=5)
        self.action_anomaly_details()

    def action_anomaly_details(self) -> None:
        anomaly = self.query_one("#anomalies", AnomalyList).selected_anomaly()
        if anomaly is None:
            self.notify("no anomaly is selected", severity="warning", timeout=3)
            return
        body = (f"rule      {anomaly.rule}\ntime      {clock_text(anomaly.time)}\nstep      "
                f"{anomaly.evidence.get('step', '-')}\n\n{anomaly.message}\n\nevidence\n  {evidence_text(anomaly)}")
        self.app.push_screen(TextScreen(f"anomaly: {anomaly.rule}", body))

    # -- start and stop -------------------------------------------------------------------------------
    def launch_plan(self) -> LaunchPlan | None:
        """What the start key launches: the command line's (or the editor's) plan, else launch.json's."""
        plan = self.app.plan if self.app.plan is not None else LaunchPlan.from_launch_file(self.run_dir)
        return plan.aimed_at(self.run_dir) if plan is not None else None

    def action_start(self, resume: Path | None = None) -> None:
        """Check the plan as `train_run start` would (a refusal is shown, and nothing starts), then ask.
        `resume`: a checkpoint picked in the checkpoint list, passed to the trainer as `--resume`."""
        if self.state in LIVE_STATES:
            self.action_start_while_live()
            return
        try:
            plan = self.launch_plan()
        except UserError as exc:
            self.notify(str(exc), title="cannot start", severity="error", timeout=15)
            return
        if plan is None:
            self.notify(f"nothing to start: no launch.json in {self.run_dir} and no --config given",
                        title="cannot start", severity="error", timeout=15)
            return
        if resume is not None:
            plan = plan.resuming_from(resume)
        self.header.note = "checking the settings..."
        self.header.show()
        self._check(plan)

    @work(thread=True, group="control")
    def _check(self, plan: LaunchPlan) -> None:
        try:
            checked = check_launch(plan.request(), cwd=plan.cwd)
        except UserError as exc:
            self.post_message(LaunchFailed(str(exc)))
            return
        self.post_message(StartChecked(plan, start_question(plan, checked)))

    def on_start_checked(self, message: StartChecked) -> None:
        self.header.note = ""
        self.header.show()

        def answered(yes: bool | None) -> None:
            if yes:
                self.header.note = "starting..."
                self.header.show()
                self._launch(message.plan)

        self.app.push_screen(ConfirmScreen(message.question), answered)

    @work(thread=True, group="control")
    def _launch(self, plan: LaunchPlan) -> None:
        try:
            launched = launch_run(plan.request(), cwd=plan.cwd)
        except (UserError, TrainerExited) as exc:
            self.post_message(LaunchFailed(str(exc)))
            return
        except OSError as exc:  # the filesystem refused something no check foresaw: say so, keep running
            self.post_message(LaunchFailed(f"cannot start in {self.run_dir}: {exc}"))
            return
        self._launched.append(launched.process)
        self.post_message(RunLaunched(launched.record.pid, launched.run_dir, launched.outcome,
                                      launched.started_step))

    def on_run_launched(self, message: RunLaunched) -> None:
        self.header.note = f"launched pid {message.pid}"
        self.header.show()
        step = f" at step {message.step}" if message.step is not None else ""
        said = {"running": f"training{step}", "ended": f"it started{step} and has exited already",
                "starting": "still starting up"}.get(message.outcome, "launched")
        self.notify(f"trainer started: pid {message.pid}, {said}; its output goes to train.log", title="start")

    def on_launch_failed(self, message: LaunchFailed) -> None:
        self.header.note = ""
        self.header.show()
        self.notify(message.reason, title="cannot start", severity="error", timeout=20)

    def _reap(self) -> None:
        """Collect trainers this TUI launched that have exited (they are its children)."""
        self._launched = [p for p in self._launched if p.poll() is None]

    def can_start(self) -> bool:
        """Is there a plan to start (or edit): --config, the editor's, or the run's launch.json?"""
        return self.app.plan is not None or (self.run_dir / LAUNCH_FILE).exists()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Only what works in the run's state is offered; the hidden twins of a key say why it does not.
        live = self.state in LIVE_STATES
        if action == "edit":  # not offered where it could only refuse: nothing to start
            return self.can_start()
        if action == "start":
            return self.can_start() and not live
        if action == "start_while_live":
            return self.can_start() and live
        if action == "no_plan":
            return not self.can_start()
        if action == "stop":
            return live and self._stopping() is None
        if action == "stop_in_progress":
            return self._stopping() is not None
        if action == "stop_not_running":
            return not live and self._stopping() is None
        return True

    def _stopping(self) -> tuple[str, float] | None:
        try:
            return self.header.stopping()
        except NoMatches:  # asked before the header is mounted
            return None

    def stopping_note(self) -> str | None:
        """Why stop is not offered now (a stop is in progress), or None."""
        stopping = self._stopping()
        if stopping is None:
            return None
        pid = self.status.pid if self.status is not None else None
        at_once = (f" To end it at once, losing the steps since its last checkpoint: kill -KILL {pid}"
                   if pid is not None else "")
        return (f"the run is stopping already ({stopping[0]} {duration(self.options.clock() - stopping[1])} ago): it "
                "finishes its step, saves a checkpoint and writes run_stopped; another stop would add nothing."
                + at_once)

    def action_no_plan(self) -> None:
        self.notify(f"nothing to start: no launch.json in {self.run_dir} and no --config given",
                    title="cannot start", severity="error", timeout=15)

    def action_start_while_live(self) -> None:
        self.notify(f"the run is {self.state} already; stop it first (x)", severity="warning")

    def action_stop_not_running(self) -> None:
        self.notify(f"the run is not running ({self.state}); nothing to stop", severity="warning")

    def action_stop_in_progress(self) -> None:
        self.notify(self.stopping_note() or "", title="stopping", severity="warning", timeout=10)

    def action_stop(self) -> None:
        if self.state not in LIVE_STATES:
            self.action_stop_not_running()
            return
        pid = self.status.pid if self.status is not None else None
        question = (f"Stop the run in {self.run_dir}?\n\nSIGTERM to pid {pid}: it finishes its step, saves a "
                    "checkpoint and exits (run_stopped).")
        self.app.push_screen(ConfirmScreen(question), self._stop_confirmed)

    def _stop_confirmed(self, yes: bool | None) -> None:
        if yes and (note := self.stopping_note()):  # a stop began while the question was open
            self.notify(note, title="stopping", severity="warning", timeout=10)
        elif yes:
            self._signal()

    @work(thread=True, group="control")
    def _signal(self) -> None:
        try:
            record = signal_run(self.run_dir)
        except (NotRunning, UserError) as exc:  # gone, or another user's trainer (NotPermitted): say which
            self.post_message(StopFailed(str(exc)))
            return
        self.post_message(StopSent(record.pid))

    def on_stop_sent(self, message: StopSent) -> None:
        self.header.stopping_since = self.options.clock()
        self.header.show()
        self.refresh_bindings()
        self.notify(f"SIGTERM sent to pid {message.pid}; waiting for its checkpoint and run_stopped", title="stop")

    def on_stop_failed(self, message: StopFailed) -> None:
        self.notify(message.reason, title="cannot stop", severity="error", timeout=15)

    # -- view keys ------------------------------------------------------------------------------------
    async def action_chart(self, action: str) -> None:
        """One of the chart's keys (`LossPlot.KEYS`), handed on to the chart."""
        await self.plot.run_action(action)

    def on_loss_plot_view_changed(self, message: LossPlot.ViewChanged) -> None:
        if message.note:
            self.notify(message.note, timeout=message.seconds)

    def action_last_steps(self) -> None:
        current = self.plot.options.window
        later = [w for w in WINDOWS if current is None or w > current]
        window = later[0] if current is not None and later else WINDOWS[0]
        if current is not None and not later:
            window = WINDOWS[0]
        self.plot.show_window(window)

    def action_all_steps(self) -> None:
        self.plot.show_window(None)

    def action_curves(self) -> None:
        view = self.plot.next_view()
        self.notify(f"curves: {view}", timeout=2)

    def action_next_chart(self) -> None:
        self.plot.next_chart()  # the chart's title says which it is (2/6 accuracy): no notification over it

    def action_smoothing_down(self) -> None:
        self._smoothing(-1)

    def action_smoothing_up(self) -> None:
        self._smoothing(1)

    def _smoothing(self, direction: int) -> None:
        """The next EMA weight down or up (0 is off); train curves only, eval points are never smoothed."""
        current = self.options.smoothing if self.plot.options.smooth else 0.0
        if direction > 0:
            weight = next((w for w in SMOOTHING_WEIGHTS if w > current), SMOOTHING_WEIGHTS[-1])
        else:
            weight = next((w for w in reversed(SMOOTHING_WEIGHTS) if w < current), 0.0)
        if weight > 0:
            self.options.smoothing = weight
            if self.history.weight != weight:
                self.history.set_weight(weight)
        self.plot.set_smoothing(weight > 0)
        self.notify(f"smoothing {weight:g} (train curves; eval points are never smoothed)" if weight
                    else "smoothing off", timeout=2)

    def action_edit(self) -> None:
        from tideborn.tui.screens.override_editor import OverrideEditorScreen

        try:
            plan = self.launch_plan()
        except UserError as exc:
            self.notify(str(exc), title="cannot edit", severity="error", timeout=15)
            return
        if plan is None:
            self.notify("no settings to edit: start the TUI with --config FILE (or on a run with launch.json)",
                        severity="warning", timeout=10)
            return
        try:
            screen = OverrideEditorScreen(plan, ascii=self.options.ascii)
        except UserError as exc:
            self.notify(str(exc), title="cannot edit", severity="error", timeout=15)
            return
        self.app.push_screen(screen, self._edited)

    def _edited(self, result: tuple[str, LaunchPlan] | None) -> None:
        if result is None:
            return
        what, plan = result
        self.app.plan = plan
        if what == "launch":
            self.action_start()

    def action_follow_log(self) -> None:
        on = self.query_one("#log", LogPane).toggle_follow()
        self.notify("following the log" if on else "log paused: new lines wait below", timeout=2)

    def action_wrap_log(self) -> None:
        on = self.query_one("#log", LogPane).toggle_wrap()
        self.notify("long log lines wrap" if on else "long log lines scroll sideways (left/right)", timeout=2)

    def action_maximise(self) -> None:
        """The charts alone (header and footer stay), then the log alone, then both again."""
        order = (None, "chart", "log")
        self.maximised = order[(order.index(self.maximised) + 1) % len(order)]
        self.set_class(self.maximised == "chart", "-max-chart")
        self.set_class(self.maximised == "log", "-max-log")
        if self.maximised == "log":
            self.query_one("#log", LogPane).focus()
        self.call_after_refresh(keep_off, self, self.plot)

    def action_hide_curves(self) -> None:
        from tideborn.tui.screens.curves import CurvePickerScreen

        plot = self.plot
        self.app.push_screen(CurvePickerScreen("curves shown", plot.curve_names(), plot.hidden), self._curves_chosen)

    def _curves_chosen(self, hidden: set[str] | None) -> None:
        if hidden is not None:
            self.plot.set_hidden(hidden)

    def action_back(self) -> None:
        if self.from_picker:
            self.app.pop_screen()

    def action_checkpoints(self) -> None:
        """The last eval and the checkpoints; one picked there is resumed from through the start key's path."""
        from tideborn.tui.screens.checkpoints import CheckpointScreen

        def picked(checkpoint: Path | None) -> None:
            if checkpoint is not None:
                self.action_start(resume=checkpoint)

        self.app.push_screen(CheckpointScreen(self.run_dir, self.options, lambda: self.status, self.can_start), picked)


def start_question(plan: LaunchPlan, checked: CheckedLaunch) -> str:
    """The start confirmation: where, with what, and from which step."""
    settings = f"{plan.config or 'the default settings'}"
    others = [o for o in plan.overrides if not o.startswith("runtime.out_dir=")]
    if others:
        settings += f" with {len(others)} override(s): {', '.join(others)}"
    max_steps = checked.settings.runtime.max_steps
    if checked.fresh:
        where = f"starts over at step 0 (--fresh), to step {max_steps:,}"
    elif checked.resumes_from is not None:
        path, step = checked.resumes_from
        where = f"resumes from {path.name} (step {step:,}) to step {max_steps:,}"
        later = [s for s, _p in list_checkpoints(checked.run_dir) if s > step]
        if "--resume" in plan.trainer_args and later:
            where += (f"\n(--resume: the {len(later)} later checkpoint(s), to step {max(later):,}, are abandoned: "
                      "the trainer moves them to archive/branch-*)")
    else:
        where = f"starts at step 0 (no checkpoint there), to step {max_steps:,}"
    return f"Start a run in {checked.run_dir}?\n\n{settings}\n{where}\n(from {plan.origin})"
