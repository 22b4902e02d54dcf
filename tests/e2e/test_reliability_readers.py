"""Readers under load: a writer appends thousands of events a second, some of them in two halves with a
pause between (a torn line that a reader may well catch mid-way), while every reader follows the file:
`EventReader`, `RunTracker` (what status and the TUI build on), the TUI's own run follower, and
`train_run watch` as a real process. Each must deliver every event exactly once, in order, and parse
each one exactly as written: every event carries a sequence number and a check string derived from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import pytest

from tests.helpers.common import REPO_ROOT, child_env
from tideborn.rundir.events import EventReader
from tideborn.rundir.layout import EVENTS_FILE
from tideborn.rundir.state import RunTracker

EVENTS = 15_000
TORN_EVERY = 97
WAIT_SECONDS = 600  # a reader that never sees the end fails the test; not a performance threshold

WRITER = r'''
import os, socket, sys, time
from tideborn.rundir.events import encode_event
path, count, torn_every, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, encode_event("run_started", {"step": 0, "pid": os.getpid(), "host": socket.gethostname(),
                                          "max_steps": count, "batch_size": 1, "seq": -1}))
while not os.path.exists(go):
    time.sleep(0.005)
started = time.perf_counter()
for seq in range(count):
    data = encode_event("step", {"step": seq + 1, "seq": seq, "check": f"{seq:08x}", "loss": 10.0 - seq * 1e-4,
                                 "policy_loss": 5.0, "value_loss": 0.5, "lr": 0.1, "padding": "x" * (seq % 200)})
    if seq % torn_every == 0:
        cut = 1 + seq % (len(data) - 1)
        os.write(fd, data[:cut])
        time.sleep(0.002)  # long enough for a reader to find the half line
        os.write(fd, data[cut:])
    else:
        os.write(fd, data)
    if seq % 5 == 4:
        time.sleep(0.001)  # a few thousand events a second, not one burst
os.write(fd, encode_event("run_finished", {"step": count, "seq": count, "checkpoint": None}))
print(f"{count / (time.perf_counter() - started):.0f} events/s", flush=True)
'''


def expected_ok(events: list[dict]) -> None:
    """Every event, once, in order, fields as written."""
    seqs = [e.get("seq") for e in events]
    assert seqs == list(range(-1, EVENTS + 1)), f"{len(seqs)} events; first wrong at {_first_wrong(seqs)}"
    for event in events[1:-1]:
        assert event["kind"] == "step" and event["step"] == event["seq"] + 1
        assert event["check"] == f"{event['seq']:08x}" and event["padding"] == "x" * (event["seq"] % 200)
    assert events[0]["kind"] == "run_started" and events[-1]["kind"] == "run_finished"


def _first_wrong(seqs: list) -> int | None:
    return next((i for i, s in enumerate(seqs) if s != i - 1), None)


class Follower(threading.Thread):
    """Calls `read` until it returns the run_finished event; keeps everything it returned."""

    def __init__(self, name: str, read: typing.Callable[[], list[dict]], check: typing.Callable[[], None]):
        super().__init__(name=name, daemon=True)
        self.read, self.check = read, check
        self.events: list[dict] = []
        self.reads = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        try:
            while time.monotonic() < deadline:
                batch = self.read()
                self.reads += 1
                self.events += batch
                self.check()
                if any(e.get("kind") == "run_finished" for e in batch):
                    return
                time.sleep(0.001)
            raise TimeoutError(f"{self.name} never saw run_finished ({len(self.events)} events)")
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc


def test_every_reader_gets_every_event_exactly_once_under_a_fast_writer_with_torn_lines(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path, go = run_dir / EVENTS_FILE, tmp_path / "go"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(EVENTS), str(TORN_EVERY), str(go)],
                              cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, text=True)
    watch = None
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not path.exists() or not path.read_bytes().endswith(b"\n"):
            assert time.monotonic() < deadline and writer.poll() is None, "the writer did not start"
            time.sleep(0.01)

        reader = EventReader(path)
        tracker = RunTracker(run_dir, start="beginning")
        statuses = []

        def tracker_read() -> list[dict]:
            events = tracker.refresh().events
            statuses.append(tracker.status().to_json())
            return events

        def tracker_check() -> None:
            assert tracker.events.malformed == 0 and statuses[-1]["events_malformed"] == 0

        followers = [Follower("EventReader", reader.read_new, lambda: None),
                     Follower("RunTracker", tracker_read, tracker_check)]
        try:
            from tideborn.tui.follow import RunFollower
            from tideborn.tui.messages import EventsArrived
        except ImportError as exc:  # the TUI is built alongside; RunTracker above is what it reads through
            pytest.fail(f"the TUI's run follower cannot be imported: {exc}")
        follower = RunFollower(run_dir, use_nvml=False)

        def tui_read() -> list[dict]:
            return [e for m in follower.poll() if isinstance(m, EventsArrived) for e in m.events]

        followers.append(Follower("tideborn.tui.follow.RunFollower", tui_read,
                                  lambda: follower.tracker.events.malformed == 0 or pytest.fail("malformed")))
        watch = subprocess.Popen([sys.executable, "-m", "tideborn.tools.train_run", "watch", "--out-dir", str(run_dir)],
                                 cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        for thread in followers:
            thread.start()
        go.touch()

        watched, watch_err = watch.communicate(timeout=WAIT_SECONDS)
        rate, _ = writer.communicate(timeout=WAIT_SECONDS)
        for thread in followers:
            thread.join(WAIT_SECONDS)
            assert thread.error is None, f"{thread.name}: {thread.error!r}"
            expected_ok(thread.events)
        assert reader.malformed == 0
        assert watch.returncode == 0, watch_err
        expected_ok([json.loads(line) for line in watched.splitlines()])
        assert statuses[-1]["state"] == "finished" and statuses[-1]["step"] == EVENTS
        print(f"\nwriter: {rate.strip()}; reads: " + ", ".join(f"{t.name} {t.reads}" for t in followers))
    finally:
        for process in (writer, watch):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
