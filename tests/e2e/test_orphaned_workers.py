"""Workers never outlive torchrun's agent (issue 43, must 1): a real `train_run start --nproc-per-node 2`, its agent
SIGKILLed as the OOM killer would. The workers checkpoint and stop by themselves; where some survive (here: held
with SIGSTOP, so that they cannot notice), `status` says so and `stop` stops them."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers.common import RUN_TIMEOUT_SECONDS, child_env, describe, events_of, settings_args, step_events
from tests.helpers.reliability import launched_runs, process_gone, trainer_pid, wait_for
from tests.helpers.torchrun import SMALL

TOOL = [sys.executable, "-m", "tideborn.tools.train_run"]


@pytest.fixture
def run_dirs():
    yield from launched_runs()


@pytest.fixture
def workers_killed():
    """Worker processes a test found; any still alive at its end are SIGKILLed (they are not train.pid's)."""
    found: list[psutil.Process] = []
    yield found
    for worker in found:
        try:
            worker.kill()
        except psutil.NoSuchProcess:
            pass


def launch_args(kind: str) -> list[str]:
    """torchrun as `train_run start` runs it: two workers, or one elastic node (one worker, c10d rendezvous)."""
    if kind == "two workers":
        return ["--nproc-per-node", "2"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return ["--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "orphan-test"]


def start_ranks(run_dir: Path, cwd: Path, run_dirs: list[Path], workers: list[psutil.Process],
                kind: str = "two workers") -> int:
    """A detached torchrun run that has logged a step; returns the agent's pid, its workers put in `workers`."""
    run_dirs.append(run_dir)
    started = subprocess.run([*TOOL, "start", *settings_args(run_dir, *SMALL, "runtime.max_steps=100000",
                                                             "runtime.checkpoint_every=100000"),
                              *launch_args(kind)], cwd=cwd, env=child_env(), capture_output=True,
                             text=True, timeout=RUN_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
    assert started.returncode == 0, describe(started)
    wait_for(lambda: (run_dir / "events.jsonl").exists() and step_events(events_of(run_dir)), "the first step")
    # train.pid names the agent, whatever the number of workers (a lone worker once put its own pid there)
    agent = trainer_pid(run_dir)
    assert "torch.distributed.run" in " ".join(psutil.Process(agent).cmdline())
    ranks = [child for child in psutil.Process(agent).children() if "tideborn.trainer" in " ".join(child.cmdline())]
    workers += ranks
    assert len(ranks) == (2 if kind == "two workers" else 1), ranks
    # rank 0 recorded both ranks in the run directory's lock, which is how `stop` finds them without the agent
    lock = json.loads((run_dir / ".trainer.lock").read_text())
    assert sorted(worker["pid"] for worker in lock["workers"]) == sorted(rank.pid for rank in ranks)
    assert lock["launched_pid"] == agent
    return agent


@pytest.mark.parametrize("kind", ["two workers", "one elastic node"])
def test_workers_whose_agent_is_killed_checkpoint_and_stop(kind, tmp_path, run_dirs, workers_killed, capsys):
    from tideborn.tools.train_run import main as train_run

    run_dir = tmp_path / "run"
    agent = start_ranks(run_dir, tmp_path, run_dirs, workers_killed, kind)
    psutil.Process(agent).kill()
    # Before: both ranks trained on for good with parent pid 1. The timeout only guards against that hang.
    _, alive = psutil.wait_procs(workers_killed, timeout=RUN_TIMEOUT_SECONDS)
    assert not alive, (run_dir / "train.log").read_text()[-3000:]
    events = events_of(run_dir)
    (stopped,) = [e for e in events if e["kind"] in ("run_stopped", "run_finished", "run_failed")]
    assert stopped["kind"] == "run_stopped" and stopped["reason"] == "agent_gone", stopped
    assert stopped["agent_pid"] == agent
    assert stopped["checkpoint"] == str(run_dir / f"step-{stopped['step']:09d}.pt")
    assert Path(stopped["checkpoint"]).is_file()
    assert f"torchrun's agent (pid {agent}) is gone" in (run_dir / "train.log").read_text()
    capsys.readouterr()
    assert train_run(["status", "--out-dir", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "stopped"


def test_workers_that_outlive_their_agent_are_reported_by_status_and_ended_by_stop(tmp_path, run_dirs,
                                                                                   workers_killed, capsys):
    from tideborn.tools.train_run import main as train_run

    run_dir = tmp_path / "run dir; echo oops"
    agent = start_ranks(run_dir, tmp_path, run_dirs, workers_killed)
    for worker in workers_killed:  # held, they cannot notice the agent's death: survivors, as a hung rank would be
        worker.send_signal(signal.SIGSTOP)
    psutil.Process(agent).kill()
    wait_for(lambda: process_gone(agent), "the agent to be gone")
    rank0 = json.loads((run_dir / ".trainer.lock").read_text())["pid"]

    capsys.readouterr()
    assert train_run(["status", "--out-dir", str(run_dir), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "running"  # before: "vanished", with nothing left to stop the workers by
    (orphaned,) = [a for a in report["anomalies"] if a["rule"] == "orphaned"]
    assert orphaned["evidence"] == {"pid": agent, "trainer_pid": rank0}
    assert "stop --out-dir 'run dir; echo oops'" not in orphaned["message"]  # quoted whole, as one argument
    assert f"stop --out-dir '{run_dir}'" in orphaned["message"]

    # Without --force, stop signals every worker and says that they are held; with it, it ends them.
    assert train_run(["stop", "--out-dir", str(run_dir), "--timeout", "1"]) == 1
    said = capsys.readouterr().out
    pids = sorted(worker.pid for worker in workers_killed)
    assert f"kill -CONT {' '.join(str(pid) for pid in sorted(pids, key=lambda p: p != rank0))}" in said, said
    train_run(["stop", "--out-dir", str(run_dir), "--force", "--timeout", "1"])
    said = capsys.readouterr().out
    assert "torchrun's agent is gone, but its workers still run" in said and "sent SIGKILL" in said, said
    _, alive = psutil.wait_procs(workers_killed, timeout=RUN_TIMEOUT_SECONDS)
    assert not alive
