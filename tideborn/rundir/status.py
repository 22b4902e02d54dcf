"""A run's status as one typed value (`RunStatus`): what `RunTracker.status()` returns, what `train_run status`
prints in words (`report.status_text`) or as JSON (`to_json`), and what the monitor's header and run list show."""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass

from tideborn.rundir.anomaly import Anomaly
from tideborn.rundir.events import jsonable
from tideborn.rundir.kinds import DataWindow, Eval, RunEnded, StopRequested


@dataclass(frozen=True)
class CheckpointOnDisk:
    """The newest checkpoint file in the run directory, as it is now."""

    step: int
    path: str
    bytes: int
    age_seconds: float
    """Since its file was last written, as of the status."""
    saved_bytes: int | None
    """Its size in its latest `checkpoint_saved` event; None: no event seen for it."""
    changed_since_saved: bool | None
    """Its size differs from `saved_bytes` (cut short or replaced since it was saved); None: no event seen.
    Unusable and abandoned files are moved to archive/ by the next trainer; until then they show here."""


@dataclass(frozen=True)
class EloPoint:
    """One `match` result: the run's Elo at `step` against the checkpoint of `reference_step`."""

    step: int
    elo: float | None
    """+-inf at a 100% or 0% score; None if the event had no number."""
    elo_low: float | None
    elo_high: float | None
    reference_step: int | None

    def as_list(self) -> list:
        """`[step, elo, elo_low, elo_high, reference_step]`, as `status --json` lists it."""
        return [self.step, self.elo, self.elo_low, self.elo_high, self.reference_step]


@dataclass(frozen=True)
class Rebaseline:
    """A `match_rebaseline` warning: the match reference was lost at `step` and the Elo curve's origin moved."""

    step: int
    old_reference_step: int | None
    reference_step: int | None

    def as_list(self) -> list:
        return [self.step, self.old_reference_step, self.reference_step]


@dataclass(frozen=True)
class WarningsSeen:
    count: int
    last: str | None
    """The newest warning's message."""


@dataclass(frozen=True)
class RunStatus:
    """The status report of one run directory (docs/run-tools.md, `status --json`)."""

    run_dir: str
    state: str
    """One of `state.STATES`."""
    pid: int | None
    host: str | None
    pid_file: bool
    """train.pid is there (the run was started by `train_run start`)."""
    launch_started: bool
    """The session read is the latest launch's own (its `run_started` was read)."""
    step: int
    max_steps: int | None
    progress: float | None
    """step / max_steps."""
    loss: typing.Mapping[str, float] | None
    """The newest `step` event's losses (`loss`, `policy_loss`, `value_loss`: those it has)."""
    loss_step: int | None
    """The step of that event."""
    lr: float | None
    grad_norm: float | None
    positions_per_second: float | None
    steps_per_second: float | None
    eta_seconds: float | None
    elapsed_seconds: float | None
    session_started: float | None
    resumed_from: str | None
    last_checkpoint: CheckpointOnDisk | None
    last_eval: Eval | None
    resume_from: str | None
    """A run halted by divergence names its newest healthy checkpoint, what the next train resumes from."""
    elo_curve: tuple[EloPoint, ...]
    elo_rebaselines: tuple[Rebaseline, ...]
    terminal: RunEnded | None
    """The latest launch's terminal event, once it has written one."""
    stop_requested: StopRequested | None
    """A stop in progress (the trainer got its first stop signal); only while the run is running or stalled."""
    warnings: WarningsSeen
    last_event_time: float | None
    events_read: int
    events_malformed: int
    tail_only: bool
    """events.jsonl is long and only its tail was read."""
    log_error_counts: typing.Mapping[str, int]
    """Log rule -> lines of train.log it matched (rules with none left out)."""
    events_rotated: bool
    run_started_missing: bool
    anomalies: tuple[Anomaly, ...]
    restarts: int = 0
    """How many times torchrun's elastic agent has restarted the run's workers, after a failure or a change of nodes
    (one `restarted` anomaly each; at least torchrun's own count, which leaves out changes of nodes)."""
    world_size: int | None = None
    """The processes the latest attempt trains with."""
    data_window: DataWindow | None = None
    """`data.watch`: the session's newest `data_window` event (window size, arrival rate, newest file's age)."""
    waiting_for_data: bool = False
    """The live trainer waits for data (`data.window_min_positions`): no steps, and no anomaly either."""

    def to_json(self) -> dict:
        """Plain JSON data, as `status --json` prints it (non-finite numbers as "nan"/"inf"/"-inf")."""
        watched = {} if self.data_window is None else {  # only a watched run's (data.watch) status has them
            "data_window": self.data_window.public(), "waiting_for_data": self.waiting_for_data}
        return typing.cast(dict, jsonable({
            "run_dir": self.run_dir, "state": self.state, "pid": self.pid, "host": self.host,
            "pid_file": self.pid_file, "launch_started": self.launch_started,
            "step": self.step, "max_steps": self.max_steps, "progress": self.progress,
            "loss": dict(self.loss) if self.loss is not None else None,
            "loss_step": self.loss_step, "lr": self.lr, "grad_norm": self.grad_norm,
            "positions_per_second": self.positions_per_second,
            "steps_per_second": self.steps_per_second, "eta_seconds": self.eta_seconds,
            "elapsed_seconds": self.elapsed_seconds, "session_started": self.session_started,
            "resumed_from": self.resumed_from,
            "last_checkpoint": asdict(self.last_checkpoint) if self.last_checkpoint is not None else None,
            "last_eval": self.last_eval.public() if self.last_eval is not None else None,
            "resume_from": self.resume_from,
            "elo_curve": [point.as_list() for point in self.elo_curve],
            "elo_rebaselines": [point.as_list() for point in self.elo_rebaselines],
            "terminal": self.terminal.public() if self.terminal is not None else None,
            "stop_requested": self.stop_requested.public() if self.stop_requested is not None else None,
            "warnings": asdict(self.warnings),
            "last_event_time": self.last_event_time,
            "events_read": self.events_read, "events_malformed": self.events_malformed,
            "tail_only": self.tail_only, "log_error_counts": dict(self.log_error_counts),
            "events_rotated": self.events_rotated, "run_started_missing": self.run_started_missing,
            "anomalies": [a.to_dict() for a in self.anomalies],
            "restarts": self.restarts, "world_size": self.world_size,
            **watched,
        }))
