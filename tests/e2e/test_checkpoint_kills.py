"""A trainer SIGKILLed at random moments never leaves a checkpoint that does not load (about 70 s)."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

from tests.helpers.common import (
    describe,
    events_of,
    settings_args,
    terminal_events,
    train,
    wait_until,
)
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir.layout import list_checkpoints, temp_checkpoints


def test_sigkill_at_random_moments_never_leaves_an_unloadable_checkpoint(tmp_path: Path, start_trainer) -> None:
    rng = random.Random(20240601)
    run_dir = tmp_path / "run"
    newest_step = None
    killed_mid_save = 0
    for attempt in range(KILLS):
        leftovers = [path.name for path in temp_checkpoints(run_dir)]
        seen = len(events_of(run_dir))
        trainer = start_trainer("train", *settings_args(run_dir, *KILL_SETS))

        def saved_in_this_run() -> bool:
            return any(e["kind"] == "checkpoint_saved" for e in events_of(run_dir)[seen:])

        wait_until(saved_in_this_run, trainer, "the first checkpoint of this run")
        if attempt % 2 == 0:
            # Aim for the middle of a save: kill as soon as a save's temp file shows up.
            wait_until(lambda: temp_checkpoints(run_dir), trainer, "a save in progress", timeout=60,
                       interval=0.001)
        else:
            time.sleep(rng.uniform(0.0, 0.3))
        trainer.send(signal.SIGKILL)
        assert trainer.wait() == -signal.SIGKILL
        killed_mid_save += bool(temp_checkpoints(run_dir))

        run = events_of(run_dir)[seen:]  # this attempt's events (its warnings come before run_started)
        started = next(e for e in run if e["kind"] == "run_started")
        if newest_step is None:
            assert started["resumed_from"] is None
        else:  # the killed run had resumed from the newest checkpoint the previous kill left
            assert started["resumed_from"] == str(run_dir / f"step-{newest_step:09d}.pt")
            assert started["step"] == newest_step
        warned = " ".join(e["message"] for e in run if e["kind"] == "warning")
        for name in leftovers:
            assert name in warned
        assert terminal_events(run) == []
        newest_step = assert_every_checkpoint_loads(run_dir)

    assert killed_mid_save >= 1, "no kill landed during a save; the test did not test what it says"

    leftovers = [path.name for path in temp_checkpoints(run_dir)]
    seen = len(events_of(run_dir))
    result = train(run_dir, *KILL_SETS, cwd=tmp_path, extra=["--stop-at-step", str(newest_step + 2)])
    run = events_of(run_dir)[seen:]
    started = next(e for e in run if e["kind"] == "run_started")
    assert started["resumed_from"] == str(run_dir / f"step-{newest_step:09d}.pt"), describe(result)
    assert [e["kind"] for e in terminal_events(run)] == ["run_stopped"] and run[-1]["step"] == newest_step + 2
    warned = " ".join(e["message"] for e in run if e["kind"] == "warning")
    assert all(name in warned for name in leftovers)
    assert temp_checkpoints(run_dir) == []
    assert assert_every_checkpoint_loads(run_dir) == newest_step + 2


KILL_SETS = ("model.value_hidden=2048", "optim.batch_size=16", "runtime.max_steps=100000",
             "runtime.checkpoint_every=1", "runtime.keep_checkpoints=3", "runtime.log_every=1",
             "runtime.progress=off")


KILLS = 5


def assert_every_checkpoint_loads(run_dir: Path) -> int:
    found = list_checkpoints(run_dir)
    assert found, "no checkpoint survived"
    for step, path in found:
        assert load_checkpoint(path)["step"] == step
    return found[-1][0]
