"""When the training loop's periodic duties are due (tideborn/trainer/duties.py), and what the metrics window
reports (tideborn/trainer/metrics.py): asked directly, without training, and then of one short run, whose events
land where the duties say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from tideborn.config.schema import RuntimeSettings
from tideborn.rundir.events import read_events
from tideborn.rundir.layout import EVENTS_FILE
from tideborn.trainer.cli import main
from tideborn.trainer.duties import Duties, Every, Horizon, Interval, Once
from tideborn.trainer.metrics import MetricsWindow
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.state import StepResult


def due_steps(duty: Every, horizon: Horizon, start: int = 0) -> list[int]:
    """The steps an attempt starting at `start` runs `duty` at, as the loop asks it: after each step, until the
    horizon is reached."""
    steps, step = [], start
    while not horizon.reached(step):
        step += 1
        if duty.should_run(step, horizon.is_final(step)):
            steps.append(step)
    return steps


def duties(stop_at_step: int | None = None, *, evaluating: bool = True, main: bool = True, cuda: bool = False,
           clock=lambda: 0.0, **runtime: object) -> Duties:
    return Duties.of(RuntimeSettings(**runtime), stop_at_step, evaluating=evaluating, main=main, cuda=cuda,
                     clock=clock)


def test_a_cadence_is_due_at_its_multiples_and_at_the_final_step():
    assert due_steps(Every(10, at_final=True), Horizon(35)) == [10, 20, 30, 35]
    assert due_steps(Every(10, at_final=True), Horizon(30)) == [10, 20, 30]  # the final multiple counts once
    assert due_steps(Every(10), Horizon(35)) == [10, 20, 30]
    assert due_steps(Every(1, at_final=True), Horizon(3)) == [1, 2, 3]


def test_stop_at_step_is_a_final_step_and_ends_the_attempt():
    horizon = Horizon(100, stop_at_step=37)
    assert due_steps(Every(10, at_final=True), horizon) == [10, 20, 30, 37]
    assert horizon.is_final(37) and horizon.is_final(100) and not horizon.is_final(36)
    assert horizon.reached(37) and not horizon.finished(37)  # the attempt ends there, the run does not
    assert horizon.finished(100) and horizon.reached(100)


def test_a_resumed_attempt_keeps_the_cadence_of_the_absolute_step():
    # Resumed from step 7 (a stop between two logs): due at 10 and 15, as the run it continues, not at 8 or 12.
    assert due_steps(Every(5, at_final=True), Horizon(23), start=7) == [10, 15, 20, 23]
    assert due_steps(Every(5, at_final=True), Horizon(23, stop_at_step=12), start=7) == [10, 12]
    # Resumed at a multiple: that step was the previous attempt's; this one starts after it.
    assert due_steps(Every(5, at_final=True), Horizon(20), start=10) == [15, 20]


def test_a_duty_that_is_off_is_never_due():
    assert due_steps(Every(), Horizon(50, stop_at_step=20)) == []


def test_the_runtime_settings_give_each_duty_its_cadence():
    d = duties(max_steps=25, log_every=2, eval_every=10, checkpoint_every=10, match_every=20)
    assert due_steps(d.log, d.horizon) == [*range(2, 25, 2), 25]
    assert due_steps(d.evaluate, d.horizon) == [10, 20, 25]
    assert due_steps(d.checkpoint, d.horizon) == [10, 20, 25]
    # A match plays the checkpoint just saved, at its own multiples only: the final save (25) is not matched.
    assert due_steps(d.match, d.horizon) == [20]
    assert d.keep_reference


def test_a_run_stopped_at_a_step_ends_with_a_log_an_evaluation_and_a_checkpoint():
    d = duties(37, max_steps=100, log_every=10, eval_every=50, checkpoint_every=20)
    assert due_steps(d.log, d.horizon) == [10, 20, 30, 37]
    assert due_steps(d.evaluate, d.horizon) == [37]
    assert due_steps(d.checkpoint, d.horizon) == [20, 37]


def test_duties_for_rank_0_alone_or_turned_off_are_never_due():
    off = duties(max_steps=30, checkpoint_every=10, match_every=10, export_onnx=True, evaluating=False, main=False,
                 cuda=True)
    assert due_steps(off.evaluate, off.horizon) == []  # no held-out data on this rank
    assert due_steps(off.match, off.horizon) == []
    assert not off.keep_reference
    assert not off.export.should_run(30, final=True)
    assert not off.gpu.should_run()
    plain = duties(max_steps=30, checkpoint_every=10)
    assert due_steps(plain.match, plain.horizon) == [] and not plain.keep_reference
    assert not plain.export.should_run(30, final=True)
    assert not plain.gpu.should_run()  # not on CUDA
    assert not plain.compile_report.should_run()
    # A named reference is the user's file: the run keeps none of its own.
    named = duties(max_steps=30, checkpoint_every=10, match_every=10, match_reference="ref.pt")
    assert due_steps(named.match, named.horizon) == [10, 20, 30] and not named.keep_reference


def test_export_is_due_when_the_run_finishes_not_before():
    d = duties(max_steps=30, export_onnx=True)
    assert due_steps(d.export, d.horizon) == [30]
    assert not d.export.should_run(30, final=False)


def test_gpu_events_are_due_at_once_then_by_the_clock():
    now = [100.0]
    d = duties(max_steps=30, gpu_event_seconds=10.0, cuda=True, clock=lambda: now[0])
    assert d.gpu.should_run()  # the first step reports the GPUs
    now[0] = 109.9
    assert not d.gpu.should_run()
    now[0] = 110.0
    assert d.gpu.should_run()
    now[0] = 115.0
    assert not d.gpu.should_run()  # the interval counts from the last report
    now[0] = 200.0
    assert d.gpu.should_run() and not d.gpu.should_run()


def test_interval_and_once_by_themselves():
    assert not Interval(1.0, enabled=False, clock=lambda: 0.0).should_run()
    once = Once(True)
    assert [once.should_run() for _ in range(3)] == [True, False, False]
    assert not Once(False).should_run()
    compiled = duties(max_steps=30, compile=True)
    assert compiled.compile_report.should_run() and not compiled.compile_report.should_run()


def _result(loss: float, norm: float, wait: float = 0.5, lr: float = 0.01) -> StepResult:
    return StepResult(torch.tensor([loss, loss / 2, loss / 4]), torch.tensor(norm), wait, lr)


def test_the_metrics_window_reads_back_as_the_step_event_and_starts_afresh():
    now = [10.0]
    window = MetricsWindow(torch.device("cpu"), DistEnv(), batch_size=8, value_lambda=lambda step: step / 100,
                           clock=lambda: now[0])
    window.add(_result(2.0, 1.0, lr=0.02))
    window.add(_result(4.0, math.nan, lr=0.01))
    assert window.finite_on_every_rank()  # the losses are finite; a NaN norm is the watchdog's to judge
    now[0] = 14.0
    read = window.read(12)
    record = read.record
    assert list(record) == ["step", "loss", "policy_loss", "value_loss", "grad_norm", "grad_norm_max", "grad_norms",
                            "lr", "positions_per_second", "data_wait_seconds", "compute_seconds", "steps",
                            "value_lambda"]
    assert record["step"] == 12 and record["steps"] == 2 and record["lr"] == 0.01
    assert record["loss"] == 3.0 and record["policy_loss"] == 1.5 and record["value_loss"] == 0.75
    assert math.isnan(record["grad_norm_max"])  # a NaN counts as the largest norm
    assert record["grad_norms"][0] == 1.0 and math.isnan(record["grad_norms"][1])
    assert record["positions_per_second"] == 2 * 8 / 4.0
    assert record["data_wait_seconds"] == 1.0 and record["compute_seconds"] == 3.0
    assert record["value_lambda"] == 0.12
    assert read.means[:3] == [3.0, 1.5, 0.75] and read.seconds == 4.0
    now[0] = 20.0
    window.reset()
    assert window.steps == 0 and window.norms == [] and float(window.sums.abs().sum()) == 0.0
    assert window.finite_on_every_rank()  # an empty window has no loss to be non-finite
    window.add(_result(1.0, 0.5))
    now[0] = 21.0
    again = window.read(13).record
    assert again["steps"] == 1 and again["loss"] == 1.0 and again["compute_seconds"] == 0.5  # timed from reset


def test_a_non_finite_loss_makes_the_window_unfinite():
    window = MetricsWindow(torch.device("cpu"), DistEnv(), batch_size=8)
    window.add(_result(1.0, 1.0))
    assert window.finite_on_every_rank()
    window.add(_result(math.inf, 1.0))
    assert not window.finite_on_every_rank()
    assert "value_lambda" not in window.read(2).record


# A tiny synthetic run, written out here so that the test needs no file of the repository.
TINY_RUN = """
[run]
network = "resnet2x32"
[data]
kind = "synthetic"
[optim]
batch_size = 8
optimizer = "sgd"
[runtime]
device = "cpu"
progress = "off"
max_steps = 11
log_every = 2
checkpoint_every = 4
keep_checkpoints = 10
"""


def test_a_stopped_and_resumed_run_logs_and_saves_where_its_duties_say(tmp_path: Path):
    config, run_dir = tmp_path / "tiny.toml", tmp_path / "run"
    config.write_text(TINY_RUN)
    train = ["train", "--config", str(config), "--set", f"runtime.out_dir={json.dumps(str(run_dir))}"]
    assert main([*train, "--stop-at-step", "5"]) == 0  # 5: a multiple of neither cadence
    assert main(train) == 0  # resumes from step 5's checkpoint, to max_steps
    events = read_events(run_dir / EVENTS_FILE)
    attempts: list[list[dict]] = []
    for event in events:
        if event["kind"] == "run_started":
            attempts.append([])
        attempts[-1].append(event)
    assert [attempt[-1]["kind"] for attempt in attempts] == ["run_stopped", "run_finished"]
    for attempt, (start, stop_at_step) in zip(attempts, [(0, 5), (5, None)]):
        d = duties(stop_at_step, max_steps=11, log_every=2, checkpoint_every=4)
        assert [e["step"] for e in attempt if e["kind"] == "step"] == due_steps(d.log, d.horizon, start)
        saved = [e["step"] for e in attempt if e["kind"] == "checkpoint_saved"]
        assert saved == due_steps(d.checkpoint, d.horizon, start)
    assert [e["step"] for e in attempts[0] if e["kind"] == "step"] == [2, 4, 5]
    assert [e["step"] for e in attempts[1] if e["kind"] == "step"] == [6, 8, 10, 11]
    assert [e["step"] for e in events if e["kind"] == "checkpoint_saved"] == [4, 5, 8, 11]
