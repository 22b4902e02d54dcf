"""torchrun's elastic agent on the loopback: two agents (two "nodes" of one CPU process each, gloo) joined by
c10d rendezvous. A worker is killed, then a whole agent, mid-run; the job goes on at world size 1 from its last
checkpoint, a new agent joins and it goes on at 2; SIGTERM to the agents ends it with one checkpoint. The global
batches it trained (their digests under runtime.ddp_diagnostics) are a single process's, the global batch held
constant, and status shows one run with its restarts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.common import child_env, events_of, settings_args, step_events, train

SETS = ("run.network=\"resnet2x32\"", "model.blocks=1", "model.channels=8", "optim.batch_size=4",
        "optim.global_batch_size=8", "runtime.ddp_diagnostics=true", "runtime.log_every=1",
        "runtime.checkpoint_every=5", "runtime.keep_checkpoints=3", "runtime.max_steps=100000",
        "runtime.progress=\"plain\"", "runtime.dist_timeout_seconds=30")
PHASE_SECONDS = 60
"""The longest any one phase (a restart, a join) may take before the test fails."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Agents:
    """torchrun agents, each in its own process group, all killed at the end whatever happened."""

    def __init__(self, tmp_path: Path, run_dir: Path, port: int):
        self.tmp_path, self.run_dir, self.port = tmp_path, run_dir, port
        self.started: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> subprocess.Popen:
        rdzv = "join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2,close_timeout=5"
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
                   "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                   "--rdzv-id", "elastic-test", "--rdzv-conf", rdzv, "--monitor-interval", "0.2",
                   "-m", "tideborn.trainer", "train", *settings_args(self.run_dir, *SETS)]
        log = open(self.tmp_path / f"agent-{name}.log", "wb")
        process = subprocess.Popen(command, cwd=self.tmp_path, env=child_env(), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.started[name] = process
        return process

    def worker(self, name: str) -> psutil.Process:
        for child in psutil.Process(self.started[name].pid).children(recursive=True):
            try:
                if "tideborn.trainer" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        pytest.fail(f"agent {name} has no worker")

    def kill_group(self, name: str) -> None:
        try:
            os.killpg(self.started[name].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.started[name].wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- agent {name}\n" + (self.tmp_path / f"agent-{name}.log").read_text(errors="replace")
                         [-3000:] for name in self.started)

    def close(self) -> None:
        for name in self.started:
            self.kill_group(name)


def wait_for(agents: Agents, what: str, check) -> list[dict]:
    deadline = time.monotonic() + PHASE_SECONDS
    while time.monotonic() < deadline:
        events = events_of(agents.run_dir) if (agents.run_dir / "events.jsonl").exists() else []
        if check(events):
            return events
        time.sleep(0.05)
    pytest.fail(f"waited {PHASE_SECONDS} s for {what}\n{agents.logs()}")


def attempts(events: list[dict]) -> list[list[dict]]:
    """The events of each attempt, from its run_started on."""
    found: list[list[dict]] = []
    for event in events:
        if event["kind"] == "run_started":
            found.append([])
        if found:
            found[-1].append(event)
    return found


def attempt_saved(count: int, world_size: int):
    """The `count`th attempt has started at `world_size` and saved a checkpoint."""
    def check(events: list[dict]) -> bool:
        runs = attempts(events)
        return (len(runs) >= count and runs[count - 1][0]["world_size"] == world_size
                and any(e["kind"] == "checkpoint_saved" for e in runs[count - 1]))
    return check


@pytest.mark.xfail(reason="not yet passing: after a worker is killed, the other agent's restarted worker times out "
                          "connecting to the killed worker's agent, which does not rejoin (seen on the loaded 2-core "
                          "machine); the rendezvous choreography needs work", strict=False)
def test_a_node_lost_and_regained_goes_on_in_the_same_global_order(tmp_path):
    run_dir = tmp_path / "run"
    agents = Agents(tmp_path, run_dir, free_port())
    try:
        agents.start("a")  # hosts the rendezvous store: the agent that stays
        agents.start("b")
        wait_for(agents, "the first attempt at world size 2", attempt_saved(1, 2))
        agents.worker("b").kill()  # a worker lost: the agents restart both
        wait_for(agents, "a restart at world size 2", attempt_saved(2, 2))
        agents.kill_group("b")  # a node lost: the job goes on alone
        wait_for(agents, "the attempt at world size 1", attempt_saved(3, 1))
        agents.start("c")  # a node joins
        wait_for(agents, "the attempt at world size 2 again", lambda events: (
            len(attempts(events)) >= 4 and attempts(events)[-1][0]["world_size"] == 2
            and len(step_events(attempts(events)[-1])) >= 2))
        for name in ("a", "c"):  # as `train_run stop` and a scheduler's preemption notice do
            agents.started[name].send_signal(signal.SIGTERM)
        for name in ("a", "c"):
            agents.started[name].wait(timeout=PHASE_SECONDS)
    finally:
        agents.close()
    events = events_of(run_dir)
    runs = attempts(events)
    assert [run[0]["world_size"] for run in runs] == [2, 2, 1, 2], agents.logs()
    assert [run[0]["restart_count"] for run in runs][:3] == [0, 1, 2]
    for run in runs[:-1]:  # each lost attempt ends in run_failed (or, its rank 0 killed, in nothing)
        assert [e["kind"] for e in run if e["kind"].startswith("run_")][1:] in (["run_failed"], []), run[-1]
    assert runs[-1][-1]["kind"] == "run_stopped", agents.logs()
    assert sum(1 for e in runs[-1] if e["kind"] == "checkpoint_saved" and e["step"] == runs[-1][-1]["step"]) == 1
    for before, after in zip(runs, runs[1:]):  # every attempt resumed from the checkpoint before it
        saved = [e["step"] for e in before if e["kind"] == "checkpoint_saved"]
        assert saved and after[0]["step"] == saved[-1] and after[0]["resumed_from"]

    # The global batches trained, step by step (the last attempt's where steps were trained again), are a
    # single process's with the same global batch.
    trained: dict[int, str] = {}
    for event in step_events(events):
        trained[event["step"]] = event["batch_digests"][-1]
    last = runs[-1][-1]["step"]
    assert sorted(trained) == list(range(1, last + 1))
    train(tmp_path / "single", *SETS, cwd=tmp_path, extra=("--stop-at-step", str(last)))
    single = {e["step"]: e["batch_digests"][-1] for e in step_events(events_of(tmp_path / "single"))}
    assert single == trained

    # status: one run with its restarts, a `restarted` anomaly for each, never "vanished".
    status = subprocess.run([sys.executable, "-m", "tideborn.tools.train_run", "status", "--json", "--out-dir",
                             str(run_dir)], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60)
    report = json.loads(status.stdout)
    assert report["state"] == "stopped" and report["restarts"] >= 2, report
    restarted = [a for a in report["anomalies"] if a["rule"] == "restarted"]
    assert len(restarted) == 3 and not [a for a in report["anomalies"] if a["rule"] == "vanished"], report
