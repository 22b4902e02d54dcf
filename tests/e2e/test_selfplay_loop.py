"""A real self-play loop: a producer process writes hcpe3 games into a directory (by rename and by slow appending)
while a trainer process watches it (`data.watch`) and exports weights for the engine (`runtime.export_every`).
The trainer waits for data first, takes each file in only once it is complete, keeps its window, resumes
exactly after a stop in the middle, and every `latest.onnx` a reader opens meanwhile loads in onnxruntime."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnxruntime
import torch

from tests.helpers.common import (
    REPO_ROOT,
    Trainer,
    child_env,
    copy_run,
    events_of,
    settings_args,
    step_events,
    terminal_events,
    train,
    wait_until,
)

FILES = 6
STOP_STEP = 13
POLL = 0.2
"""Seconds between looks at the events (each reads the whole file: often enough, without starving the trainer)."""
WINDOW = 300
MIN_POSITIONS = 200
RESCAN = 1.0
"""The trainer's rescan interval: well above the producer's 0.3 s between the appends of one file. A file still
being appended joins only if it stays unwritten for a whole interval (or two scans see it unchanged); with the
interval equal to that gap, a producer slowed by a busy machine can leave a file at a whole game long enough for
it to join, and the next append then makes it leave the window (a file left once, under load, in a run of this
test)."""
LOOP_SETS = ('data.kind="auto"', 'run.network=""', "model.blocks=1", "model.channels=8", "data.workers=0",
             "optim.batch_size=16", "runtime.log_every=1", "runtime.checkpoint_every=10", "runtime.keep_checkpoints=50",
             "runtime.progress=plain", "runtime.max_steps=100000", "runtime.export_every=25", "runtime.export_keep=2",
             "data.watch=true", f"data.rescan_seconds={RESCAN}", f"data.window_positions={WINDOW}",
             f"data.window_min_positions={MIN_POSITIONS}")


class LatestReader(threading.Thread):
    """Opens export/latest.onnx over and over, as an engine picking up new weights would, and loads each in
    onnxruntime; counts the loads and keeps every failure."""

    def __init__(self, run_dir: Path):
        super().__init__(daemon=True)
        self.latest = run_dir / "export" / "latest.onnx"
        self.loaded, self.failures = 0, []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                with open(self.latest, "rb") as handle:
                    model = handle.read()
            except FileNotFoundError:
                time.sleep(0.05)
                continue
            try:
                onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
                self.loaded += 1
            except Exception as exc:  # any failure to load is what the test reports
                self.failures.append(f"{len(model)} bytes: {exc}")
            time.sleep(0.05)


def _windows(run_dir: Path) -> list[dict]:
    return [e for e in events_of(run_dir) if e["kind"] == "data_window"]


def _joined(run_dir: Path) -> list[str]:
    return [Path(p).name for e in _windows(run_dir) for p in e["joined"]]


def test_a_trainer_inside_a_self_play_loop(tmp_path):
    folder, run_dir = tmp_path / "selfplay", tmp_path / "run"
    folder.mkdir()
    sets = (f"data.train=[{json.dumps(str(folder / '*.hcpe3'))}]", *LOOP_SETS)
    reader = LatestReader(run_dir)
    reader.start()
    producer = subprocess.Popen([sys.executable, "-m", "tests.helpers.selfplay", str(folder), "--files", str(FILES),
                                 "--games", "2", "--pause", "0.6", "--after", str(run_dir / "events.jsonl")],
                                cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    trainer = None
    try:
        # The first attempt, in this process (a process start saved), begins before any file is there, so it
        # waits; it stops in the middle, at a step, while the producer goes on writing.
        first = train(run_dir, *sets, cwd=tmp_path, extra=["--stop-at-step", str(STOP_STEP)])
        stopped = terminal_events(events_of(run_dir))[-1]
        assert stopped["kind"] == "run_stopped" and stopped["step"] == STOP_STEP, first.stdout
        at_stop = torch.load(stopped["checkpoint"], weights_only=True)["data_cursor"]
        copy = copy_run(run_dir, tmp_path / "copy")

        # resumed, as a real process, while the producer goes on: the checkpoint's window, then the files that
        # came meanwhile and come now, and weights for the engine
        trainer = Trainer(["train", *settings_args(run_dir, *sets)], cwd=tmp_path, log_dir=tmp_path / "logs")
        assert producer.wait(timeout=120) == 0, producer.stdout.read()
        wait_until(lambda: len(set(_joined(run_dir))) == FILES, trainer, "every file in", interval=POLL)
        wait_until(lambda: any(e["kind"] == "export" for e in events_of(run_dir)), trainer, "an export",
                   interval=POLL)
        trainer.send(signal.SIGTERM)
        assert trainer.wait() == 0, trainer.output()
    finally:
        reader.done.set()
        if trainer is not None:
            trainer.kill()
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    reader.join(timeout=30)
    stop_step = STOP_STEP
    events = events_of(run_dir)
    output = trainer.output()

    # waiting came first, with heartbeats: no step before the window held enough
    windows = [e for e in events if e["kind"] == "data_window"]
    first_step = next(e for e in events if e["kind"] == "step")
    assert any(e["waiting"] for e in windows if e["time"] < first_step["time"])
    assert all(e["positions"] >= MIN_POSITIONS for e in windows if e["reason"] == "rescan" and not e["waiting"])

    # joins: every file once, whole (its size in the window is its final size), none ever left; the slowly
    # appended ones were reported growing first
    joined = [Path(p).name for e in windows for p in e["joined"]]
    assert sorted(joined) == [f"game-{i:03d}.hcpe3" for i in range(FILES)]
    assert not [e for e in windows if e["left"]]
    growing = {Path(p).name for e in windows for p in e["growing"]}
    assert growing & {f"game-{i:03d}.hcpe3" for i in range(1, FILES, 2)}, windows
    final = torch.load(sorted(run_dir.glob("step-*.pt"))[-1], weights_only=True)["data_cursor"]["watch"]
    for entry in final["joined"]:
        assert entry["seen"]["size"] == os.path.getsize(entry["path"]), entry

    # the window: the newest WINDOW positions once there are more
    for e in windows:
        assert e["positions"] == min(WINDOW, e["joined_positions"]), e
    assert windows[-1]["positions"] == WINDOW

    # exact resume: the resumed attempt starts from the checkpoint's window and cursor, says so, and trains what an
    # independent resume of the same checkpoint trains, step for step, until its window next changes
    resumed = next(e for e in windows if e["reason"] == "resumed")
    assert resumed["positions"] == at_stop["records"] and resumed["generation"] == at_stop["watch"]["generation"]
    assert "data.watch: resumed the window recorded in" in output
    assert [e["reason"] for e in windows if e["time"] < resumed["time"]][:2] == ["start", "waiting"]
    later = [e for e in events if e["kind"] == "step" and e["step"] > stop_step]
    assert later[0]["step"] == stop_step + 1
    change = next((e["step"] for e in windows if e["time"] > resumed["time"] and e["joined_count"]), None)
    compared = [e for e in later if change is None or e["step"] <= change][:3]
    assert compared, f"the window changed before the resumed run's first step (at step {change})"
    train(copy, *sets, "data.rescan_seconds=3600", cwd=tmp_path, extra=["--stop-at-step", str(compared[-1]["step"])])
    replay = {e["step"]: e["loss"] for e in step_events(events_of(copy)) if e["step"] > stop_step}
    assert [replay[e["step"]] for e in compared] == [e["loss"] for e in compared]

    # the engine's weights: every latest.onnx opened during the run loaded
    assert reader.loaded >= 1 and not reader.failures, reader.failures
    assert [e for e in events if e["kind"] == "export"]
