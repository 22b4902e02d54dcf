"""The training loop's side of `data.watch`: when to rescan the watched globs, the `data_window` events, and the
wait for data (`data.window_min_positions`) with a heartbeat, so that status and the monitor show the run
waiting rather than stalled. The files and the window themselves are `tideborn.data.training.watch`'s.
"""

from __future__ import annotations

import time
import typing
from pathlib import Path

from tideborn.rundir.kinds import DataWindow, RunWarning
from tideborn.trainer.duties import Interval

if typing.TYPE_CHECKING:
    from tideborn.data.training.batch import WindowControl

HEARTBEAT_SECONDS = 60.0
"""While waiting, a `data_window` event at least this often: far inside the 15 minutes that make a run stalled."""
POLL_SECONDS = 0.2
"""How often the wait looks at the stop request."""
NAMES_IN_EVENT = 20
"""Files named per list of a `data_window` event (the counts are always whole)."""


class WatchDuty:
    """Rescans every `data.rescan_seconds` (and when the loop asks, at each checkpoint) and says what changed.
    `window`: the data source's window (`BatchSource.window`)."""

    def __init__(self, window: WindowControl, events, progress, stop, resumed_from: Path | None,
                 step: typing.Callable[[], int], clock: typing.Callable[[], float] = time.monotonic,
                 sleep: typing.Callable[[float], None] = time.sleep):
        self.window, self.events, self.progress, self.stop, self.step = window, events, progress, stop, step
        self.clock, self.sleep = clock, sleep
        self.rescan_due = Interval(window.rescan_seconds, clock=clock)
        self.rescan_due.should_run()  # the start's own scan was the first
        self.heartbeat = Interval(HEARTBEAT_SECONDS, clock=clock)
        self.waiting_said = False
        self.growing_said: list[str] = []
        if resumed_from is not None:
            for path, why in window.resume_left:
                self._warn(f"data.watch: {path} left the window: {why}; it is not read again under that name")
            for old, new in window.resume_moved:
                self._say(f"data.watch: {old} moved to {new}; it keeps its place in the window")
            unseen = window.unseen_files()
            self._say(f"data.watch: resumed the window recorded in {resumed_from.name} ({window.joined_files} "
                      f"file(s), {window.window_positions:,} positions)"
                      + (f"; {len(unseen)} file(s) that arrived since join at the next rescan" if unseen else ""))
            self.window_event("resumed", arrived_since=len(unseen))
        elif window.first_scan is not None:
            self.report(window.first_scan, "start")

    def ready(self) -> bool:
        """Rescan when due; while the window is too small, wait (rescanning, with heartbeats) until it is not, or
        a stop is requested (False)."""
        if self.rescan_due.should_run():
            self.rescan()
        while self.window.waiting:
            if self.stop.reason is not None:
                return False
            if not self.waiting_said:
                self.waiting_said = True
                fields = self.window.window_fields()
                self._say(f"waiting for data: {fields['positions']:,} position(s) in the window, "
                          f"{max(1, fields['min_positions']):,} needed (data.window_min_positions)")
            if self.heartbeat.should_run():
                self.window_event("waiting")
            self.sleep(POLL_SECONDS)
            if self.rescan_due.should_run():
                self.rescan()
        if self.waiting_said:
            self.waiting_said = False
            self._say(f"data: {self.window.window_positions:,} positions in the window; training goes on")
        return True

    def rescan(self) -> None:
        self.report(self.window.rescan(), "rescan")

    def report(self, result, why: str) -> None:
        """A `data_window` event for a change (files joined, moved or left), a warning for each file that left,
        does not parse or copies a joined one, and a progress line."""
        for text in result.warnings():
            self._warn(text)
        growing_news = result.growing != self.growing_said
        self.growing_said = result.growing
        if result.changed or why == "start" or growing_news:
            self.window_event(why, joined=[j.path for j in result.joined][:NAMES_IN_EVENT],
                              joined_count=len(result.joined), left=[p for p, _ in result.left][:NAMES_IN_EVENT],
                              left_count=len(result.left), growing=result.growing[:NAMES_IN_EVENT],
                              moved=[new for _, new in result.moved][:NAMES_IN_EVENT])
            for text in result.notes():
                self._say(text)
            if result.joined:
                self._say(f"data.watch: {len(result.joined)} file(s) joined "
                          f"({sum(j.positions for j in result.joined):,} positions); the window holds "
                          f"{self.window.window_positions:,} positions")

    def window_event(self, why: str, **fields: object) -> None:
        self.events.emit(DataWindow, step=self.step(), reason=why,
                         **{"joined": [], "joined_count": 0, "left": [], "left_count": 0, "growing": [], "moved": [],
                            **fields},
                         **self.window.window_fields())

    def _warn(self, text: str) -> None:
        self.events.emit(RunWarning, step=self.step(), message=text)
        self.progress.message(f"warning: {text}")

    def _say(self, text: str) -> None:
        self.progress.message(text)
