"""torchrun's elastic agent on the loopback: two agents (two "nodes" of one CPU process each, gloo) joined by
c10d rendezvous. A worker is killed: both agents restart their workers at world size 2 from the last checkpoint.
A whole agent is killed: the survivor's rendezvous drops it (its keep-alive lapses) and the job goes on at world
size 1. A new agent joins: the survivor sees it waiting, and the job goes on at world size 2 again. SIGTERM to the
agents (as `train_run stop` sends) ends the job with one checkpoint and no restart. Every global batch trained (its
digest under runtime.ddp_diagnostics) is a single process's, the global batch held constant, and status shows one
run with its restarts."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.common import child_env, events_of, settings_args, step_events, train
from tideborn.tools.control import ELASTIC_ENV

SETS = ("run.network=\"resnet2x32\"", "model.blocks=1", "model.channels=8", "optim.batch_size=4",
        "optim.global_batch_size=8", "runtime.ddp_diagnostics=true", "runtime.log_every=1",
        "runtime.checkpoint_every=5", "runtime.keep_checkpoints=3", "runtime.max_steps=100000",
        "runtime.progress=\"plain\"", "runtime.dist_timeout_seconds=30")
PHASE_SECONDS = 300
"""The longest any one phase (a restart, a join) may take before the test fails, on a loaded machine."""
RDZV_CONF = ("join_timeout=60,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5,close_timeout=5")
"""Short rendezvous timeouts: a killed agent's keep-alive lapses after 5 s; the nodes that join within 2 s of the
first make one round. The lapse must be well over twice the interval: torch's heartbeat timer ticks every interval
but writes only when a full interval has passed since the last write (dynamic_rendezvous.py `_should_keep_alive`), so
a live node's heartbeats can be two intervals apart, and a node that syncs then (a new agent joining) would find the
survivor "dead", drop it from the round and form a world of its own."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Agents:
    """torchrun agents, each with its workers killed at the end whatever happened."""

    def __init__(self, tmp_path: Path, run_dir: Path, port: int):
        self.tmp_path, self.run_dir, self.port = tmp_path, run_dir, port
        self.started: dict[str, subprocess.Popen] = {}

    def start(self, name: str, host: bool = False) -> subprocess.Popen:
        """An agent; the `host` serves the rendezvous store (on one machine, every agent would otherwise take the
        endpoint for its own and the first to bind it would host, maybe the one to be killed)."""
        conf = f"{RDZV_CONF},is_host={'true' if host else 'false'}"
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
                   "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                   "--rdzv-id", "elastic-test", "--rdzv-conf", conf, "--monitor-interval", "0.2",
                   "-m", "tideborn.trainer", "train", *settings_args(self.run_dir, *SETS)]
        # The workers' store must be new each round (docs/training.md, "Elastic jobs": pytorch#135712).
        env = child_env({"LOGLEVEL": "INFO", **ELASTIC_ENV})
        log = open(self.tmp_path / f"agent-{name}.log", "wb")
        process = subprocess.Popen(command, cwd=self.tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
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
        pytest.fail(f"agent {name} has no worker\n{self.logs()}")

    def kill_node(self, name: str) -> None:
        """SIGKILL to the agent and its workers, as a node lost does. torchrun starts each worker in a session
        of its own, so the agent's process group does not hold them."""
        agent = self.started[name]
        try:
            doomed = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            doomed = []
        for process in doomed:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                continue
        agent.wait(timeout=10)
        psutil.wait_procs(doomed, timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- agent {name}\n" + (self.tmp_path / f"agent-{name}.log").read_text(errors="replace")
                         [-4000:] for name in self.started)

    def close(self) -> None:
        for name in self.started:
            self.kill_node(name)


def wait_for(agents: Agents, what: str, check) -> list[dict]:
    deadline = time.monotonic() + PHASE_SECONDS
    while time.monotonic() < deadline:
        events = events_of(agents.run_dir) if (agents.run_dir / "events.jsonl").exists() else []
        if check(events):
            return events
        time.sleep(0.1)
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


def trains_at(world_size: int, after: int, saved: bool = True):
    """An attempt after the first `after` runs at `world_size` and has saved a checkpoint of its own (or, without
    `saved`, trained two steps). Returns the number of attempts then."""
    def check(events: list[dict]) -> int:
        for number, run in enumerate(attempts(events)[after:], start=after + 1):
            kind = "checkpoint_saved" if saved else "step"
            own = [e for e in run if e["kind"] == kind and e["step"] > run[0]["step"]]
            if run[0]["world_size"] == world_size and len(own) >= (1 if saved else 2):
                return number
        return 0
    return check


def test_a_lost_worker_a_lost_node_and_a_new_node_go_on_in_the_same_global_order(tmp_path):
    run_dir = tmp_path / "run"
    agents = Agents(tmp_path, run_dir, free_port())
    try:
        agents.start("a", host=True)  # the agent that stays: losing the store's host ends the job
        agents.start("b")
        first = len(attempts(wait_for(agents, "training at world size 2", trains_at(2, 0))))
        agents.worker("b").kill()  # a worker lost: both agents restart their workers
        lost_worker = len(attempts(wait_for(agents, "a restart at world size 2", trains_at(2, first))))
        agents.kill_node("b")  # a node lost: the job goes on alone
        alone = len(attempts(wait_for(agents, "the job alone at world size 1", trains_at(1, lost_worker))))
        agents.start("b2")  # a node regained: it waits for the survivor's next membership check, then both restart
        wait_for(agents, "the job at world size 2 again", trains_at(2, alone))
        for name in ("a", "b2"):  # as `train_run stop` on each node, and a preemption notice, do
            agents.started[name].send_signal(signal.SIGTERM)
        for name in ("a", "b2"):
            agents.started[name].wait(timeout=PHASE_SECONDS)  # torchrun exits 1 on a signal (its SignalException)
    finally:
        agents.close()
    events = events_of(run_dir)
    runs = attempts(events)
    sizes = [run[0]["world_size"] for run in runs]
    # Each phase may take more than one attempt (an agent a little late for a round joins at the next membership
    # change), but in this order: 2, then 2 again after the lost worker, 1 after the lost node, 2 after the new one.
    assert sizes[0] == 2 and 1 in sizes and 2 in sizes[1:sizes.index(1)] and sizes[-1] == 2, (sizes, agents.logs())
    assert [run[0]["restart_count"] for run in runs][0] == 0
    assert all(run[0]["restart_count"] >= 1 for run in runs[1:]), [run[0] for run in runs]
    for run in runs[:-1]:  # each lost attempt ends in run_failed (a membership change, in run_stopped)
        ends = [e["kind"] for e in run if e["kind"].startswith("run_")][1:]
        assert ends in (["run_failed"], ["run_stopped"], []), run[-1]
    assert runs[-1][-1]["kind"] == "run_stopped", agents.logs()
    assert sum(1 for e in runs[-1] if e["kind"] == "checkpoint_saved" and e["step"] == runs[-1][-1]["step"]) == 1
    for before, after in zip(runs, runs[1:]):  # every attempt resumed from the newest checkpoint before it
        saved = [e["step"] for e in before if e["kind"] == "checkpoint_saved"]
        newest = saved[-1] if saved else before[0]["step"]
        assert after[0]["step"] == newest and after[0]["resumed_from"], (before[0], after[0])

    # Every global batch trained, the steps trained again after a restart included, is a single process's with
    # the same global batch.
    last = runs[-1][-1]["step"]
    assert sorted({e["step"] for e in step_events(events)}) == list(range(1, last + 1))
    train(tmp_path / "single", *SETS, cwd=tmp_path, extra=("--stop-at-step", str(last)))
    single = {e["step"]: e["batch_digests"][-1] for e in step_events(events_of(tmp_path / "single"))}
    for event in step_events(events):
        assert event["batch_digests"] == [single[event["step"]]], (event, runs[0][0])

    # status: one run with its restarts, a `restarted` anomaly for each attempt after the first, never "vanished".
    status = subprocess.run([sys.executable, "-m", "tideborn.tools.train_run", "status", "--json", "--out-dir",
                             str(run_dir)], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60)
    report = json.loads(status.stdout)
    restarted = [a for a in report["anomalies"] if a["rule"] == "restarted"]
    assert report["state"] == "stopped" and report["restarts"] == len(runs) - 1, report
    assert len(restarted) == len(runs) - 1 and not [a for a in report["anomalies"] if a["rule"] == "vanished"], report


def start_elastic(run_dir: Path, cwd: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    """`train_run start --nnodes 1:2` on one node; torchrun reads the rendezvous settings from PET_RDZV_CONF."""
    command = [sys.executable, "-m", "tideborn.tools.train_run", "start", "--nnodes", "1:2", "--rdzv-endpoint",
               f"127.0.0.1:{free_port()}", "--rdzv-id", "stop-test", *settings_args(run_dir, *STOP_SETS)]
    started = subprocess.run(command, cwd=cwd, env=child_env(extra_env), capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=PHASE_SECONDS)
    assert started.returncode == 0, started.stderr
    return started


STOP_SETS = tuple(s for s in SETS if not s.startswith("runtime.checkpoint_every")) + ("runtime.checkpoint_every=3",)


def test_train_run_stop_ends_an_elastic_job_even_between_a_failure_and_its_restart(tmp_path, capsys):
    from tests.helpers.reliability import fault_env, process_gone, trainer_pid
    from tideborn.tools import train_run

    run_dir = tmp_path / "run"

    def stop() -> tuple[int, str]:
        code = train_run.main(["stop", "--out-dir", str(run_dir), "--timeout", str(PHASE_SECONDS)])
        return code, capsys.readouterr().out

    def status() -> dict:
        train_run.main(["status", "--json", "--out-dir", str(run_dir)])
        return json.loads(capsys.readouterr().out)

    # Each worker's first checkpoint save fails (ENOSPC): the attempt ends in run_failed, and the agent waits
    # last_call_timeout in the rendezvous before it restarts the worker: a stop comes in between.
    start_elastic(run_dir, tmp_path, {**fault_env(tmp_path, checkpoint="1,100"),
                                      "PET_RDZV_CONF": "last_call_timeout=6"})
    agent = psutil.Process(trainer_pid(run_dir))
    deadline = time.monotonic() + PHASE_SECONDS
    while not [e for e in events_of(run_dir) if e["kind"] == "run_failed"]:
        assert time.monotonic() < deadline and agent.is_running(), (run_dir / "train.log").read_text()
        time.sleep(0.1)
    assert status()["state"] == "running"  # the agent lives and will restart the worker
    code, out = stop()
    assert code == 0 and "ended before its restart" in out, out
    assert process_gone(agent.pid)
    assert [e["kind"] for e in events_of(run_dir)].count("run_started") == 1  # no restart

    # A healthy elastic job: status shows it; stop writes one checkpoint, run_stopped, and the agent ends.
    start_elastic(run_dir, tmp_path, {"PET_RDZV_CONF": "last_call_timeout=1"})
    agent = psutil.Process(trainer_pid(run_dir))
    deadline = time.monotonic() + PHASE_SECONDS
    while len(attempts(events_of(run_dir))[-1]) < 3 or attempts(events_of(run_dir))[-1][-1]["kind"] != "step":
        assert time.monotonic() < deadline and agent.is_running(), (run_dir / "train.log").read_text()
        time.sleep(0.1)
    report = status()
    assert report["state"] == "running" and report["world_size"] == 1, report
    code, out = stop()
    assert code == 0 and "the run ended: run_stopped" in out, out
    assert process_gone(agent.pid)
    last = attempts(events_of(run_dir))[-1]
    assert len(attempts(events_of(run_dir))) == 2 and last[-1]["kind"] == "run_stopped", last
    assert [e["step"] for e in last if e["kind"] == "checkpoint_saved"].count(last[-1]["step"]) == 1, last
