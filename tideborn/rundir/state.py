"""What a run directory says about its run, read without touching it (no torch, no writes, no signals).

`RunTracker` follows events.jsonl and train.log from byte offsets, asks the OS about the recorded
process, and applies the rules of `tideborn.rundir.anomaly`; `status`, `watch` and the TUI all read through
it. A tracker can start at the beginning of the files, at their end, or at their tail (the last few
MiB, for a quick status of a long run).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from tideborn.errors import UserError
from tideborn.rundir.anomaly import (
    LOG_RULES,
    LOG_SIGNAL,
    Anomaly,
    AnomalyThresholds,
    LogScanner,
    LossWatch,
    ProcessFacts,
    events_gone,
    gradient,
    orphaned,
    restarted,
    run_failed,
    run_file,
    shift_lines,
    stalled,
    vanished,
)
from tideborn.rundir.events import EventReader
from tideborn.rundir.files import (
    LAUNCH_MARK,
    LogReader,
    PidRecord,
    file_mtime,
    file_size,
    files_written,
    find_first_run_started,
    find_last_run_started,
    first_event,
    line_start_at_or_after,
    process_facts,
    read_pid_record,
    this_host,
)
from tideborn.rundir.kinds import (
    CheckpointSaved,
    DataWindow,
    Eval,
    Match,
    RunEnded,
    RunStarted,
    RunWarning,
    Step,
    StopRequested,
    Watchdog,
    parse_event,
)
from tideborn.rundir.layout import EVENTS_FILE, LOG_FILE, PID_FILE, list_checkpoints
from tideborn.rundir.lock import orphaned_holder
from tideborn.rundir.status import CheckpointOnDisk, EloPoint, Rebaseline, RunStatus, WarningsSeen
from tideborn.safefile import whose

EVENTS_TAIL_BYTES = 2 * 1024 * 1024
ELO_CURVE_POINTS = 10_000
"""`match` events kept for the Elo curve (a run matching every 1,000 steps reaches this at 10M steps)."""
"""A tail-mode tracker starts this far from the end of events.jsonl (about 6,000 step events)."""
LOG_TAIL_BYTES = 1024 * 1024
"""Every tracker scans at most this much of train.log that was there when it started (then all that is new)."""
KEEP_PER_LOG_RULE = 20
STATES = ("running", "stalled", "finished", "stopped", "failed", "vanished", "unknown", "not started")
ENDED_STATES = {"run_finished": "finished", "run_stopped": "stopped", "run_failed": "failed"}
NO_STEP = Step.parse({"kind": "step"})
"""A step event without figures: what the status of a session that has logged no step reads its figures from."""
NO_RUN_STARTED = RunStarted.parse({"kind": "run_started"})
"""A run_started without fields: what the status reads the session's settings from where none was read (or the
one read is an earlier run's)."""


@dataclass(frozen=True)
class Launch:
    """The run a directory's state is about: train.pid's, or a newer one started in a terminal."""

    pid: int
    host: str
    start_time: float | None
    """From train.pid: the process's exact start time."""
    started_by: float | None
    """Without train.pid: its run_started time, which the process must have started before."""
    launched_at: float
    start_ticks: int | None = None
    """Its start in clock ticks since boot (train.pid's, or its run_started's): no clock step moves it."""
    boot_id: str | None = None


@dataclass
class Update:
    """What one `RunTracker.refresh` found: new events, anomalies that began, and the run's state."""

    events: list[dict] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    state: str = "not started"


