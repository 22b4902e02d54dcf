"""The run tools and the monitor against other users and a rotated events file (issue 22, musts 5 and 9).

- Another user's run: `stop` (and `stop --force`, and the monitor's stop key) of a trainer this user may not
  signal says whose process it is, exit 2, nothing signalled; a run directory, train.pid, events.jsonl or
  train.log this user may not read is one line (or a `run_file` anomaly naming the owner), never a traceback.
  Root passes every permission check, so these run the tools as the user nobody (`setpriv`).
- `mv events.jsonl events.jsonl.2` under a live trainer: status, watch and the monitor report the
  `events_gone` anomaly while the trainer appends elsewhere, and the trainer starts a new events.jsonl at its
  next event, opening with a warning that says where the history went.

Real trainers (train_run start), real signals, real files and users.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest

from tests.helpers.common import REPO_ROOT, SMOKE_CONFIG, assert_user_error, child_env, describe, out_dir_set
from tests.helpers.reliability import TOOL, launched_runs, tool, wait_for
from tideborn.rundir.events import EventWriter, read_events
from tideborn.rundir.kinds import RunStarted, Step
from tideborn.tools import train_run

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# Goes on until stopped: a step event each step, no periodic checkpoints.
ENDLESS = ("runtime.max_steps=1000000", "optim.batch_size=16", "runtime.log_every=1",
           "runtime.checkpoint_every=1000000", "runtime.threads=1", "runtime.progress=plain")


def as_nobody_available() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run([*NOBODY, sys.executable, "-c", "import tideborn.tools.train_run, tideborn.tui.app"],
                           env=child_env(), cwd=REPO_ROOT, capture_output=True)
    return probe.returncode == 0


needs_nobody = pytest.mark.skipif(not as_nobody_available(),
                                  reason="needs root, setpriv, and a checkout the user nobody can read and run")


@pytest.fixture
def open_tmp() -> typing.Iterator[Path]:
    """A scratch directory the user nobody can reach (pytest's own are inside a 0700 directory of root's)."""
    path = Path(tempfile.mkdtemp(prefix="tideborn-run-tools-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def runs() -> typing.Iterator[list[Path]]:
    yield from launched_runs()


def start_endless(run_dir: Path, runs: list[Path]) -> int:
    runs.append(run_dir)
    result = tool("start", "--config", str(SMOKE_CONFIG), "--set", out_dir_set(run_dir),
                  *[arg for item in ENDLESS for arg in ("--set", item)])
    assert result.returncode == 0, describe(result)
    wait_for(lambda: sum(e["kind"] == "step" for e in read_events(run_dir / "events.jsonl")) >= 3, "three steps")
    return json.loads((run_dir / "train.pid").read_text())["pid"]


def stop_as_owner(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    """`train_run stop` by the run's owner, in this process (a process would cost its Python start): the run
    is stopped (exit status 0)."""
    code = train_run.main(["stop", "--out-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 0, f"exit {code}\n--- stdout\n{out}\n--- stderr\n{err}"


def as_nobody(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, *args], cwd=home, env=child_env({"HOME": str(home)}), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def tool_as_nobody(*args: str, home: Path) -> subprocess.CompletedProcess:
    return as_nobody(*TOOL, *args, home=home)


# -- must 5: other users get a line ---------------------------------------------------------------------------

MONITOR_STOP = r'''
import asyncio, sys, time
from pathlib import Path
from textual.notifications import Notify
from tideborn.tui.app import create_app
from tideborn.tui.options import TuiOptions


async def main():
    seen = []
    app = create_app(TuiOptions(run_dir=Path(sys.argv[1]), clock=time.time, use_nvml=False, follow=False))
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        deadline = time.monotonic() + 60
        while pilot.app.screen.state != "running" and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await pilot.press("x", "y")
        while time.monotonic() < deadline:
            shown = [m.notification for m in seen if isinstance(m, Notify)]
            if any(n.title == "cannot stop" for n in shown):
                break
            await pilot.pause(0.05)
    for m in seen:
        if isinstance(m, Notify):
            print(f"{m.notification.title}|{m.notification.message}")


asyncio.run(main())
'''


@needs_nobody
def test_another_users_trainer_is_not_stopped_and_the_line_says_whose_it_is(open_tmp: Path, runs: list[Path],
                                                                              capsys):
    run_dir = open_tmp / "roots-run"
    pid = start_endless(run_dir, runs)
    owner = rf"the trainer, pid {pid}, belongs to root \(uid 0\), and you are nobody \(uid 65534\): you cannot stop it"
    for extra in ([], ["--force", "--timeout", "0"]):
        result = tool_as_nobody("stop", "--out-dir", str(run_dir), *extra, home=open_tmp)
        assert result.returncode == 2, describe(result)
        assert_user_error(result.stderr, owner)
    script = open_tmp / "monitor_stop.py"
    script.write_text(MONITOR_STOP)
    result = as_nobody(sys.executable, str(script), str(run_dir), home=open_tmp)
    assert result.returncode == 0, describe(result)
    assert "Traceback" not in result.stdout + result.stderr, describe(result)
    assert any(line.startswith("cannot stop|") and "belongs to root (uid 0)" in line
               for line in result.stdout.splitlines()), describe(result)
    events = read_events(run_dir / "events.jsonl")
    assert not [e for e in events if e["kind"] in ("stop_requested", "run_stopped")]  # nothing was signalled
    assert os.kill(pid, 0) is None
    stop_as_owner(capsys, run_dir)  # its owner can


@needs_nobody
def test_another_users_unreadable_run_is_one_line_from_every_tool(open_tmp: Path, template_run: Path):
    run_dir = open_tmp / "roots-run"
    shutil.copytree(template_run, run_dir)
    (run_dir / "train.log").write_text("a trainer's output\n")
    (run_dir / "train.pid").write_text(json.dumps({"v": 1, "pid": 1, "start_time": 0.0, "host": "elsewhere",
                                                   "argv": [], "started_at": 0.0}))
    for mode in (0o700, 0o711, 0o744):  # not listable, or entries that cannot be examined
        run_dir.chmod(mode)
        for command in ("status", "watch", "stop"):
            result = tool_as_nobody(command, "--out-dir", str(run_dir), home=open_tmp)
            assert result.returncode == 2, describe(result)
            assert_user_error(result.stderr, rf"{run_dir}: cannot read the run directory: permission denied \(it "
                                             rf"belongs to root \(uid 0\), mode {mode:o}, and you are nobody")
        monitor = as_nobody(sys.executable, "-m", "tideborn.tui.app", str(run_dir), home=open_tmp)
        assert monitor.returncode == 2, describe(monitor)
        assert_user_error(monitor.stderr, "cannot read the run directory: permission denied")
    run_dir.chmod(0o755)
    (run_dir / "train.pid").chmod(0o600)
    for command in ("status", "watch", "stop"):
        result = tool_as_nobody(command, "--out-dir", str(run_dir), home=open_tmp)
        assert result.returncode == 2, describe(result)
        assert_user_error(result.stderr, r"train.pid: cannot read it: permission denied \(it belongs to root "
                                         r"\(uid 0\), mode 600")
    (run_dir / "train.pid").unlink()
    for name in ("events.jsonl", "train.log"):
        (run_dir / name).chmod(0o600)
    result = tool_as_nobody("status", "--out-dir", str(run_dir), "--json", home=open_tmp)
    assert result.returncode == 1, describe(result)
    assert result.stderr == ""
    messages = [a["message"] for a in json.loads(result.stdout)["anomalies"] if a["rule"] == "run_file"]
    assert sorted(messages) == [f"{name} cannot be read: permission denied (it belongs to root (uid 0), mode 600, "
                                "and you are nobody (uid 65534))" for name in ("events.jsonl", "train.log")]


# -- must 9: rename-style rotation is seen ----------------------------------------------------------------------

def test_a_live_trainer_continues_a_renamed_events_file_and_readers_see_the_gap(tmp_path: Path, runs: list[Path],
                                                                                capsys):
    from tideborn.rundir.state import RunTracker
    from tideborn.tui.follow import RunFollower
    from tideborn.tui.messages import AnomaliesFound, EventsArrived

    run_dir = tmp_path / "run"
    pid = start_endless(run_dir, runs)
    follower = RunFollower(run_dir, use_nvml=False)  # the monitor, following the run from before the rename
    follower.poll()
    watch_out = tmp_path / "watch.jsonl"
    with open(watch_out, "wb") as out:
        watch = subprocess.Popen([*TOOL, "watch", "--out-dir", str(run_dir)], stdout=out, stderr=subprocess.PIPE,
                                 env=child_env(), cwd=REPO_ROOT)
    try:
        wait_for(lambda: b'"kind":"step"' in watch_out.read_bytes(), "watch to stream steps")
        os.kill(pid, signal.SIGSTOP)  # held still, so that the moment between the rename and its next event lasts
        try:
            events = run_dir / "events.jsonl"
            moved = run_dir / "events.jsonl.2"
            os.rename(events, moved)
            report = RunTracker(run_dir, start="tail")
            report.refresh(keep_events=False)
            status = report.status().to_json()
            gone = [a for a in status["anomalies"] if a["rule"] == "events_gone"]
            assert status["state"] == "running" and len(gone) == 1, status
            assert f"appends its events to {moved}" in gone[0]["message"]
            assert train_run.main(["status", "--out-dir", str(run_dir)]) == 1
            found = [a for m in follower.poll() if isinstance(m, AnomaliesFound) for a in m.anomalies]
            assert [a.rule for a in found] == ["events_gone"]
            wait_for(lambda: b'"rule":"events_gone"' in watch_out.read_bytes(), "watch to report events_gone")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: any(e["kind"] == "step" for e in read_events(events)), "a step in the new events.jsonl")
        fresh = read_events(events)
        assert fresh[0]["kind"] == "warning" and fresh[0]["events_moved_to"] == str(moved), fresh[0]
        before = read_events(moved)
        assert before[0]["kind"] == "run_started"
        assert fresh[1]["step"] > max(e["step"] for e in before if e["kind"] == "step")
        report = RunTracker(run_dir, start="tail")
        report.refresh(keep_events=False)
        status = report.status().to_json()
        assert status["state"] == "running" and status["pid"] == pid and status["step"] >= fresh[1]["step"]
        assert not status["anomalies"], status["anomalies"]
        arrived = [m for m in follower.poll() if isinstance(m, EventsArrived)]
        assert arrived and arrived[0].reset and arrived[0].events[0]["kind"] == "warning"
        assert not follower.tracker.anomalies()
        stop_as_owner(capsys, run_dir)
        assert watch.wait(timeout=120) is not None
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        follower.close()
    streamed = [json.loads(line) for line in watch_out.read_text().splitlines()]
    kinds = [e["kind"] for e in streamed]
    assert kinds.index("anomaly") < kinds.index("warning") < kinds.index("run_stopped"), kinds
    assert read_events(events)[-1]["kind"] == "run_stopped"


def test_the_event_writer_starts_a_new_file_and_never_writes_into_one_planted_there(tmp_path: Path, capfd):
    events, moved, victim = tmp_path / "events.jsonl", tmp_path / "events.jsonl.1", tmp_path / "victim"
    victim.write_text("precious\n")
    writer = EventWriter(events)
    writer.emit(RunStarted, step=0)
    os.rename(events, moved)
    writer.emit(Step, step=1)
    assert [e["kind"] for e in read_events(moved)] == ["run_started"]
    assert [(e["kind"], e.get("step")) for e in read_events(events)] == [("warning", 1), ("step", 1)]
    capfd.readouterr()
    os.rename(events, tmp_path / "events.jsonl.2")
    for plant in (lambda: events.symlink_to(victim), lambda: os.mkfifo(events)):
        plant()
        writer.emit(Step, step=2)  # never through the link, never blocked on the FIFO
        writer.emit(Step, step=3)
        assert victim.read_text() == "precious\n"
        err = capfd.readouterr().err.splitlines()
        assert len(err) == 1 and "no new one can be started there" in err[0], err  # once, not every event
        events.unlink()
    writer.emit(Step, step=4)  # the planted thing gone: a new file again
    assert [e["kind"] for e in read_events(events)] == ["warning", "step"]
    assert [e["step"] for e in read_events(tmp_path / "events.jsonl.2") if e["kind"] == "step"] == [1, 2, 3, 2, 3]
    writer.close()
