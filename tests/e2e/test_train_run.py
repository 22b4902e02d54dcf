"""train_run start/status/stop/watch against real trainers and signals, and against crafted run dirs.

Every process a test starts is killed in a finalizer; run directories live in tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.common import REPO_ROOT, assert_user_error, child_env, describe, events_of, settings_args
from tests.helpers.reliability import launched_runs
from tideborn.rundir.events import encode_event
from tideborn.rundir.files import process_facts, read_pid_record
from tideborn.tools import train_run

TOOL = [sys.executable, "-m", "tideborn.tools.train_run"]
WAIT_SECONDS = 600  # a hung run fails the test instead of hanging the suite; not a performance threshold
# A smoke run that goes on until it is stopped: small steps, a step event each step, no periodic saves.
ENDLESS = ("runtime.max_steps=1000000", "optim.batch_size=16", "runtime.log_every=1",
           "runtime.checkpoint_every=1000000", "runtime.threads=1")


def tool(*args: str, timeout: float = WAIT_SECONDS) -> subprocess.CompletedProcess:
    return subprocess.run([*TOOL, *args], cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def call(capsys, *args: str) -> tuple[int, str, str]:
    """The tool in this process (quicker than a subprocess); returns (exit status, stdout, stderr)."""
    code = train_run.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def wait_for(condition, what: str, timeout: float = WAIT_SECONDS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def kinds(run_dir: Path) -> list[str]:
    return [e["kind"] for e in events_of(run_dir)] if (run_dir / "events.jsonl").exists() else []


def listing(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run_dir.rglob("*"))}


@pytest.fixture
def launched():
    yield from launched_runs()


@pytest.fixture
def processes():
    """Helper processes (sleepers standing in for a trainer); killed at the end."""
    started: list[subprocess.Popen] = []

    def start(seconds: int = 120, ignore_sigterm: bool = False) -> subprocess.Popen:
        deaf = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignore_sigterm else ""
        process = subprocess.Popen([sys.executable, "-c", f"{deaf}import time; print('ready', flush=True); "
                                    f"time.sleep({seconds})"], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def start_run(launched: list[Path], run_dir: Path, *sets: str, extra: tuple[str, ...] = ()) -> int:
    launched.append(run_dir)
    result = tool("start", *settings_args(run_dir, *sets), *extra)
    assert result.returncode == 0, describe(result)
    record = read_pid_record(run_dir)
    assert record is not None and f"pid {record.pid}" in result.stdout
    assert str(run_dir) in result.stdout and "status --out-dir" in result.stdout
    return record.pid


def write_events(run_dir: Path, *events: tuple[str, dict, float]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "events.jsonl", "ab") as handle:
        for kind, fields, when in events:
            handle.write(encode_event(kind, fields, now=when))


def write_pid_file(run_dir: Path, pid: int, start_time: float, started_at: float | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"v": 1, "pid": pid, "start_time": start_time, "host": os.uname().nodename, "argv": ["x"],
              "started_at": start_time if started_at is None else started_at, "cwd": "/", "log_offset": 0}
    (run_dir / "train.pid").write_text(json.dumps(record))


def finished_run(run_dir: Path, losses: list[object], warmup: int = 0) -> None:
    """A crafted run that ended normally (pid 1 wrote it: a process that is certainly not a trainer)."""
    now = time.time() - 100
    events = [("run_started", {"step": 0, "pid": 1, "host": os.uname().nodename, "max_steps": len(losses) * 10,
                               "batch_size": 64}, now)]
    for i, loss in enumerate(losses, start=1):
        events.append(("step", {"step": i * 10, "loss": loss, "policy_loss": 1.0, "value_loss": 0.5}, now + i))
    events.append(("run_finished", {"step": len(losses) * 10, "checkpoint": None}, now + len(losses) + 1))
    write_events(run_dir, *events)


# -- real trainers ----------------------------------------------------------------------------------

def test_start_status_stop_then_resume_and_watch(tmp_path, launched, capsys):
    run_dir = tmp_path / "run"
    pid = start_run(launched, run_dir, *ENDLESS)
    assert (run_dir / "launch.json").exists() and (run_dir / "train.log").exists()
    launch = json.loads((run_dir / "launch.json").read_text())
    assert "runtime.max_steps=1000000" in launch["overrides"]
    wait_for(lambda: "step" in kinds(run_dir), "the first step event")

    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert code == 0, out
    assert f"running (pid {pid}" in out and "/ 1,000,000" in out and "loss" in out
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 0 and report["state"] == "running" and report["pid"] == pid and report["anomalies"] == []
    assert report["step"] >= 1 and report["max_steps"] == 1_000_000 and report["loss"]["loss"] > 0

    pid_file = (run_dir / "train.pid").read_bytes()
    code, _, err = call(capsys, "start", *settings_args(run_dir, *ENDLESS))  # refused before any launch
    assert code == 2
    assert_user_error(err, rf"already going there: pid {pid} ")
    assert (run_dir / "train.pid").read_bytes() == pid_file

    code, out, err = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "60")
    assert code == 0, out + err
    assert f"sent SIGTERM to pid {pid}" in out and "the run ended: run_stopped" in out and "(SIGTERM)" in out
    events = events_of(run_dir)
    stopped = events[-1]
    assert stopped["kind"] == "run_stopped" and stopped["reason"] == "SIGTERM"
    assert (run_dir / f"step-{stopped['step']:09d}.pt").exists()

    before = listing(run_dir)
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert code == 0 and "state       stopped" in out and f"step {stopped['step']}" in out
    code, out, err = call(capsys, "stop", "--out-dir", str(run_dir))
    assert code == 3 and "not running" in err
    assert listing(run_dir) == before  # status and a refused stop never write in the run dir

    # Started again, it resumes from the stop's checkpoint; watch follows it to its end.
    target = stopped["step"] + 3
    start_run(launched, run_dir, *ENDLESS, extra=("--stop-at-step", str(target)))
    code, watched, err = call(capsys, "watch", "--out-dir", str(run_dir))
    assert code == 0, watched + err
    lines = [json.loads(line) for line in watched.splitlines()]
    assert [e["kind"] for e in lines].count("run_started") == 2
    assert lines[-1]["kind"] == "run_stopped" and lines[-1]["step"] == target
    resumed = [e for e in lines if e["kind"] == "run_started"][-1]
    assert resumed["resumed_from"].endswith(f"step-{stopped['step']:09d}.pt") and resumed["step"] == stopped["step"]
    if shutil.which("jq"):
        parsed = subprocess.run(["jq", "-c", ".kind"], input=watched, capture_output=True, text=True)
        assert parsed.returncode == 0 and parsed.stdout.splitlines()[-1] == '"run_stopped"'


def test_sigkilled_trainer_is_reported_vanished(tmp_path, launched, capsys):
    run_dir = tmp_path / "run"
    pid = start_run(launched, run_dir, *ENDLESS)
    wait_for(lambda: "step" in kinds(run_dir), "the first step event")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not process_facts(pid).running, "the trainer to die")
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 1 and report["state"] == "vanished"
    (anomaly,) = report["anomalies"]
    assert anomaly["rule"] == "vanished" and f"process {pid} is gone" in anomaly["message"]
    assert anomaly["evidence"]["last_kind"] == "step"
    code, _, err = call(capsys, "stop", "--out-dir", str(run_dir))
    assert code == 3 and "not running" in err


def test_a_trainer_started_in_a_terminal_is_seen_and_guarded(tmp_path, start_trainer, capsys):
    run_dir = tmp_path / "run"
    trainer = start_trainer("train", *settings_args(run_dir, *ENDLESS))
    wait_for(lambda: "step" in kinds(run_dir), "the first step event")
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 0 and report["state"] == "running" and report["pid"] == trainer.pid and not report["pid_file"]
    code, _, err = call(capsys, "start", *settings_args(run_dir, *ENDLESS))
    assert code == 2
    assert_user_error(err, rf"already going there: pid {trainer.pid} ")
    assert not (run_dir / "train.pid").exists() and not (run_dir / "train.log").exists()
    code, _, err = call(capsys, "stop", "--out-dir", str(run_dir))
    assert code == 3 and "no train.pid" in err
    trainer.send(signal.SIGKILL)
    trainer.wait()
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert code == 1 and "state       vanished" in out and f"process {trainer.pid} is gone" in out


# -- crafted run directories ------------------------------------------------------------------------

def test_reused_pid_is_vanished_and_never_signalled(tmp_path, processes, capsys):
    other = processes()
    real_start = psutil.Process(other.pid).create_time()
    run_dir = tmp_path / "run"
    write_pid_file(run_dir, other.pid, start_time=real_start - 3600)  # that pid was another process then
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert code == 1 and "state       vanished" in out and "the pid was reused" in out
    code, _, err = call(capsys, "stop", "--out-dir", str(run_dir), "--force", "--timeout", "0")
    assert code == 3 and "belongs to another process" in err and "nothing was signalled" in err
    assert other.poll() is None


def test_stop_waits_then_force_kills_a_process_that_ignores_sigterm(tmp_path, processes, capsys):
    deaf = processes(ignore_sigterm=True)
    run_dir = tmp_path / "run"
    write_pid_file(run_dir, deaf.pid, start_time=psutil.Process(deaf.pid).create_time())
    code, out, _ = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "0.3")
    assert code == 1 and f"sent SIGTERM to pid {deaf.pid}" in out and "still running after 0.3 s" in out
    assert deaf.poll() is None
    code, out, _ = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "0.3", "--force")
    assert code == 1 and f"sent SIGKILL to pid {deaf.pid}" in out and "exited without writing a terminal event" in out
    assert deaf.wait(timeout=10) == -signal.SIGKILL


def test_silent_live_process_is_stalled_past_the_threshold(tmp_path, processes, capsys):
    sleeper = processes()
    created = psutil.Process(sleeper.pid).create_time()
    run_dir = tmp_path / "run"
    write_pid_file(run_dir, sleeper.pid, start_time=created, started_at=time.time() - 60)
    write_events(run_dir, ("run_started", {"step": 0, "pid": sleeper.pid, "host": os.uname().nodename,
                                           "max_steps": 100}, time.time() - 50))
    (run_dir / "train.log").write_text("training...\n")
    quiet_since = time.time() - 30
    for name in ("events.jsonl", "train.log"):
        os.utime(run_dir / name, (quiet_since, quiet_since))
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert code == 0 and "state       running" in out  # 30 s of silence is fine by the 15-minute default
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json", "--stall-seconds", "2")
    report = json.loads(out)
    assert code == 1 and report["state"] == "stalled"
    assert [a["rule"] for a in report["anomalies"]] == ["stalled"]
    assert report["anomalies"][0]["evidence"]["quiet_seconds"] >= 29


def test_planted_nan_is_an_anomaly(tmp_path, capsys):
    run_dir = tmp_path / "run"
    finished_run(run_dir, [8.0, 7.0, "nan", "nan"])
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 1 and report["state"] == "finished"
    (anomaly,) = report["anomalies"]
    assert anomaly["rule"] == "nonfinite_loss" and anomaly["evidence"]["step"] == 40
    assert anomaly["evidence"]["loss"] == "nan" and report["loss"]["loss"] == "nan"


def test_planted_divergence_is_an_anomaly(tmp_path, capsys):
    run_dir = tmp_path / "run"
    finished_run(run_dir, [8.0 - i * 0.2 for i in range(30)] + [9.0] * 20)
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert code == 0, out  # not past the default warm-up of 1000 steps
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--divergence-warmup-steps", "100")
    assert code == 1 and "! divergence: smoothed loss" in out


def test_log_errors_are_reported_with_line_numbers(tmp_path, capsys):
    run_dir = tmp_path / "run"
    finished_run(run_dir, [3.0, 2.9])
    (run_dir / "train.log").write_text(
        "training 2x32\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n"
        "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1, unhandled cuda error\n"
        "Traceback (most recent call last):\n"
        '  File "loop.py", line 1, in run\n'
        "RuntimeError: CUDA error: device-side assert triggered\n")
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 1
    found = {(a["rule"], a["evidence"]["line"]) for a in report["anomalies"]}
    assert found == {("cuda_oom", 2), ("nccl_error", 3), ("traceback", 4), ("cuda_error", 6)}
    traceback = next(a for a in report["anomalies"] if a["rule"] == "traceback")
    assert traceback["evidence"]["exception"] == "RuntimeError: CUDA error: device-side assert triggered"
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert "train.log line 2: torch.OutOfMemoryError: CUDA out of memory" in out


def test_status_never_writes(tmp_path, processes, capsys):
    run_dir = tmp_path / "run"
    finished_run(run_dir, [3.0, "nan"])
    (run_dir / "train.log").write_text("Traceback (most recent call last):\n")
    sleeper = processes()
    write_pid_file(run_dir, sleeper.pid, start_time=psutil.Process(sleeper.pid).create_time() - 100)
    before = listing(run_dir)
    time.sleep(0.01)
    for extra in ((), ("--json",), ("--stall-seconds", "0.001")):
        code, _, _ = call(capsys, "status", "--out-dir", str(run_dir), *extra)
        assert code == 1
    assert listing(run_dir) == before
    assert sleeper.poll() is None


@pytest.mark.parametrize("command", ["status", "stop", "watch"])
def test_no_run_in_the_directory(tmp_path, command, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = call(capsys, command, "--out-dir", str(empty))
    assert code == 3 and "no run here" in err
    code, out, err = call(capsys, command, "--out-dir", str(tmp_path / "missing"))
    assert code == 3 and "no such directory" in err
    assert not (tmp_path / "missing").exists() and list(empty.iterdir()) == []


def test_status_json_for_no_run_and_the_tideborn_run_command(tmp_path):
    result = subprocess.run([str(Path(sys.executable).parent / "tideborn"), "run", "status", "--out-dir",
                             str(tmp_path), "--json"], capture_output=True, text=True, env=child_env())
    assert result.returncode == 3, describe(result)
    assert json.loads(result.stdout)["state"] == "not started"


@pytest.mark.parametrize("sets, pattern", [
    (("optim.lr=-1",), r"optim\.lr must be > 0"),
    (("runtime.max_step=3",), r"unknown key runtime\.max_step \(did you mean runtime\.max_steps\?\)"),
])
def test_bad_settings_launch_nothing(tmp_path, sets, pattern, capsys):
    run_dir = tmp_path / "run"
    code, out, err = call(capsys, "start", *settings_args(run_dir, *sets))
    assert code == 2 and out == ""
    assert_user_error(err, pattern)
    assert not run_dir.exists()
    code, _, err = call(capsys, "start", "--config", str(tmp_path / "nope.toml"), "--set",
                        f"runtime.out_dir={str(run_dir)!r}")
    assert code == 2 and "config file not found" in err and not run_dir.exists()


def test_watch_streams_a_crafted_run_through_a_torn_line_and_a_truncated_log(tmp_path, processes):
    sleeper = processes()
    run_dir = tmp_path / "run"
    write_pid_file(run_dir, sleeper.pid, start_time=psutil.Process(sleeper.pid).create_time())
    write_events(run_dir, ("run_started", {"step": 0, "pid": sleeper.pid, "host": os.uname().nodename,
                                           "max_steps": 20}, time.time()))
    (run_dir / "train.log").write_text("line one\nline two\nline three\n")
    torn = encode_event("step", {"step": 10, "loss": 2.0, "policy_loss": 1.5, "value_loss": 0.5})
    with open(run_dir / "events.jsonl", "ab") as handle:
        handle.write(torn[:20])
    watch = subprocess.Popen([*TOOL, "watch", "--out-dir", str(run_dir), "--stall-seconds", "600"], cwd=REPO_ROOT,
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(watch.stdout.readline())
        assert first["kind"] == "run_started"
        with open(run_dir / "events.jsonl", "ab") as handle:
            handle.write(torn[20:])
        assert json.loads(watch.stdout.readline())["step"] == 10
        (run_dir / "train.log").write_text("CUDA error: launch failure\n")  # truncated and rewritten
        anomaly = json.loads(watch.stdout.readline())
        assert anomaly["kind"] == "anomaly" and anomaly["rule"] == "cuda_error" and anomaly["evidence"]["line"] == 1
        write_events(run_dir, ("run_finished", {"step": 20, "checkpoint": None}, time.time()))
        assert json.loads(watch.stdout.readline())["kind"] == "run_finished"
        assert watch.wait(timeout=30) == 1  # it ended with the run, and an anomaly was seen
    finally:
        watch.kill()
        watch.wait()


def test_watch_reports_a_vanished_process_and_ends(tmp_path, processes):
    sleeper = processes()
    run_dir = tmp_path / "run"
    write_pid_file(run_dir, sleeper.pid, start_time=psutil.Process(sleeper.pid).create_time())
    result_holder = subprocess.Popen([*TOOL, "watch", "--out-dir", str(run_dir), "--format", "text"],
                                     cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        sleeper.kill()
        sleeper.wait()
        out, _ = result_holder.communicate(timeout=30)
        assert result_holder.returncode == 1
        assert "ANOMALY vanished: process" in out
    finally:
        result_holder.kill()
        result_holder.wait()


def test_run_tools_do_not_import_torch():
    modules = ["tideborn.rundir.anomaly", "tideborn.rundir.files", "tideborn.rundir.state", "tideborn.tools.control",
               "tideborn.tools.train_run"]
    code = f"import json, sys, {', '.join(modules)}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env=child_env())
    loaded = set(json.loads(result.stdout))
    assert "torch" not in loaded and "textual" not in loaded


def test_an_exited_child_not_yet_reaped_counts_as_gone(processes):
    child = processes()  # our own child: it stays a zombie until we wait for it, as a TUI's launch would
    os.kill(child.pid, signal.SIGKILL)
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, "the child to become a zombie")
    assert not process_facts(child.pid).running


@pytest.mark.parametrize("with_pid_file", [True, False])
def test_status_of_a_long_run_reads_the_tail_yet_keeps_session_and_line_numbers(tmp_path, capsys, with_pid_file):
    from tideborn.rundir.state import EVENTS_TAIL_BYTES, LOG_TAIL_BYTES

    run_dir = tmp_path / "run"
    steps = EVENTS_TAIL_BYTES // 80  # crafted step events are ~120 bytes: run_started lies outside the tail
    finished_run(run_dir, [2.0] * steps)
    assert (run_dir / "events.jsonl").stat().st_size > EVENTS_TAIL_BYTES * 1.2
    if with_pid_file:
        write_pid_file(run_dir, 1, start_time=0.0, started_at=0.0)
        record = json.loads((run_dir / "train.pid").read_text())
        record["events_inode"] = (run_dir / "events.jsonl").stat().st_ino
        (run_dir / "train.pid").write_text(json.dumps(record))
    filler = "step 10/100 | loss 2.0000 | all is well\n"
    lines = LOG_TAIL_BYTES // len(filler) + 500
    (run_dir / "train.log").write_text(filler * lines + "RuntimeError: CUDA error: misaligned address\n")
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert report["tail_only"] and report["state"] == "finished" and report["max_steps"] == steps * 10
    assert report["events_read"] < steps
    found = [(a["rule"], a["evidence"]["line"]) for a in report["anomalies"]]
    assert code == 1 and found == [("cuda_error", lines + 1)]


def test_log_errors_of_an_earlier_launch_are_not_reported(tmp_path, capsys):
    run_dir = tmp_path / "run"
    finished_run(run_dir, [3.0])
    old = "torch.OutOfMemoryError: CUDA out of memory\n"
    (run_dir / "train.log").write_text(old + "=== a new launch\nall good\n")
    write_pid_file(run_dir, 1, start_time=0.0, started_at=0.0)
    record = json.loads((run_dir / "train.pid").read_text())
    record["log_offset"] = len(old)
    (run_dir / "train.pid").write_text(json.dumps(record))
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    assert code == 0 and json.loads(out)["anomalies"] == []
