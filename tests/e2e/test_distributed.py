"""DDP through torchrun with 2 CPU processes (gloo): real launches, real signals, real crashes."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers.common import (
    RUN_TIMEOUT_SECONDS,
    child_env,
    describe,
    events_of,
    settings_args,
    step_events,
    terminal_events,
    trainer_in_process,
)
from tests.helpers.torchrun import SMALL, parameters, torchrun, torchrun_args
from tideborn.network.checkpoint import load_checkpoint


def losses(run_dir: Path) -> dict[int, float]:
    return {event["step"]: event["loss"] for event in step_events(events_of(run_dir))}


# A plain 2-rank run of 6 steps with checkpoints at 3 and 6: the end-to-end run itself, the run that a resume in
# pieces must match, and the run that one process with twice the batch must match.
STRAIGHT = ("runtime.max_steps=6", "runtime.checkpoint_every=3")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """The STRAIGHT run under torchrun, made once for the tests that only read it; never modify it."""
    base = tmp_path_factory.mktemp("straight")
    run_dir = base / "run"
    result = torchrun(run_dir, *STRAIGHT, cwd=base)
    assert result.returncode == 0, describe(result)
    return run_dir


def test_two_process_smoke_run_end_to_end(straight_run):
    run_dir = straight_run
    events = events_of(run_dir)
    started = [e for e in events if e["kind"] == "run_started"]
    assert len(started) == 1 and started[0]["world_size"] == 2
    assert [e["step"] for e in step_events(events)] == [1, 2, 3, 4, 5, 6]  # rank 0 alone writes events
    assert [e["kind"] for e in terminal_events(events)] == ["run_finished"]
    assert sorted(p.name for p in run_dir.glob("step-*.pt")) == ["step-000000003.pt", "step-000000006.pt"]
    assert load_checkpoint(run_dir / "step-000000006.pt")["world_size"] == 2
    step = step_events(events)[-1]
    assert step["positions_per_second"] > 0


def test_one_gradient_allreduce_per_step_whatever_the_accumulation(tmp_path):
    counts = {}
    for accumulation in (1, 4):
        run_dir = tmp_path / f"acc{accumulation}"
        result = torchrun(run_dir, "runtime.max_steps=4", "runtime.ddp_diagnostics=true",
                          f"optim.accumulation_steps={accumulation}", "optim.batch_size=32", cwd=tmp_path)
        assert result.returncode == 0, describe(result)
        steps = step_events(events_of(run_dir))
        assert all(e["ranks_in_sync"] for e in steps)
        counts[accumulation] = [e["allreduce_calls"] for e in steps]
    # The comm hook counts one all-reduce per gradient bucket: a 2x32 net fills a couple of buckets, and
    # with 4 micro-batches per step the count must be the same as with 1 (no_sync on the first 3).
    assert counts[4] == counts[1], counts
    per_step = [b - a for a, b in zip(counts[1], counts[1][1:])]
    assert len(set(per_step)) == 1 and 1 <= per_step[0] <= 4, counts


def test_two_ranks_with_batch_b_match_one_process_with_batch_2b(straight_run, tmp_path):
    # One process with batch 32 in 2 micro-batches of 16 computes what 2 ranks with 16 each compute: the same
    # positions (the synthetic stream deals micro-batches to ranks in turn) and the same BatchNorm batches.
    two, one = straight_run, tmp_path / "one"
    single = trainer_in_process("train", *settings_args(one, "optim.batch_size=32", "optim.accumulation_steps=2",
                                                        "runtime.log_every=1", *STRAIGHT), cwd=tmp_path)
    assert single.returncode == 0, describe(single)
    a, b = losses(two), losses(one)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5, abs=1e-6), step
    pa, pb = parameters(two / "step-000000006.pt"), parameters(one / "step-000000006.pt")
    for name in pa:
        torch.testing.assert_close(pa[name], pb[name], rtol=1e-4, atol=1e-6, msg=name)


def test_resume_under_ddp_continues_exactly_and_another_world_size_goes_on_with_a_warning(straight_run, tmp_path):
    straight, pieces, other = straight_run, tmp_path / "pieces", tmp_path / "other"
    sets = STRAIGHT
    first = torchrun(pieces, *sets, cwd=tmp_path, extra=("--stop-at-step", "3"))
    assert first.returncode == 0, describe(first)
    # One process resumes what 2 wrote (the data order is global); the batch is per process, so it says the
    # global batch changed (tests/unit/test_global_order.py checks the order itself).
    shutil.copytree(pieces, other)
    single = trainer_in_process("train", *settings_args(other, *SMALL, *sets), "--stop-at-step", "4", cwd=tmp_path)
    assert single.returncode == 0, describe(single)
    warnings = [e["message"] for e in events_of(other) if e["kind"] == "warning"]
    assert any("at world size 1, written at 2" in text for text in warnings), warnings
    second = torchrun(pieces, *sets, cwd=tmp_path)
    assert second.returncode == 0, describe(second)
    assert losses(pieces) == losses(straight)
    pa, pb = parameters(straight / "step-000000006.pt"), parameters(pieces / "step-000000006.pt")
    assert all(torch.equal(pa[name], pb[name]) for name in pa)
    assert [e["resumed_from"] for e in events_of(pieces) if e["kind"] == "run_started"] == [
        None, str(pieces / "step-000000003.pt")]


def start_torchrun(run_dir: Path, tmp_path: Path, *sets: str) -> subprocess.Popen:
    log = open(tmp_path / "torchrun.log", "wb")
    return subprocess.Popen(torchrun_args(run_dir, "runtime.max_steps=100000", *sets), cwd=tmp_path,
                            env=child_env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_for_steps(run_dir: Path, launcher: subprocess.Popen, count: int) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if (run_dir / "events.jsonl").exists() and len(step_events(events_of(run_dir))) >= count:
            return
        assert launcher.poll() is None, "torchrun exited early"
        time.sleep(0.05)
    pytest.fail("no step events")


def trainer_ranks(launcher: subprocess.Popen) -> dict[int, psutil.Process]:
    ranks = {}
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if "tideborn.trainer" in " ".join(child.cmdline()):
                ranks[int(child.environ()["RANK"])] = child
        except (psutil.NoSuchProcess, KeyError):
            continue
    return ranks


@pytest.fixture
def cleanup():
    started: list[subprocess.Popen] = []
    yield started.append
    for launcher in started:
        for child in psutil.Process(launcher.pid).children(recursive=True) if launcher.poll() is None else []:
            child.kill()
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait(timeout=30)


def test_a_crashed_rank_ends_every_rank_promptly_with_run_failed(tmp_path, cleanup):
    run_dir = tmp_path / "run"
    launcher = start_torchrun(run_dir, tmp_path)
    cleanup(launcher)
    wait_for_steps(run_dir, launcher, 2)
    ranks = trainer_ranks(launcher)
    assert set(ranks) == {0, 1}
    ranks[1].kill()  # as the OOM killer would
    # "Promptly": the launcher must be gone well within the test's timeout, not after the collective's.
    code = launcher.wait(timeout=60)
    assert code != 0
    assert not ranks[0].is_running() or ranks[0].status() == psutil.STATUS_ZOMBIE
    terminal = terminal_events(events_of(run_dir))
    assert [e["kind"] for e in terminal] == ["run_failed"], terminal
    assert terminal[0]["error"]


def test_sigterm_to_torchrun_stops_every_rank_with_one_checkpoint(tmp_path, cleanup):
    run_dir = tmp_path / "run"
    launcher = start_torchrun(run_dir, tmp_path, "runtime.checkpoint_every=100000")
    cleanup(launcher)
    wait_for_steps(run_dir, launcher, 2)
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=60)
    events = events_of(run_dir)
    terminal = terminal_events(events)
    assert [e["kind"] for e in terminal] == ["run_stopped"], (tmp_path / "torchrun.log").read_text()[-3000:]
    stopped_at = terminal[0]["step"]
    saved = [e for e in events if e["kind"] == "checkpoint_saved"]
    assert [e["step"] for e in saved] == [stopped_at]
    assert (run_dir / f"step-{stopped_at:09d}.pt").exists()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_signal_that_reaches_one_rank_stops_every_rank_together(rank, tmp_path, cleanup):
    # The ranks vote on stopping every step; the vote is read two steps later (StopVote.LAG), so that no
    # step waits for the GPU: every rank must still stop at the same step, with one checkpoint.
    run_dir = tmp_path / "run"
    launcher = start_torchrun(run_dir, tmp_path, "runtime.checkpoint_every=100000")
    cleanup(launcher)
    wait_for_steps(run_dir, launcher, 2)
    ranks = trainer_ranks(launcher)
    ranks[rank].send_signal(signal.SIGTERM)
    code = launcher.wait(timeout=60)
    log = (tmp_path / "torchrun.log").read_text()[-3000:]
    assert code == 0, log
    events = events_of(run_dir)
    terminal = terminal_events(events)
    assert [e["kind"] for e in terminal] == ["run_stopped"], log
    stopped_at = terminal[0]["step"]
    assert [e["step"] for e in events if e["kind"] == "checkpoint_saved"] == [stopped_at]
    assert (run_dir / f"step-{stopped_at:09d}.pt").exists()


def test_train_run_start_status_stop_through_torchrun(tmp_path, capsys):
    from tideborn.tools.train_run import main as train_run

    run_dir = tmp_path / "run"
    # `start` detaches a real launcher, so it runs as the command would; `status` and `stop` only read the run
    # and signal that launcher, which they do the same from this process.
    tool = [sys.executable, "-m", "tideborn.tools.train_run"]
    started = subprocess.run([*tool, "start", *settings_args(run_dir, *SMALL, "runtime.max_steps=100000"),
                              "--nproc-per-node", "2"], cwd=tmp_path, env=child_env(), capture_output=True,
                             text=True, timeout=RUN_TIMEOUT_SECONDS)
    assert started.returncode == 0, describe(started)
    assert "training at step 0" in started.stdout  # start saw rank 0's run_started name torchrun as its launcher
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while not (run_dir / "events.jsonl").exists() or not step_events(events_of(run_dir)):
            assert time.monotonic() < deadline, (run_dir / "train.log").read_text()
            time.sleep(0.1)
        capsys.readouterr()
        status_code = train_run(["status", "--out-dir", str(run_dir), "--json"])
        status = capsys.readouterr()
        assert status_code == 0, status
        assert '"state": "running"' in status.out
    finally:
        stop_code = train_run(["stop", "--out-dir", str(run_dir), "--force", "--timeout", "60"])
        stop = capsys.readouterr()
    assert stop_code == 0, stop
    assert [e["kind"] for e in terminal_events(events_of(run_dir))] == ["run_stopped"]
    assert [e["world_size"] for e in events_of(run_dir) if e["kind"] == "run_started"] == [2]
