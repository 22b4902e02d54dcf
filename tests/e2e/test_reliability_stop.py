"""Stopping a run reliably: a second stop never kills a save, a clock step never hides a live run, and a
stopped (SIGSTOP) trainer is named as such.

- Repeated SIGTERMs while the trainer is writing its stop checkpoint are ignored (and noted); a repeated
  Ctrl-C waits for the save; a second `train_run stop`, and `stop --force`, wait for the stop in progress
  instead of signalling again, and `--force` kills only after a save completes or `--save-timeout`.
- The process is identified by its start in clock ticks since boot, which a clock step does not move:
  a train.pid whose wall-clock start time is 20 s off (what a stepped clock looks like) is still the
  run, while a pid whose boot-relative start differs is another process; evidence shows both.
- The monitor does not offer Stop again while a stop is in progress.

Real trainers, real signals, real files. To hit the save for certain, a test-only `sitecustomize.py`
(below) holds each `torch.save` of the trainer after writing its bytes, while its temp file is still
there, until the test releases it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from textual.notifications import Notify

from tests.helpers.common import (
    REPO_ROOT,
    child_env,
    describe,
    events_of,
    settings_args,
    step_events,
    terminal_events,
    until,
)
from tests.helpers.reliability import WAIT_SECONDS, launched_runs, process_gone, wait_for
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir.files import boot_relative_start, process_facts, process_start_ticks, read_pid_record, this_host
from tideborn.rundir.layout import list_checkpoints, temp_checkpoints
from tideborn.tools import train_run

TOOL = [sys.executable, "-m", "tideborn.tools.train_run"]
# Goes on until stopped: a step event each step, no periodic checkpoints (the stop's is the only save).
ENDLESS = ("runtime.max_steps=1000000", "optim.batch_size=16", "runtime.log_every=1",
           "runtime.checkpoint_every=1000000", "runtime.threads=1", "runtime.progress=plain")

HELD_SAVE_SITE = r'''
"""Test-only (tests/e2e/test_reliability_stop.py): with TIDEBORN_TEST_HOLD_SAVES_UNTIL=PATH, every torch.save
of this process, once it has written its bytes, waits until PATH exists (at most 10 minutes), while the
checkpoint's temp file is in place: a test can signal the trainer in the middle of a save for certain."""
import importlib.abc
import importlib.machinery
import os
import sys
import time


def _hold(torch):
    release = os.environ["TIDEBORN_TEST_HOLD_SAVES_UNTIL"]
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        result = real_save(obj, f, *args, **kwargs)
        if hasattr(f, "flush"):
            f.flush()
        deadline = time.monotonic() + 600
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)  # signal handlers run here, as they would between a long save's writes
        return result

    torch.save = save


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            _hold(module)

        spec.loader.exec_module = patched
        return spec


if os.environ.get("TIDEBORN_TEST_HOLD_SAVES_UNTIL"):
    sys.meta_path.insert(0, _AfterTorch())
