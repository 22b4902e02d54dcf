"""Following one run directory from a worker thread: each `poll` reads what is new (events from their
byte offset through `RunTracker`, train.log from its offset, the process, the hardware) and returns
the messages the UI should get. `follow` is the loop: woken by `watchfiles`, with a slow poll when
the directory cannot be watched (or does not exist yet). Nothing here touches a widget.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import typing
from pathlib import Path

from tideborn.rundir.anomaly import AnomalyThresholds, LogScanner, match_log_line
from tideborn.rundir.files import LogReader, file_size, line_start_at_or_after, this_host
from tideborn.rundir.layout import EVENTS_FILE, LOG_FILE
from tideborn.rundir.state import RunTracker
from tideborn.rundir.status import RunStatus
from tideborn.tui.gpu import HardwareSample, NvmlProbe, ProcessProbe, devices_from_event
from tideborn.tui.messages import (
    AnomaliesFound,
    EventsArrived,
    HardwareSampled,
    LogLinesArrived,
    RunAttached,
    RunRefreshed,
)

LOG_TAIL_BYTES = 128 * 1024
"""The log pane starts with at most this much of train.log's end."""
LOG_TAIL_LINES = 500
HARDWARE_SECONDS = 2.0
WAKE_MILLISECONDS = 1000
"""Without file changes, poll at least this often: a process that died or hung changes no file."""
FALLBACK_POLL_SECONDS = 2.0
WATCH_QUIET_MILLISECONDS = 200
WATCH_DEBOUNCE_MILLISECONDS = 1000
"""A lone write is read after 200 ms of quiet; a stream of them (a fast trainer) once a second."""
_VOLATILE = ("elapsed_seconds", "last_event_time")


