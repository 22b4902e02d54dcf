"""End to end, in a real terminal (tmux on a private socket): open tideborn-tui on an empty run directory
with the smoke config, start a run with the start key and its confirmation, watch steps arrive, stop it
with the stop key and its confirmation, see run_stopped; quitting leaves nothing running."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.tmux import TMUX, Terminal
from tideborn.rundir.events import read_events

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.skipif(not Path(TMUX).exists(), reason="tmux is not installed")]


def kill_recorded_trainer(run_dir: Path) -> None:
    """The trainer this test started, if it is still running (checked against its recorded start time)."""
    try:
        record = json.loads((run_dir / "train.pid").read_text())
        process = psutil.Process(record["pid"])
        if abs(process.create_time() - record["start_time"]) <= 1.0:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
    except (FileNotFoundError, json.JSONDecodeError, psutil.NoSuchProcess):
        pass  # no trainer was started, or it has exited already: nothing to clean up


@pytest.fixture
def terminal(tmp_path, request):
    socket = f"tideborn-test-{os.getpid()}-{time.monotonic_ns()}"
    term = Terminal(socket)
    run_dir = tmp_path / "run"

    def cleanup() -> None:
        kill_recorded_trainer(run_dir)
        term.tmux("kill-server", check=False)

    request.addfinalizer(cleanup)
    return term, run_dir


def test_start_watch_and_stop_a_smoke_run_from_the_keyboard(terminal, tmp_path):
    term, run_dir = terminal
    run_dir.mkdir()
    script = Path(sys.executable).parent / "tideborn-tui"
    if not script.exists():
        pytest.fail(f"{script} is missing: install the project first (pip install --no-deps -e .)")
    config = REPO / "configs" / "smoke.toml"
    argv = [str(script), str(run_dir), "--config", str(config), "--no-nvml",
            "--set", f"runtime.out_dir={json.dumps(str(run_dir))}", "--set", "runtime.max_steps=100000",
            "--set", "runtime.checkpoint_every=20", "--set", "runtime.log_every=2"]
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TERM": "xterm-256color", "TZ": "UTC",
           "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")}
    command = "env -u TIDEBORN_PROJECT_FILE " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " \
        + shlex.join(argv)
    term.tmux("new-session", "-d", "-s", "tui", "-x", "110", "-y", "34", "-c", str(tmp_path), command)

    term.wait_for(r"NOT STARTED", "the TUI to open on the empty run directory")
    term.keys("s")
    term.wait_for(r"Start a run in", "the start confirmation")
    term.keys("y")
    term.wait_for(r"RUNNING\s+step [1-9]\d*", "steps to arrive")
    first = int(term.wait_for(r"step (\d+) /", "a step count").group(1))
    term.wait_for(rf"step (?!{first} )\d+ /", "more steps to arrive")

    term.keys("x")
    term.wait_for(r"Stop the run", "the stop confirmation")
    term.keys("y")
    term.wait_for(r"STOPPED", "the run to stop")
    term.wait_for(r"run_stopped at step \d+: SIGTERM", "run_stopped in the header")

    events = read_events(run_dir / "events.jsonl")
    stopped = [e for e in events if e["kind"] == "run_stopped"]
    assert len(stopped) == 1 and stopped[0]["reason"] == "SIGTERM"
    assert (run_dir / f"step-{stopped[0]['step']:09d}.pt").exists()  # it checkpointed on the way out

    term.keys("q")
    deadline = time.monotonic() + 30
    while term.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not term.alive(), "q did not quit the TUI"
