"""Messages from the workers that follow a run to the UI, named for what happened.

Workers never touch widgets: they post these. A message that only carries the latest picture of
something (the run's status, a hardware sample, the runs of a folder) replaces an older one still in
the queue (`can_replace`), so a burst of writes costs one redraw, not one per write.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from tideborn.rundir.anomaly import Anomaly
from tideborn.rundir.status import RunStatus
from tideborn.tui.gpu import HardwareSample
from tideborn.tui.history import RunHistory
from tideborn.tui.plan import LaunchPlan


@dataclass(frozen=True)
class ListedRun:
    """One run of the picker's folder: its directory's name and its status."""

    name: str
    status: RunStatus


class _Latest(Message):
    """A picture that supersedes the previous one of its kind."""

    def can_replace(self, message: Message) -> bool:
        return type(message) is type(self)


class RunRefreshed(_Latest):
    """The run's status report (what `train_run status` prints), after a refresh at `checked_at`;
    `watch_problem`: why the directory is polled instead of watched, if it is; `gone`: the run directory was
    there and is no longer (removed or renamed)."""

    def __init__(self, status: RunStatus, checked_at: float | None = None, watch_problem: str = "",
                 gone: bool = False) -> None:
        super().__init__()
        self.status = status
        self.checked_at = checked_at
        self.watch_problem = watch_problem
        self.gone = gone


class RunAttached(Message):
    """The first look at the run directory has been posted (everything before this message)."""


class EventsArrived(Message):
    """New events, oldest first. `reset`: events.jsonl was replaced or truncated; forget the old ones."""

    def __init__(self, events: list[dict], reset: bool = False) -> None:
        super().__init__()
        self.events = events
        self.reset = reset


class HistoryLoaded(Message):
    """The events before the tail that was read first (a long run), folded into curves off the UI thread.
    `generation`: which reading of events.jsonl it belongs to (a replaced file makes it stale)."""

    def __init__(self, history: RunHistory, generation: int) -> None:
        super().__init__()
        self.history = history
        self.generation = generation


class HistoryProgressed(_Latest):
    def __init__(self, fraction: float) -> None:
        super().__init__()
        self.fraction = fraction


class AnomaliesFound(Message):
    """Anomalies that began. `initial`: found while attaching (already there, not news)."""

    def __init__(self, anomalies: list[Anomaly], initial: bool = False) -> None:
        super().__init__()
        self.anomalies = anomalies
        self.initial = initial


class LogLinesArrived(Message):
    """New lines of train.log as (line number, text, kind); kind is "error", "traceback" or "". `reset`:
    the log was truncated or replaced."""

    def __init__(self, lines: list[tuple[int, str, str]], reset: bool = False) -> None:
        super().__init__()
        self.lines = lines
        self.reset = reset


class HardwareSampled(_Latest):
    def __init__(self, sample: HardwareSample) -> None:
        super().__init__()
        self.sample = sample


class StartChecked(Message):
    """The start key's plan passed every check `start` makes; the question asks to go ahead."""

    def __init__(self, plan: LaunchPlan, question: str) -> None:
        super().__init__()
        self.plan = plan
        self.question = question


class RunLaunched(Message):
    def __init__(self, pid: int, run_dir: Path, outcome: str = "launched", step: int | None = None) -> None:
        super().__init__()
        self.pid = pid
        self.run_dir = run_dir
        self.outcome = outcome
        """`tideborn.tools.control.Launched.outcome`: "running", "starting", "ended" or "launched"."""
        self.step = step


class LaunchFailed(Message):
    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class StopSent(Message):
    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid


class StopFailed(Message):
    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class RunsListed(_Latest):
    """The runs of a folder, one status report each (the run picker)."""

    def __init__(self, runs: list[ListedRun]) -> None:
        super().__init__()
        self.runs = runs


class KeysDropped(Message):
    """Keys came faster than the monitor takes them (a flood): `count` were dropped since the last notice
    (tideborn.tui.driver)."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