class RunFollower:
    def __init__(self, run_dir: Path, thresholds: AnomalyThresholds | None = None,
                 clock: typing.Callable[[], float] = time.time, use_nvml: bool = True):
        self.run_dir = Path(run_dir)
        self.clock = clock
        self.thresholds = thresholds or AnomalyThresholds()
        # A broken train.pid is shown as an anomaly: the dashboard keeps running (status exits 2 instead).
        self.tracker = RunTracker(self.run_dir, self.thresholds, start="tail", strict_pid_file=False)
        self.tail_start = self.tracker.events.offset
        """events.jsonl before this offset was not read: the history loader reads it."""
        self.events_path, self.log_path = self.run_dir / EVENTS_FILE, self.run_dir / LOG_FILE
        self._events_restarts = 0
        size = file_size(self.log_path)
        start = line_start_at_or_after(self.log_path, size - LOG_TAIL_BYTES) if size > LOG_TAIL_BYTES else 0
        self.log = LogReader(self.log_path, start)
        self._log_restarts = 0
        self._scanner = LogScanner()
        self._use_nvml = use_nvml
        self._nvml: NvmlProbe | None = None
        self._process = ProcessProbe()
        self._last_gpu_event: dict | None = None
        self._next_hardware = 0.0
        self._last_status: dict | None = None
        self._last_pid: tuple[int | None, str | None] = (None, None)
        """The pid and host of the newest status (what the hardware sample looks at)."""
        self._last_hardware: HardwareSample | None = None
        self.polls = 0
        self.watch_problem = ""
        """Why the directory is polled instead of watched, if it is."""
        self._seen_dir = False
        self.gone = False
        """The run directory was there and is no longer (removed, or renamed: nothing tells which)."""

    def poll(self) -> list:
        messages: list = []
        now = self.clock()
        update = self.tracker.refresh(now=now)
        # replaced, shrunk or rewritten (the reader compares the file's first bytes, not only its size)
        reset = self.tracker.events.restarts != self._events_restarts
        self._events_restarts = self.tracker.events.restarts
        if update.events or reset:
            for event in update.events:
                if event.get("kind") == "gpu":
                    self._last_gpu_event = event
            messages.append(EventsArrived(update.events, reset=reset))
        if update.anomalies:
            messages.append(AnomaliesFound(update.anomalies, initial=self.polls == 0))
        messages += self._read_log()
        self.gone = self._dir_gone()
        status = self.tracker.status(now)
        if self._changed(status):
            messages.append(RunRefreshed(status, now, self.watch_problem, self.gone))
        if now >= self._next_hardware:
            self._next_hardware = now + HARDWARE_SECONDS
            sample = self.hardware(now)
            if self._last_hardware is None or dataclasses.replace(sample, time=0) != dataclasses.replace(
                    self._last_hardware, time=0):
                messages.append(HardwareSampled(sample))
            self._last_hardware = sample
        self.polls += 1
        return messages

    def _changed(self, status: RunStatus) -> bool:
        # Compared as JSON, where a NaN loss is "nan" and equal to itself; the ages and times that tick with
        # the clock alone (the header ages them itself) do not count, nor does a watch_problem's absence.
        key = status.to_json()
        for name in _VOLATILE:
            key.pop(name, None)
        if isinstance(key.get("last_checkpoint"), dict):
            key["last_checkpoint"].pop("age_seconds", None)
        key["watch_problem"] = self.watch_problem
        key["gone"] = self.gone
        if key == self._last_status:
            return False
        self._last_status, self._last_pid = key, (status.pid, status.host)
        return True

    def _dir_gone(self) -> bool:
        """Has the run directory gone since it was seen? Its files were read before, so the status still
        reads as it was (FINISHED); the header must say the directory is gone instead. A directory made
        again under the name (a new run) is followed as a new one would be."""
        try:
            present = os.path.isdir(self.run_dir)
        except OSError:  # a parent made unreadable: the directory cannot be reached either
            present = False
        self._seen_dir = self._seen_dir or present
        return self._seen_dir and not present

    def _read_log(self) -> list:
        reset = False
        lines: list[tuple[int, str, str]] = []
        while True:
            batch = self.log.read_new()
            if self.log.restarts != self._log_restarts:  # read again from its start: drop what came before
                self._log_restarts, reset, lines = self.log.restarts, True, []
                self._scanner = LogScanner()
            if not batch:
                break
            for number, text in batch:
                self._scanner.feed(number, text)
                kind = "error" if match_log_line(text) else ("traceback" if not self._scanner.idle else "")
                lines.append((number, text, kind))
        if self.polls == 0:
            lines = lines[-LOG_TAIL_LINES:]
        return [LogLinesArrived(lines, reset=reset)] if lines or reset else []

    def hardware(self, now: float) -> HardwareSample:
        started = self.tracker.run_started
        device = (started.device if started is not None else None) or ""
        settings = started.settings if started is not None else None
        runtime = settings.get("runtime") if settings is not None else None  # a hand-edited event may hold anything
        runtime = runtime if isinstance(runtime, dict) else {}
        cpu_run: bool | None = None
        if device or runtime.get("device"):
            cpu_run = (device or str(runtime.get("device"))).startswith("cpu")
        pid, host = self._last_pid
        local = host == this_host()
        record = self.tracker.record
        identity = record.identity() if record is not None and record.pid == pid else None
        process = self._process.sample(pid, identity) if local and isinstance(pid, int) else None
        gpu_event = self._last_gpu_event or {}
        sample = HardwareSample(now, cpu_run=cpu_run, process=process,
                                torch_peak_memory_bytes=gpu_event.get("torch_peak_memory_bytes"),
                                torch_memory_allocated_bytes=gpu_event.get("torch_memory_allocated_bytes"),
                                event_time=gpu_event.get("time"))
        if cpu_run:
            return sample
        if self._use_nvml and (local or pid is None):
            if self._nvml is None:
                self._nvml = NvmlProbe()
            devices = self._nvml.sample({pid} if isinstance(pid, int) else set())
            if devices:
                return dataclasses.replace(sample, devices=devices, source="nvml")
        if gpu_event:
            return dataclasses.replace(sample, devices=devices_from_event(gpu_event), source="events")
        why = self._nvml.reason if self._nvml is not None and not self._nvml.available else ""
        if not local and host:
            why = f"the run is on host {host}; no gpu events yet"
        return dataclasses.replace(sample, note=why)

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


def follow(follower: RunFollower, post: typing.Callable[[object], None], stop: threading.Event) -> None:
    """Poll now, then whenever the directory changes (and at least every WAKE_MILLISECONDS), until
    `stop` is set. The directory may not exist yet (a run about to be launched): poll slowly until it does."""
    import watchfiles  # only the following thread needs it

    def send() -> None:
        for message in follower.poll():
            post(message)

    send()
    post(RunAttached())
    try:
        while not stop.is_set():
            if not follower.run_dir.is_dir():
                stop.wait(FALLBACK_POLL_SECONDS / 2)
                send()
                continue
            try:
                for _changes in watchfiles.watch(follower.run_dir, watch_filter=None, recursive=False,
                                                 debounce=WATCH_DEBOUNCE_MILLISECONDS, step=WATCH_QUIET_MILLISECONDS,
                                                 stop_event=stop, rust_timeout=WAKE_MILLISECONDS,
                                                 yield_on_timeout=True):
                    send()
                    if not follower.run_dir.is_dir():
                        break
            except (OSError, RuntimeError) as exc:
                # inotify limits, a directory removed under the watcher: poll slowly instead (and say so)
                follower.watch_problem = str(exc) or type(exc).__name__
                stop.wait(FALLBACK_POLL_SECONDS)
                send()
    finally:
        follower.close()
