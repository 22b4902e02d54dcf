"""Soak: repeated start / stop / resume cycles through `python -m tideborn.tools.train_run`, with an
occasional SIGKILL in place of the stop, checking the invariants after every cycle:

- a stopped run wrote `run_stopped` and a loadable checkpoint of the step it stopped at, and `status`
  says `stopped`; a killed one is `vanished`, and nothing in its events claims it ended;
- each start resumes from the newest checkpoint (exactly the stop step after a stop), having lost at most
  `checkpoint_every` steps after a kill; steps never go backwards within an attempt; no temp file stays;
- at the end the weights equal those of one uninterrupted run to the same step (bit for bit, CPU).

The short version (about 30 s) runs by default and in CI; the long one (`pytest -m soak`, 10 minutes, or
TIDEBORN_SOAK_SECONDS) runs until its time is up.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.common import events_of, settings_args, train
from tests.helpers.reliability import (
    RELIABILITY_SEED,
    assert_same_weights,
    check_attempts,
    last_logged_step,
    launched_runs,
    process_gone,
    read_history,
    tool,
    trainer_pid,
    wait_for,
)
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir.layout import list_checkpoints, temp_checkpoints
from tideborn.tools import train_run

CHECKPOINT_EVERY = 5
MAX_STEPS = 100_000  # never reached: the cycles stop the run; the comparison run stops at the same step
SETS = ("optim.batch_size=16", "runtime.log_every=1", f"runtime.checkpoint_every={CHECKPOINT_EVERY}",
        "runtime.keep_checkpoints=3", "runtime.progress=plain", f"runtime.max_steps={MAX_STEPS}")


@pytest.fixture
def launched():
    yield from launched_runs()


def status(run_dir: Path) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = train_run.main(["status", "--out-dir", str(run_dir), "--json"])
    return code, json.loads(out.getvalue())


def one_cycle(run_dir: Path, how: str, rng: random.Random, launched: list[Path], tally: dict) -> bool:
    """Start, let it train a few steps, then stop or kill it; check everything. True: it ended on its own."""
    history = events_of(run_dir)
    seen, reached = len(history), last_logged_step(history)
    newest = list_checkpoints(run_dir)[-1][0] if list_checkpoints(run_dir) else 0
    launched.append(run_dir)
    started = tool("start", *settings_args(run_dir, *SETS))
    assert started.returncode == 0, started.stderr
    pid = trainer_pid(run_dir)
    wanted = rng.randint(1, 12)
    wait_for(lambda: sum(e["kind"] == "step" for e in events_of(run_dir)[seen:]) >= wanted,
             f"{wanted} steps of cycle {tally['cycles']}")
    if how == "stop":
        stopped = tool("stop", "--out-dir", str(run_dir), "--timeout", "120")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        wait_for(lambda: process_gone(pid), "the stopped trainer to exit")
        code, report = status(run_dir)
        assert code == 0 and report["state"] == "stopped", report
    else:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: process_gone(pid), "the killed trainer to go")
        code, report = status(run_dir)
        assert code == 1 and report["state"] == "vanished", report
    run = events_of(run_dir)[seen:]
    first = run[0]
    assert first["kind"] == "run_started" and first["step"] == newest, (first, newest)
    assert reached - newest <= CHECKPOINT_EVERY, (reached, newest)
    tally["steps_lost"] = max(tally["steps_lost"], reached - newest)
    if how == "stop":
        assert run[-1]["kind"] == "run_stopped" and run[-1]["reason"] == "SIGTERM", run[-3:]
        stop_step = run[-1]["step"]
        assert list_checkpoints(run_dir)[-1][0] == stop_step
        assert load_checkpoint(run_dir / f"step-{stop_step:09d}.pt")["step"] == stop_step
        tally["stopped"] += 1
    else:
        assert all(e["kind"] not in ("run_stopped", "run_finished", "run_failed") for e in run)
        tally["killed"] += 1
    for step, path in list_checkpoints(run_dir):
        assert load_checkpoint(path)["step"] == step
    tally["cycles"] += 1
    return how == "stop"


def soak(seconds: float, max_cycles: int, kill_share: float, tmp_path: Path, launched: list[Path]) -> dict:
    rng = random.Random(RELIABILITY_SEED)
    run_dir = tmp_path / "run"
    tally = {"cycles": 0, "stopped": 0, "killed": 0, "steps_lost": 0}
    ended: list[bool] = []
    deadline = time.monotonic() + seconds
    plan = ["kill"] + ["stop"] * (min(max_cycles, 5) - 1)  # at least one of each first, in a seeded order
    rng.shuffle(plan)
    while time.monotonic() < deadline and tally["cycles"] < max_cycles:
        if tally["cycles"] < len(plan):
            how = plan[tally["cycles"]]
        else:
            how = "kill" if rng.random() < kill_share else "stop"
        ended.append(one_cycle(run_dir, how, rng, launched, tally))
    if not ended[-1]:  # end on a stop, so that there is a checkpoint of the last step to compare
        ended.append(one_cycle(run_dir, "stop", rng, launched, tally))

    events, malformed = read_history(run_dir)
    assert malformed == 0
    check_attempts(events, ended)
    assert temp_checkpoints(run_dir) == []
    final = events[-1]["step"]
    straight = tmp_path / "straight"
    train(straight, *SETS, cwd=tmp_path, extra=["--stop-at-step", str(final)])
    assert_same_weights(straight / f"step-{final:09d}.pt", run_dir / f"step-{final:09d}.pt")
    tally["final_step"] = final
    return tally


@pytest.mark.timeout(600)
def test_start_stop_resume_cycles_through_train_run_keep_every_invariant(tmp_path: Path, launched,
                                                                        record_property) -> None:
    tally = soak(seconds=float("inf"), max_cycles=5, kill_share=0.2, tmp_path=tmp_path, launched=launched)
    record_property("soak", tally)
    assert tally["cycles"] >= 5 and tally["killed"] >= 1 and tally["stopped"] >= 3, tally
    print(f"\nshort soak: {tally}")


@pytest.mark.soak
@pytest.mark.timeout(float(os.environ.get("TIDEBORN_SOAK_SECONDS", "600")) + 900)
def test_soak_start_stop_resume_for_ten_minutes(tmp_path: Path, launched, record_property) -> None:
    seconds = float(os.environ.get("TIDEBORN_SOAK_SECONDS", "600"))
    tally = soak(seconds=seconds, max_cycles=10**6, kill_share=0.3, tmp_path=tmp_path, launched=launched)
    record_property("soak", tally)
    assert tally["cycles"] >= 10, tally
    print(f"\nlong soak: {tally}")
