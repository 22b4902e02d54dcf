"""Stopping a run with signals: one SIGTERM finishes the step, checkpoints and stops cleanly; a second
Ctrl-C outside a save ends the process at once. (A repeated signal during a save, and a repeated
SIGTERM at any time: tests/e2e/test_reliability_stop.py.)"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.helpers.common import events_of, settings_args, step_events, terminal_events, wait_until
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir import list_checkpoints

LONG_RUN = ("runtime.max_steps=100000", "runtime.log_every=1", "runtime.checkpoint_every=100000",
            "runtime.progress=plain")


def test_sigterm_checkpoints_the_step_it_stopped_on_and_exits_0(tmp_path: Path, start_trainer) -> None:
    run_dir = tmp_path / "run"
    trainer = start_trainer("train", *settings_args(run_dir, *LONG_RUN, "optim.batch_size=16"))
    wait_until(lambda: step_events(events_of(run_dir)), trainer, "the first step event")

    trainer.send(signal.SIGTERM)

    assert trainer.wait() == 0, trainer.output()
    events = events_of(run_dir)
    last = events[-1]
    assert last["kind"] == "run_stopped" and last["reason"] == "SIGTERM"
    assert terminal_events(events) == [last]
    stopped_at = last["step"]
    assert step_events(events)[-1]["step"] == stopped_at  # the stop step is logged too
    checkpoint = run_dir / f"step-{stopped_at:09d}.pt"
    assert last["checkpoint"] == str(checkpoint)
    assert list_checkpoints(run_dir) == [(stopped_at, checkpoint)]
    assert load_checkpoint(checkpoint)["step"] == stopped_at
    assert f"stopped (SIGTERM) at step {stopped_at}" in trainer.stdout_path.read_text()


def test_a_second_ctrl_c_outside_a_save_ends_the_run_at_once(tmp_path: Path, start_trainer) -> None:
    run_dir = tmp_path / "run"
    # Big slow steps (3 s or more each, in many small micro-batches): a graceful stop would have to finish
    # one, log it and checkpoint, so cutting it short is visible in what the run leaves behind.
    trainer = start_trainer("train", *settings_args(run_dir, *LONG_RUN, "optim.batch_size=8192",
                                                    "optim.accumulation_steps=32"))
    wait_until(lambda: step_events(events_of(run_dir)), trainer, "the first step event")
    # Inside the second step: a Ctrl-C that lands between the first step's event and the trainer's look at the
    # stop flag stops at that step's end, with a save (another test's case), as one did on a busy machine.
    time.sleep(1.0)

    trainer.send(signal.SIGINT)
    wait_until(lambda: "stop_requested" in [e["kind"] for e in events_of(run_dir)], trainer,
               "the first Ctrl-C to be handled")  # far sooner than the step in progress ends
    trainer.send(signal.SIGINT)

    assert trainer.wait() == -signal.SIGINT, trainer.output()
    events = events_of(run_dir)
    assert terminal_events(events) == []
    assert [e["step"] for e in step_events(events)] == [1]  # the step in progress was not finished
    assert list_checkpoints(run_dir) == []