'''


def held_save_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Environment for a trainer whose saves wait for the returned path to exist (touch it to release)."""
    site = tmp_path / "held-save-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HELD_SAVE_SITE)
    release = tmp_path / "release-saves"
    env = child_env({"PYTHONPATH": os.pathsep.join(filter(None, [str(site), str(REPO_ROOT),
                                                                 os.environ.get("PYTHONPATH")])),
                     "TIDEBORN_TEST_HOLD_SAVES_UNTIL": str(release)})
    return env, release


@pytest.fixture
def launched():
    yield from launched_runs()


@pytest.fixture
def processes():
    """Processes the test starts; killed (and reaped) at the end."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(argv, env=env or child_env(), stdin=subprocess.DEVNULL, **kwargs)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
        process.wait(timeout=30)


def start_run(launched: list[Path], run_dir: Path, env: dict[str, str] | None = None) -> int:
    """`train_run start` with ENDLESS; the trainer's pid once it has logged its first step."""
    launched.append(run_dir)
    result = subprocess.run([*TOOL, "start", *settings_args(run_dir, *ENDLESS)], cwd=REPO_ROOT,
                            env=env or child_env(), capture_output=True, text=True, timeout=WAIT_SECONDS)
    assert result.returncode == 0, describe(result)
    record = read_pid_record(run_dir)
    assert record is not None
    wait_for(lambda: step_events(events_of(run_dir)) if (run_dir / "events.jsonl").exists() else None,
             "the first step event")
    return record.pid


def call(capsys, *args: str) -> tuple[int, str, str]:
    code = train_run.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def kinds(run_dir: Path) -> list[str]:
    return [e["kind"] for e in events_of(run_dir)]


def assert_stopped_cleanly(run_dir: Path, reason: str) -> dict:
    """The stop's checkpoint is complete and loadable, no temp file is left, and run_stopped names it."""
    events = events_of(run_dir)
    stopped = events[-1]
    assert stopped["kind"] == "run_stopped" and stopped["reason"] == reason, stopped
    assert terminal_events(events) == [stopped]
    checkpoint = run_dir / f"step-{stopped['step']:09d}.pt"
    assert stopped["checkpoint"] == str(checkpoint)
    assert list_checkpoints(run_dir)[-1] == (stopped["step"], checkpoint)
    assert load_checkpoint(checkpoint)["step"] == stopped["step"]
    assert temp_checkpoints(run_dir) == []
    return stopped


def saving(run_dir: Path) -> list[Path]:
    return temp_checkpoints(run_dir)


# -- the trainer: a repeated signal never cuts a save ------------------------------------------------------

def start_trainer(processes, tmp_path: Path, run_dir: Path) -> tuple[subprocess.Popen, Path]:
    """A trainer started in a terminal's way (no train.pid), its saves held; (process, release path)."""
    env, release = held_save_env(tmp_path)
    with open(tmp_path / "trainer.err", "wb") as err:
        trainer = processes([sys.executable, "-m", "tideborn.trainer", "train", *settings_args(run_dir, *ENDLESS)],
                            env=env, stdout=subprocess.DEVNULL, stderr=err)
    wait_for(lambda: (run_dir / "events.jsonl").exists() and step_events(events_of(run_dir)), "the first step")
    return trainer, release


def test_repeated_sigterm_during_the_stop_save_is_ignored_and_noted(tmp_path, processes):
    run_dir = tmp_path / "run"
    trainer, release = start_trainer(processes, tmp_path, run_dir)

    trainer.send_signal(signal.SIGTERM)
    wait_for(lambda: saving(run_dir), "the stop's checkpoint save to begin")
    for repeat in (1, 2):  # one at a time: two pending SIGTERMs would merge into one
        trainer.send_signal(signal.SIGTERM)
        wait_for(lambda n=repeat: kinds(run_dir).count("warning") == n or trainer.poll() is not None,
                 f"repeat {repeat} to be noted")
    assert trainer.poll() is None and saving(run_dir)  # still alive, still in the save
    release.touch()

    assert trainer.wait(timeout=WAIT_SECONDS) == 0, (tmp_path / "trainer.err").read_text()
    stopped = assert_stopped_cleanly(run_dir, "SIGTERM")
    assert stopped["repeated_signals"] == ["SIGTERM", "SIGTERM"]
    events = events_of(run_dir)
    (requested,) = [e for e in events if e["kind"] == "stop_requested"]
    assert requested["signal"] == "SIGTERM" and isinstance(requested["requested_at"], float)
    warnings = [e for e in events if e["kind"] == "warning"]
    assert len(warnings) == 2 and all("ignored, the stop goes on" in w["message"] for w in warnings)
    assert kinds(run_dir).index("stop_requested") < kinds(run_dir).index("checkpoint_saved")
    assert "SIGTERM again while the SIGTERM stop is in progress: ignored" in (tmp_path / "trainer.err").read_text()


def test_a_second_ctrl_c_during_the_save_waits_for_it(tmp_path, processes):
    run_dir = tmp_path / "run"
    trainer, release = start_trainer(processes, tmp_path, run_dir)

    trainer.send_signal(signal.SIGINT)
    wait_for(lambda: saving(run_dir), "the stop's checkpoint save to begin")
    trainer.send_signal(signal.SIGINT)
    wait_for(lambda: "warning" in kinds(run_dir) or trainer.poll() is not None, "the second Ctrl-C to be noted")
    assert trainer.poll() is None and saving(run_dir)
    release.touch()

    assert trainer.wait(timeout=WAIT_SECONDS) == 0, (tmp_path / "trainer.err").read_text()
    stopped = assert_stopped_cleanly(run_dir, "SIGINT")
    assert stopped["repeated_signals"] == ["SIGINT"]
    (warning,) = [e for e in events_of(run_dir) if e["kind"] == "warning"]
    assert "ends as soon as the save is complete" in warning["message"]


# -- train_run stop: a stop in progress is waited for, never signalled again --------------------------------

def test_second_stop_and_stop_force_wait_for_the_save_in_progress(tmp_path, launched, processes, capsys):
    run_dir = tmp_path / "run"
    env, release = held_save_env(tmp_path)
    pid = start_run(launched, run_dir, env=env)
    first = processes([*TOOL, "stop", "--out-dir", str(run_dir), "--timeout", str(WAIT_SECONDS)],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    wait_for(lambda: saving(run_dir), "the stop's checkpoint save to begin")
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir))
    assert code == 0 and "state       running" in out and "stopping    SIGTERM at " in out, out
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    assert json.loads(out)["stop_requested"]["signal"] == "SIGTERM"

    code, out, err = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "0.2")
    assert code == 1, out + err
    assert f"a stop is already in progress: pid {pid} got SIGTERM" in out and "not signalling it again" in out
    assert "sent SIGTERM" not in out
    assert "still running after 0.2 s" in out and "a checkpoint save is in progress (.step-" in out

    forced = processes([*TOOL, "stop", "--out-dir", str(run_dir), "--timeout", "0.2", "--force",
                        "--save-timeout", str(WAIT_SECONDS)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    assert forced.stdout is not None
    said = []
    while line := forced.stdout.readline():  # until --force says it waits for the save
        said.append(line)
        if "a checkpoint save is in progress" in line:
            break
    assert "waiting up to" in said[-1] and "for it to complete before SIGKILL" in said[-1], said
    release.touch()
    out, err = forced.communicate(timeout=WAIT_SECONDS)
    out = "".join(said) + out
    assert forced.returncode == 0, out + err
    assert "a stop is already in progress" in out and "sent SIGTERM" not in out and "sent SIGKILL" not in out
    assert "the run ended: run_stopped" in out

    first_out, first_err = first.communicate(timeout=WAIT_SECONDS)
    assert first.returncode == 0, first_out + first_err
    assert f"sent SIGTERM to pid {pid}" in first_out and "the run ended: run_stopped" in first_out
    stopped = assert_stopped_cleanly(run_dir, "SIGTERM")
    assert stopped["repeated_signals"] == []  # neither later stop signalled the trainer
    assert kinds(run_dir).count("stop_requested") == 1


def test_stop_force_kills_a_save_only_after_the_save_timeout_and_says_so(tmp_path, launched, capsys):
    run_dir = tmp_path / "run"
    env, _release = held_save_env(tmp_path)  # never released: a save that hangs
    pid = start_run(launched, run_dir, env=env)
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: saving(run_dir), "the stop's checkpoint save to begin")
    code, out, err = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "0", "--force",
                          "--save-timeout", "1")
    assert code == 1, out + err
    assert "a stop is already in progress" in out and "sent SIGTERM" not in out
    assert "a checkpoint save is in progress (.step-" in out and "waiting up to 1 s (--save-timeout)" in out
    assert f"sent SIGKILL to pid {pid} as its checkpoint save did not complete within --save-timeout 1 s" in out
    assert "is left; the next run removes it" in out
    assert process_gone(pid)


def test_stop_force_without_a_save_in_progress_kills_after_the_timeout(tmp_path, processes, capsys):
    deaf = processes([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert deaf.stdout is not None and deaf.stdout.readline() == "ready\n"
    run_dir = tmp_path / "run"
    write_pid_file(run_dir, deaf.pid)
    code, out, _ = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "0.3", "--force")
    assert code == 1 and f"sent SIGKILL to pid {deaf.pid} after 0.3 s (no checkpoint save was in progress)" in out
    assert deaf.wait(timeout=10) == -signal.SIGKILL


def test_stop_force_after_a_save_completed_kills_only_once_the_grace_is_over(tmp_path, processes):
    """A trainer that finished its save but does not exit (here: a process that ignores SIGTERM, with a
    checkpoint temp file of its pid that the test removes, as a completed save renames it away)."""
    deaf = processes([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert deaf.stdout is not None and deaf.stdout.readline() == "ready\n"
    run_dir = tmp_path / "run"
    write_pid_file(run_dir, deaf.pid)
    temp = run_dir / f".step-000000005.pt.tmp-{deaf.pid}"
    temp.write_bytes(b"PK" * 1000)
    (run_dir / f".step-000000004.pt.tmp-{deaf.pid + 1}").write_bytes(b"stale")  # another pid's: not ours
    forced = processes([*TOOL, "stop", "--out-dir", str(run_dir), "--timeout", "0.2", "--force"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    assert forced.stdout is not None
    said = []
    while line := forced.stdout.readline():
        said.append(line)
        if "a checkpoint save is in progress" in line:
            break
    assert f"({temp.name}, 0 MB so far)" in said[-1], said
    assert deaf.poll() is None
    temp.unlink()  # the save completed
    out, err = forced.communicate(timeout=WAIT_SECONDS)
    assert forced.returncode == 1, out + err
    assert (f"sent SIGKILL to pid {deaf.pid} after its checkpoint save completed (step-000000005.pt), as it had "
            "not exited 10 s later") in out
    assert deaf.wait(timeout=10) == -signal.SIGKILL


def test_same_process_trusts_start_ticks_over_the_wall_clock():
    from tideborn.rundir.anomaly import ProcessFacts, same_process, vanished

    live = ProcessFacts(pid=10, running=True, create_time=1020.0, name="python", start_ticks=5000, boot_id="b1")
    assert same_process(live, start_time=1000.0, start_ticks=5000, boot_id="b1")  # the clock moved 20 s
    assert not same_process(live, start_time=1020.0, start_ticks=4999, boot_id="b1")  # another process
    assert not same_process(live, start_time=1020.0, start_ticks=5000, boot_id="b0")  # a reboot since
    assert same_process(live, start_time=1020.0)  # an old train.pid: the wall clock, as before
    assert not same_process(live, start_time=1000.0)
    derived = ProcessFacts(pid=10, running=True, create_time=1020.0, start_ticks=5050, start_ticks_slack=100)
    assert same_process(derived, start_ticks=5000) and not same_process(derived, start_ticks=4800)
    gone = vanished(live, ended=False, now=5.0, start_time=1000.0, start_ticks=4000, boot_id="b1")
    assert gone is not None
    assert (gone.evidence["expected_start_ticks"], gone.evidence["actual_start_ticks"]) == (4000, 5000)
    assert (gone.evidence["expected_start_time"], gone.evidence["actual_start_time"]) == (1000.0, 1020.0)


# -- SIGSTOP ----------------------------------------------------------------------------------------------

def test_stop_of_a_sigstopped_trainer_says_so_and_how_to_continue_it(tmp_path, launched, capsys):
    run_dir = tmp_path / "run"
    pid = start_run(launched, run_dir)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: process_facts(pid).status == psutil.STATUS_STOPPED, "the trainer to be stopped")
        code, out, err = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "30")
        assert code == 1, out + err
        assert f"sent SIGTERM to pid {pid}" in out
        assert f"pid {pid} is stopped (SIGSTOP" in out and f"kill -CONT {pid}" in out
        assert "run_stopped" not in kinds(run_dir)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Continued, it acts on the SIGTERM that waited; a second stop sends nothing: it waits for that stop,
    # or, when the small test run has already finished it, says so.
    wait_for(lambda: "stop_requested" in kinds(run_dir), "the waiting SIGTERM to be handled")
    code, out, err = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", str(WAIT_SECONDS))
    assert "sent SIGTERM" not in out, out + err
    assert (code == 0 and "the run ended: run_stopped" in out) or (
        code == 3 and "it already ended (run_stopped" in out + err), (code, out + err)
    assert_stopped_cleanly(run_dir, "SIGTERM")


# -- process identity across a clock step -----------------------------------------------------------------

def write_pid_file(run_dir: Path, pid: int, start_time: float | None = None, **identity) -> None:
    """train.pid for `pid`: its real start unless told otherwise; `identity` replaces start_ticks/boot_id
    (None leaves them out, as a train.pid from before they existed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    real = {"start_time": psutil.Process(pid).create_time(), **boot_relative_start(pid)}
    record = {"v": 1, "pid": pid, "host": this_host(), "argv": ["x"], "started_at": time.time(), "cwd": "/",
              "log_offset": 0, **real, **identity}
    if start_time is not None:
        record["start_time"] = start_time
    (run_dir / "train.pid").write_text(json.dumps({k: v for k, v in record.items() if v is not None}))


def test_start_ticks_are_read_from_proc_and_agree_with_psutil(tmp_path, processes):
    # A command name with spaces and parentheses: /proc/PID/stat's fields are counted from its last ")".
    odd = tmp_path / "tb ) (x y"
    odd.symlink_to(sys.executable)
    sleeper = processes([str(odd), "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                        stdout=subprocess.PIPE, text=True)
    assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"
    ticks = process_start_ticks(sleeper.pid)
    assert ticks is not None and process_facts(sleeper.pid).name.startswith("tb ) (x")
    since_boot = psutil.Process(sleeper.pid).create_time() - psutil.boot_time()
    assert abs(ticks / os.sysconf("SC_CLK_TCK") - since_boot) < 1.5  # boot time is in whole seconds
    assert process_start_ticks(os.getpid()) != ticks
    record = read_pid_record_of(tmp_path / "run", sleeper.pid)
    assert record.start_ticks == ticks and record.boot_id == process_facts(sleeper.pid).boot_id


def read_pid_record_of(run_dir: Path, pid: int):
    write_pid_file(run_dir, pid)
    record = read_pid_record(run_dir)
    assert record is not None
    return record


def test_a_clock_step_does_not_make_a_live_run_vanish(tmp_path, launched, capsys):
    run_dir = tmp_path / "run"
    pid = start_run(launched, run_dir)
    record = json.loads((run_dir / "train.pid").read_text())
    assert isinstance(record["start_ticks"], int) and record["boot_id"]
    # After the clock is stepped 20 s, psutil reads the process's start 20 s off what train.pid recorded.
    record["start_time"] -= 20.0
    (run_dir / "train.pid").write_text(json.dumps(record))

    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 0 and report["state"] == "running" and report["anomalies"] == [], report
    code, out, err = call(capsys, "stop", "--out-dir", str(run_dir), "--timeout", str(WAIT_SECONDS))
    assert code == 0, out + err
    assert f"sent SIGTERM to pid {pid}" in out and "the run ended: run_stopped" in out
    assert_stopped_cleanly(run_dir, "SIGTERM")


def test_a_run_started_in_a_terminal_survives_a_clock_step_too(tmp_path, processes, capsys):
    """No train.pid: the run_started event records the trainer's boot-relative start."""
    run_dir = tmp_path / "run"
    trainer = processes([sys.executable, "-m", "tideborn.trainer", "train", *settings_args(run_dir, *ENDLESS)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (run_dir / "events.jsonl").exists() and step_events(events_of(run_dir)), "the first step")
    started = events_of(run_dir)[0]
    assert started["start_ticks"] == process_start_ticks(trainer.pid) and started["boot_id"]
    # Rewrite the run as a clock stepped back 20 s after the trainer started would have written it.
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    first["time"] -= 20.0
    (run_dir / "events.jsonl").write_text(json.dumps(first) + "\n" + "".join(lines[1:]))
    code, out, _ = call(capsys, "status", "--out-dir", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 0 and report["state"] == "running", report


def test_a_pid_that_cannot_be_identified_is_never_signalled_and_stop_says_how_by_pid(tmp_path, processes, capsys):
    sleeper = processes([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
                        stdout=subprocess.PIPE, text=True)
    assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"
    ticks = process_start_ticks(sleeper.pid)
    assert ticks is not None

    # The same wall-clock start, another boot-relative one: the pid was reused (the clock had moved).
    reused = tmp_path / "reused"
    write_pid_file(reused, sleeper.pid, start_ticks=ticks - 5000)
    code, out, _ = call(capsys, "status", "--out-dir", str(reused), "--json")
    report = json.loads(out)
    assert code == 1 and report["state"] == "vanished"
    (anomaly,) = report["anomalies"]
    evidence = anomaly["evidence"]
    assert evidence["expected_start_ticks"] == ticks - 5000 and evidence["actual_start_ticks"] == ticks
    assert evidence["expected_start_time"] == pytest.approx(evidence["actual_start_time"])
    assert f"started {ticks} clock ticks after boot, not {ticks - 5000}: the pid was reused" in anomaly["message"]
    code, _, err = call(capsys, "stop", "--out-dir", str(reused), "--force", "--timeout", "0")
    assert code == 3 and "nothing was signalled" in err
    assert f"since boot: {ticks} ticks, recorded {ticks - 5000}" in err
    assert f"stop it by pid: kill -TERM {sleeper.pid}" in err

    # A train.pid from before start ticks, 20 s off: reuse and a clock step look alike; stop says so.
    old = tmp_path / "old"
    write_pid_file(old, sleeper.pid, start_time=psutil.Process(sleeper.pid).create_time() - 20,
                   start_ticks=None, boot_id=None)
    assert "start_ticks" not in json.loads((old / "train.pid").read_text())
    code, out, _ = call(capsys, "status", "--out-dir", str(old))
    assert code == 1 and "state       vanished" in out and "or the clock was stepped since" in out
    code, _, err = call(capsys, "stop", "--out-dir", str(old))
    assert code == 3 and "nothing was signalled" in err and f"kill -TERM {sleeper.pid}" in err
    assert sleeper.poll() is None


# -- the monitor ----------------------------------------------------------------------------------------------

COUNTER = ("import signal, sys, time\n"
           "def note(signum, frame):\n"
           "    with open(sys.argv[1], 'a') as f: f.write('TERM\\n')\n"
           "signal.signal(signal.SIGTERM, note)\n"
           "print('ready', flush=True)\n"
           "while True: time.sleep(1)\n")


async def test_the_monitor_does_not_offer_stop_again_while_stopping(tmp_path, processes):
    from tideborn.tui.app import create_app
    from tideborn.tui.options import TuiOptions
    from tideborn.tui.screens.confirm import ConfirmScreen
    from tideborn.tui.screens.dashboard import DashboardScreen

    received = tmp_path / "sigterms"
    slow = processes([sys.executable, "-c", COUNTER, str(received)], stdout=subprocess.PIPE, text=True)
    assert slow.stdout is not None and slow.stdout.readline() == "ready\n"
    run_dir = tmp_path / "live"
    write_pid_file(run_dir, slow.pid)
    seen: list = []
    app = create_app(TuiOptions(run_dir=run_dir, clock=time.time, use_nvml=False, follow=False))
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        screen = pilot.app.screen
        assert isinstance(screen, DashboardScreen)
        await until(pilot, lambda: screen.state == "running", "the run to be read")
        assert screen.check_action("stop", ())
        await pilot.press("x", "y")
        await until(pilot, lambda: received.exists(), "the SIGTERM")
        await until(pilot, lambda: "stopping, SIGTERM" in screen.header.text().plain, "the header to say stopping")
        assert not screen.check_action("stop", ())  # not offered: the footer no longer shows x Stop
        await pilot.press("x")
        await pilot.pause(0.2)
        assert not isinstance(pilot.app.screen, ConfirmScreen)
        await pilot.press("y")
        await pilot.pause(0.5)
    assert received.read_text() == "TERM\n"  # one SIGTERM, however often x and y were pressed
    shown = [m.notification.message for m in seen if isinstance(m, Notify)]
    assert any("the run is stopping already (SIGTERM" in n and f"kill -KILL {slow.pid}" in n for n in shown)


async def test_the_monitor_sees_a_stop_sent_from_elsewhere(tmp_path, processes):
    from tideborn.rundir.events import encode_event
    from tideborn.tui.app import create_app
    from tideborn.tui.options import TuiOptions
    from tideborn.tui.screens.confirm import ConfirmScreen

    sleeper = processes([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
                        stdout=subprocess.PIPE, text=True)
    assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"
    run_dir = tmp_path / "live"
    write_pid_file(run_dir, sleeper.pid)
    now = time.time()
    with open(run_dir / "events.jsonl", "wb") as handle:
        handle.write(encode_event("run_started", {"step": 0, "pid": sleeper.pid, "host": this_host(),
                                                  "max_steps": 100}, now=now))
        handle.write(encode_event("stop_requested", {"step": 3, "signal": "SIGTERM", "requested_at": now},
                                  now=now))
    app = create_app(TuiOptions(run_dir=run_dir, clock=time.time, use_nvml=False, follow=False))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = pilot.app.screen
        await until(pilot, lambda: screen.state == "running", "the run to be read")
        assert "stopping, SIGTERM" in screen.header.text().plain
        assert not screen.check_action("stop", ())
        await pilot.press("x")
        await pilot.pause(0.2)
        assert not isinstance(pilot.app.screen, ConfirmScreen)
    assert sleeper.poll() is None