class RunTracker:
    """Follows one run directory. `start`: "beginning" (every event), "tail" (the last
    EVENTS_TAIL_BYTES, plus the session's run_started), or "end" (only what is written from now on;
    the tail is still read, to know the run's state, but not returned).

    A train.pid that `train_run start` did not write raises `UserError` (status says so and exits 2);
    with `strict_pid_file=False` (the TUI, which must keep running) it is a `run_file` anomaly instead, as
    an events.jsonl or train.log that is a directory, a FIFO or unreadable always is."""

    def __init__(self, run_dir: Path, thresholds: AnomalyThresholds | None = None, start: str = "beginning",
                 strict_pid_file: bool = True):
        if start not in ("beginning", "tail", "end"):
            raise ValueError(f"start must be beginning, tail or end; got {start!r}")
        self.run_dir = Path(run_dir)
        self.thresholds = thresholds or AnomalyThresholds()
        self.events_path, self.log_path = self.run_dir / EVENTS_FILE, self.run_dir / LOG_FILE
        self.strict_pid_file = strict_pid_file
        self._pid_problem: str | None = None
        self._dir_problem: str | None = None
        self._events_gone: Anomaly | None = None
        self.record = self._read_record()
        self.loss = LossWatch(self.thresholds)
        self.scanner = LogScanner()
        self.run_started: RunStarted | None = None
        self.terminal: RunEnded | None = None
        self.last_event: dict | None = None
        """The newest event of any kind (a newer writer's too)."""
        self.last_step: Step | None = None
        self.data_window: DataWindow | None = None
        """The session's newest `data_window` event (`data.watch`)."""
        self.last_eval: Eval | None = None
        self.gradient: Anomaly | None = None
        """The session's gradient watchdog trip (a `watchdog` event), if any."""
        self.restarts: list[Anomaly] = []
        """A `restarted` anomaly for each time torchrun's elastic agent restarted the run's workers (a run that
        goes on after a lost worker or node is one run with restarts, not a new one)."""
        self.elo_curve: collections.deque[EloPoint] = collections.deque(maxlen=ELO_CURVE_POINTS)
        """Each `match` event's result (runtime.match_every)."""
        self.elo_rebaselines: collections.deque[Rebaseline] = collections.deque(maxlen=ELO_CURVE_POINTS)
        """Each `warning` with `match_rebaseline`: the run's match reference was lost and the Elo curve's origin
        moved there."""
        self.last_checkpoint_event: CheckpointSaved | None = None
        self.stop_requested: StopRequested | None = None
        """The session's `stop_requested`: the trainer got its first stop signal and is stopping."""
        self.saved_bytes: dict[str, int] = {}
        """Checkpoint file name -> its size in its latest `checkpoint_saved` event (status cannot load a
        checkpoint, but it can tell one whose size has changed since it was written)."""
        self.warnings = 0
        self.last_warning: RunWarning | None = None
        self.events_read = 0
        self.recent_steps: collections.deque[tuple[float, int]] = collections.deque(maxlen=50)
        self.log_anomalies: dict[str, collections.deque[Anomaly]] = {r: collections.deque(maxlen=KEEP_PER_LOG_RULE)
                                                                     for r in LOG_RULES}
        self.log_counts: dict[str, int] = dict.fromkeys(LOG_RULES, 0)
        self.facts: ProcessFacts | None = None
        self.last_log_line: str | None = None
        self.state = "not started"
        self._process_reported: set[str] = set()
        self._files_reported: set[str] = set()
        self._keep_events = True
        self._quiet_initial = start == "end"
        self.events_rotated = False
        """events.jsonl lost its beginning under the run (truncated or replaced by log rotation): what is in
        it now does not begin with a `run_started`. Cleared by the next `run_started`."""
        self._first_event_pending = True
        """The next event read is the file's first: it tells whether the file begins with `run_started`."""
        events_start = 0
        size = file_size(self.events_path)
        if start in ("tail", "end") and size > EVENTS_TAIL_BYTES:
            events_start = line_start_at_or_after(self.events_path, size - EVENTS_TAIL_BYTES)
            head = first_event(self.events_path)
            self.events_rotated = head is not None and head.get("kind") != "run_started"
            self._first_event_pending = False
            found = self._session_start(events_start)
            if found is not None:
                self._feed_event(found)
        self.tail_read = events_start > 0
        self.events = EventReader(self.events_path, offset=events_start)
        self._events_restarts = 0
        log_start = self.record.log_offset if self.record else 0
        log_size = file_size(self.log_path)
        log_start = log_start if log_start <= log_size else 0  # a log replaced since the launch
        if start == "end":
            log_start = log_size
        elif log_size - log_start > LOG_TAIL_BYTES:
            log_start = log_size - LOG_TAIL_BYTES
        self.log = LogReader(self.log_path, line_start_at_or_after(self.log_path, log_start) if log_start else 0)

    def _session_start(self, tail_start: int) -> dict | None:
        """The latest session's `run_started` when it lies before the tail (a long session): right after
        the launch's recorded offset, or else searched for backwards."""
        record = self.record
        try:
            if record is not None:
                stat = self.events_path.stat()
                same_file = record.events_inode == stat.st_ino and record.events_offset <= stat.st_size
                found = find_first_run_started(self.events_path, record.events_offset if same_file else 0)
                if found is not None and (started := parse_event(found[1])) is not None and (
                        isinstance(started, RunStarted) and started.written_by(record.pid)):
                    return found[1] if found[0] < tail_start else None
            return find_last_run_started(self.events_path, tail_start)
        except OSError:
            return None  # replaced by something unreadable since its size was taken: the reader says what

    def _read_record(self) -> PidRecord | None:
        """train.pid's record; a broken one raises UserError, or, not strict, is a problem to report."""
        try:
            record = read_pid_record(self.run_dir)
        except UserError as exc:
            if self.strict_pid_file:
                raise
            self._pid_problem = str(exc).removeprefix(f"{self.run_dir / PID_FILE}: ")
            return None
        self._pid_problem = None
        return record

    # -- feeding --------------------------------------------------------------------------------
    def _feed_event(self, event: dict) -> list[Anomaly]:
        record = parse_event(event)
        self.events_read += 1
        self.last_event = event
        found: list[Anomaly] = []
        if self._first_event_pending:
            self._first_event_pending = False
            self.events_rotated = not isinstance(record, RunStarted)
        if isinstance(record, RunStarted):
            again = restarted(event)
            if again is None:
                self.restarts = []  # a new launch
            else:
                if self.terminal is not None and self.terminal.kind == "run_failed":
                    failure = run_failed(self.terminal.event)
                    if failure is not None:  # what the restart recovered from, which the new attempt clears
                        again = dataclasses.replace(again, message=f"{again.message}, after: {failure.message}",
                                                    evidence={**again.evidence, "after": failure.evidence})
                self.restarts.append(again)
                found.append(again)
            self.run_started, self.terminal, self.stop_requested = record, None, None
            self.gradient = None
            self.events_rotated = False
            self.recent_steps.clear()
            self.data_window = None
            self.loss.new_session()
        elif isinstance(record, Step):
            found += self.loss.observe(event)
            self.last_step = record
            if record.step is not None and record.time is not None:
                self.recent_steps.append((record.time, record.step))
        elif isinstance(record, Eval):
            self.last_eval = record
        elif isinstance(record, DataWindow):
            self.data_window = record
        elif isinstance(record, Watchdog):
            self.gradient = gradient(event)
            if self.gradient is not None:
                found.append(self.gradient)
        elif isinstance(record, Match) and record.step is not None:
            self.elo_curve.append(EloPoint(record.step, record.elo, record.elo_low, record.elo_high,
                                           record.reference_step))
        elif isinstance(record, StopRequested):
            self.stop_requested = record
        elif isinstance(record, CheckpointSaved):
            self.last_checkpoint_event = record
            if record.path is not None and record.bytes is not None:
                self.saved_bytes[Path(record.path).name] = record.bytes
        elif isinstance(record, RunWarning):
            self.warnings += 1
            self.last_warning = record
            if record.match_rebaseline and record.step is not None:
                self.elo_rebaselines.append(Rebaseline(record.step, record.old_reference_step, record.reference_step))
        elif isinstance(record, RunEnded):
            self.terminal = record
            failed = run_failed(event)
            if failed is not None:
                found.append(failed)
        return found

    def _feed_log(self, lines: list[tuple[int, str]], when: float) -> list[Anomaly]:
        found = []
        for _number, text in reversed(lines):
            if text.strip() and not text.startswith(LAUNCH_MARK):
                self.last_log_line = text.strip()
                break
        if self.scanner.idle and not LOG_SIGNAL.search("\n".join(text for _n, text in lines)):
            return found  # one regex pass over the batch instead of a scan line by line
        for number, text in lines:
            found += self.scanner.feed(number, text, when)
        return self._keep_log(found)

    def _keep_log(self, found: list[Anomaly]) -> list[Anomaly]:
        if found:
            base = self.log.line_base()
            found = [shift_lines(a, base) for a in found]
        for anomaly in found:
            self.log_anomalies[anomaly.rule].append(anomaly)
            self.log_counts[anomaly.rule] += 1
        return found

    def refresh(self, now: float | None = None, keep_events: bool = True) -> Update:
        """Ask about the process, then read what is new (in that order: a process that wrote its terminal
        event and exited between the two reads is seen as ended, never as vanished). `keep_events=False`:
        digest the events without returning them (status)."""
        self.record = self._read_record() or self.record
        update = Update()
        self._keep_events = keep_events
        read_before = self.events_read
        asked = self._ask_process()
        self._read_into(update)
        if self._launch() != asked:  # the events named a newer launch: ask about it, then read again
            self._ask_process()
            self._read_into(update)
        if self._quiet_initial:
            update, self._quiet_initial = Update(), False
        now = time.time() if now is None else now
        self.state, process_anomalies = self._classify(now)
        for anomaly in process_anomalies:
            if anomaly.rule not in self._process_reported:
                update.anomalies.append(anomaly)
        self._process_reported = {a.rule for a in process_anomalies}
        self._events_gone = self._events_file_gone(now, wrote_here=self.events_read > read_before)
        file_anomalies = self._file_anomalies(now)
        update.anomalies += [a for a in file_anomalies if a.message not in self._files_reported]
        self._files_reported = {a.message for a in file_anomalies}
        update.state = self.state
        return update

    def _ask_process(self) -> Launch | None:
        launch = self._launch()
        self.facts = process_facts(launch.pid) if launch and launch.host == this_host() else None
        return launch

    def _read_events(self) -> list[dict]:
        batch = self.events.read_new()
        if self.events.restarts != self._events_restarts:  # read again from its start: its first event
            self._events_restarts = self.events.restarts  # says whether it was rotated or is a new run's
            self._first_event_pending = True
        return batch

    def _read_into(self, update: Update) -> None:
        while batch := self._read_events():
            for event in batch:
                update.anomalies += self._feed_event(event)
            if self._keep_events:
                update.events += batch
        while lines := self.log.read_new():
            update.anomalies += self._feed_log(lines, file_mtime(self.log_path) or time.time())

    def finish_log(self) -> list[Anomaly]:
        """A traceback the log ends inside of (status reads once, so it reports it as it stands)."""
        return self._keep_log(self.scanner.flush(file_mtime(self.log_path) or 0.0))

    # -- judging --------------------------------------------------------------------------------
    def _launch(self) -> Launch | None:
        """The directory's latest run: train.pid's, unless a run_started names a newer one."""
        started, record = self.run_started, self.record
        if record is not None and (started is None or started.written_by(record.pid)
                                   or (started.time or 0.0) <= record.started_at + 1):
            return Launch(record.pid, record.host, record.start_time, None, record.started_at, record.start_ticks,
                          record.boot_id)
        if started is not None and started.pid is not None:
            when = started.time or 0.0
            return Launch(started.pid, started.host or "", None, when, when, started.start_ticks, started.boot_id)
        return None

    def session_is_launch(self) -> bool:
        """Is the session read the latest launch's own (not an earlier run's)? It is when the last
        `run_started` read is the launch's; or when events.jsonl was rotated under the run, taking that
        `run_started` with it, and what it holds now was written since the launch (one trainer at a time
        writes a run directory)."""
        launch, started = self._launch(), self.run_started
        if launch is None:
            return False
        if started is not None and started.written_by(launch.pid) and (
                (started.time or 0.0) >= launch.launched_at - 1):
            return True
        return self.run_started_rotated_away()

    def run_started_rotated_away(self) -> bool:
        """events.jsonl was rotated under the latest launch and no `run_started` of it is left to read."""
        launch, last = self._launch(), self.last_event
        if not self.events_rotated or launch is None or last is None:
            return False
        started = self.run_started
        if started is not None and started.written_by(launch.pid):
            return False  # its run_started was read (before the rotation): the usual case
        return float(last.get("time") or 0) >= launch.launched_at - 1

    def ended(self) -> bool:
        """Did the latest launch write its terminal event?"""
        if self.terminal is None:
            return False
        return self._launch() is None or self.session_is_launch()

    def stopping(self) -> StopRequested | None:
        """The `stop_requested` of the latest launch while it is still going: a stop is in progress, and
        another signal would add nothing (the trainer ignores a repeated SIGTERM)."""
        if self.stop_requested is None or self.ended() or not self.session_is_launch():
            return None
        return self.stop_requested

    def restart_pending(self) -> bool:
        """The latest attempt failed under torchrun's elastic agent, which lives and has restarts left: the job
        has not ended (a stop goes to the agent, which then ends it without the restart)."""
        return self.ended() and self.state == "running"

    def _restart_due(self) -> bool:
        """The attempt failed under torchrun's elastic agent with restarts left: the agent restarts it."""
        started, terminal = self.run_started, self.terminal
        if started is None or terminal is None or terminal.kind != "run_failed" or started.max_restarts is None:
            return False
        return (started.restart_count or 0) < started.max_restarts

    def last_output_time(self) -> float:
        times = [t for t in (file_mtime(self.events_path), file_mtime(self.log_path)) if t is not None]
        launch = self._launch()
        if launch is not None:
            times.append(launch.launched_at)
        return max(times) if times else 0.0

    def _classify(self, now: float) -> tuple[str, list[Anomaly]]:
        launch = self._launch()
        if launch is None:
            if self.terminal is not None:
                return ENDED_STATES[self.terminal.kind], []
            return ("unknown" if self.events_read else "not started"), []
        last = self.last_event if self.session_is_launch() else None
        gone = None if self.facts is None else vanished(
            self.facts, False, now, launch.start_time, launch.started_by, last, self.last_log_line,
            launch.start_ticks, launch.boot_id)
        if self.ended():
            assert self.terminal is not None
            if gone is None and self.facts is not None and self._restart_due():
                return "running", []  # torchrun's agent lives and will restart the workers: a restart, not the end
            return ENDED_STATES[self.terminal.kind], []
        if self.facts is None:
            return "unknown", []  # launched on another host: only the files can be read from here
        if gone is not None:
            holder = orphaned_holder(self.run_dir, launch.pid)
            if holder is not None:  # the agent died, its workers did not: the job trains on, out of reach
                stop = shlex.join(["python", "-m", "tideborn.tools.train_run", "stop", "--out-dir", str(self.run_dir)])
                return "running", [orphaned(launch.pid, holder.pid, stop, now)]
            return "vanished", [gone]
        quiet = stalled(self.facts, True, False, self.last_output_time(), now, self.thresholds)
        if quiet is not None:
            return "stalled", [quiet]
        return "running", []

    def _file_anomalies(self, now: float) -> list[Anomaly]:
        problems = ((EVENTS_FILE, self.events.problem), (LOG_FILE, self.log.problem), (PID_FILE, self._pid_problem),
                    ("the run directory", self._dir_problem))
        found = [run_file(name, problem, now) for name, problem in problems if problem]
        return found + ([self._events_gone] if self._events_gone is not None else [])

    def _events_file_gone(self, now: float, wrote_here: bool) -> Anomaly | None:
        """The live trainer appends its events somewhere readers do not look (events.jsonl moved or deleted
        under it): the `events_gone` rule, from what the OS says the trainer holds open (/proc), or, where it
        will not say, from events.jsonl missing while the trainer lives."""
        launch = self._launch()
        if launch is None or self.facts is None or self.state not in ("running", "stalled") or wrote_here:
            return None  # nothing live to ask about, or its new events just arrived in events.jsonl
        try:
            info = os.stat(self.events_path)
            here: tuple[int, int] | None = (info.st_dev, info.st_ino)
        except OSError:
            here = None
        known = {self.events.identity} - {None}
        pids = [launch.pid]
        started = self.run_started
        if started is not None and started.pid is not None and started.pid != launch.pid and self.session_is_launch():
            pids.append(started.pid)  # under torchrun, rank 0 (not torchrun, the launched pid) writes them
        answered = False
        for pid in pids:
            files = files_written(pid, EVENTS_FILE, known)
            if files is None:
                continue
            answered = True
            elsewhere = next((target for target, identity in files if identity != here), None)
            if elsewhere is not None:
                return events_gone(launch.pid, True, False, here is not None, elsewhere, now)
        if answered:
            return None  # it writes events.jsonl itself, or has not opened it yet (starting up)
        had_one = bool(known) or self.events_read > 0 or (self.record is not None and self.record.events_inode)
        return events_gone(launch.pid, True, False, here is not None or not had_one, None, now)

    def anomalies(self, now: float | None = None) -> list[Anomaly]:
        """Everything that looks wrong now (as of the last refresh)."""
        found = self._file_anomalies(time.time() if now is None else now)
        found += self.loss.current()
        if self.gradient is not None:
            found.append(self.gradient)
        if self.state == "failed" and self.terminal is not None:
            failed = run_failed(self.terminal.event)
            if failed is not None:
                found.append(failed)
        if self.state in ("running", "vanished", "stalled"):
            found += self._classify(time.time() if now is None else now)[1]
        found += self.restarts
        for rule in LOG_RULES:
            found += list(self.log_anomalies[rule])
        return found

    # -- reporting ------------------------------------------------------------------------------
    def status(self, now: float | None = None) -> RunStatus:
        """The status report (`status --json` prints its `to_json()`)."""
        now = time.time() if now is None else now
        launch, newest = self._launch(), self.last_step or NO_STEP
        lost_start = self.run_started_rotated_away()
        # The session's run_started went with a rotation: one read before it is an earlier run's.
        session = NO_RUN_STARTED if lost_start else self.run_started or NO_RUN_STARTED
        terminal = self.terminal if self.ended() else None
        step = _reached_step(newest, session, terminal)
        rate = self._steps_per_second()
        began = _session_began(session, launch, lost_start)
        checkpoint = self._checkpoint_on_disk(now)  # before the anomalies: it says whether the directory reads
        return RunStatus(
            run_dir=str(self.run_dir), state=self.state,
            pid=launch.pid if launch else None, host=launch.host if launch else None,
            pid_file=self.record is not None, launch_started=self.session_is_launch(),
            step=step, max_steps=session.max_steps, progress=step / session.max_steps if session.max_steps else None,
            loss=newest.losses() or None, loss_step=newest.step, lr=newest.lr, grad_norm=newest.grad_norm,
            positions_per_second=newest.positions_per_second,
            steps_per_second=rate, eta_seconds=self._eta(step, session.max_steps, rate),
            elapsed_seconds=_elapsed(terminal, began, now),
            session_started=began, resumed_from=session.resumed_from,
            last_checkpoint=checkpoint, last_eval=self.last_eval,
            resume_from=terminal.resume_from if terminal is not None else None,
            elo_curve=tuple(self.elo_curve), elo_rebaselines=tuple(self.elo_rebaselines),
            terminal=terminal,
            stop_requested=self.stopping() if self.state in ("running", "stalled") else None,
            warnings=WarningsSeen(self.warnings, self.last_warning.message if self.last_warning else None),
            last_event_time=self._last_event_time(),
            events_read=self.events_read, events_malformed=self.events.malformed,
            tail_only=self.tail_read, log_error_counts=self._log_error_counts(),
            events_rotated=self.events_rotated, run_started_missing=lost_start,
            anomalies=tuple(self.anomalies(now)),
            # Each restart seen (a membership change too, which torchrun does not count), at least torchrun's count
            # (the restarts before a tail-only read).
            restarts=max(len(self.restarts), session.restart_count or 0),
            world_size=session.world_size,
            data_window=self.data_window, waiting_for_data=self.waiting_for_data(),
        )

    def _eta(self, step: int, max_steps: int | None, rate: float | None) -> float | None:
        """Seconds to `max_steps` at the current rate, while the run is live."""
        if self.state not in ("running", "stalled") or not rate or max_steps is None:
            return None
        return (max_steps - step) / rate

    def _checkpoint_on_disk(self, now: float) -> CheckpointOnDisk | None:
        """The newest checkpoint file as it is now, and whether its size is the one it was saved at. A directory
        made unreadable to us since it was opened (another user's run) is a problem to report."""
        try:
            checkpoints = list_checkpoints(self.run_dir)
            self._dir_problem = None
        except PermissionError:
            checkpoints, self._dir_problem = [], f"permission denied ({whose(self.run_dir)})"
        if not checkpoints:
            return None
        ck_step, ck_path = checkpoints[-1]
        stat = ck_path.stat()
        saved = self.saved_bytes.get(ck_path.name)
        return CheckpointOnDisk(ck_step, str(ck_path), stat.st_size, now - stat.st_mtime, saved,
                                None if saved is None else saved != stat.st_size)

    def _log_error_counts(self) -> dict[str, int]:
        """Log rule -> the train.log lines it matched, rules that matched none left out."""
        return {rule: n for rule, n in self.log_counts.items() if n}

    def _last_event_time(self) -> float | None:
        """The newest event's time as written (JSON prints it as the event did); None where it has none (the
        reader's well_formed lets only a finite number through, but any event, of any writer, is the newest)."""
        last_time = (self.last_event or {}).get("time")
        return last_time if isinstance(last_time, (int, float)) else None

    def waiting_for_data(self) -> bool:
        """The live trainer's newest word on its data is that it waits (`data_window` with `waiting`), and no step
        has been trained since."""
        window = self.data_window
        if window is None or not window.waiting or self.state not in ("running", "stalled"):
            return False
        step = self.last_step
        return step is None or step.time is None or window.time is None or window.time >= step.time

    def _steps_per_second(self) -> float | None:
        if len(self.recent_steps) >= 2:
            (t0, s0), (t1, s1) = self.recent_steps[0], self.recent_steps[-1]
            if t1 > t0 and s1 > s0:
                return (s1 - s0) / (t1 - t0)
        pps = self.last_step.positions_per_second if self.last_step is not None else None
        batch = self.run_started.batch_size if self.run_started is not None else None
        if pps and batch is not None and batch > 0 and math.isfinite(pps):
            return pps / batch
        return None


def _elapsed(terminal: RunEnded | None, began: float | None, now: float) -> float | None:
    """The session's duration: as its terminal event says it, else from its start to that event, or to now."""
    if terminal is not None and terminal.elapsed_seconds is not None:
        return terminal.elapsed_seconds
    if terminal is not None and terminal.time is not None and began is not None:
        return terminal.time - began
    return now - began if began is not None else None


def _session_began(session: RunStarted, launch: Launch | None, lost_start: bool) -> float | None:
    """When the session began: its run_started's time, or its launch's where that went with a rotation (it is
    close)."""
    return launch.launched_at if lost_start and launch is not None else session.time


def _reached_step(newest: Step, session: RunStarted, terminal: RunEnded | None) -> int:
    """The furthest step the session's events tell of: its newest step event's, its run_started's, its end's."""
    return max([0, *(s for s in (newest.step, session.step, terminal and terminal.step) if s is not None)])
