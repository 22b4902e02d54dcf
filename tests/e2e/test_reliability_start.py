"""Starting a run, honestly: `train_run start` (and the TUI's start key) refuses a run with nothing to
train with the trainer's own message, waits for its trainer to begin and reports what really happened
(a terminal trainer that won the directory, a file only the trainer could refuse), tells a lock held by
a dead trainer's child from a live run, and a trainer whose `start` was killed before it wrote train.pid
records itself, so that `stop` finds it. Real trainers, real processes and signals throughout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
    SMOKE_CONFIG,
    TEMPLATE_SETS,
    assert_user_error,
    child_env,
    copy_run,
    describe,
    events_of,
    settings_args,
    trainer_in_process,
    tree,
    until,
)
from tests.helpers.data import hcpe_records, random_positions, write_records
from tests.helpers.reliability import TOOL, fault_env, launched_runs, process_gone, tool, wait_for, write_launch_file
from tideborn.errors import UserError
from tideborn.rundir.events import encode_event
from tideborn.rundir.files import read_pid_record
from tideborn.rundir.lock import held
from tideborn.tui.app import create_app
from tideborn.tui.options import TuiOptions
from tideborn.tui.screens.confirm import ConfirmScreen
from tideborn.tui.screens.dashboard import DashboardScreen

# A smoke run that goes on until it is stopped: a step event each step, no periodic saves.
ENDLESS = ("runtime.max_steps=1000000", "optim.batch_size=16", "runtime.log_every=1",
           "runtime.checkpoint_every=1000000", "runtime.threads=1", "runtime.progress=plain")


@pytest.fixture
def launched():
    yield from launched_runs()


@pytest.fixture
def pids():
    """Pids of processes a test started indirectly (a detached trainer, a forked child); SIGKILLed at the
    end if still the same process (psutil checks the start time, so a reused pid is left alone)."""
    found: list[psutil.Process] = []

    class Pids:
        def append(self, pid: int) -> None:
            found.append(psutil.Process(pid))

    yield Pids()
    for process in found:
        try:
            process.kill()
            process.wait(timeout=30)
        except psutil.NoSuchProcess:
            pass  # it ended on its own, as it should have


def holder_pid(run_dir: Path) -> int | None:
    """The pid the lock file names (JSON, or a bare pid), or None while it is being written."""
    text = (run_dir / ".trainer.lock").read_text().strip()
    try:
        return int(text) if text.isdigit() else int(json.loads(text)["pid"])
    except (ValueError, KeyError, TypeError):
        return None


def kinds(run_dir: Path) -> list[str]:
    return [e["kind"] for e in events_of(run_dir)] if (run_dir / "events.jsonl").exists() else []


def child_of(process: subprocess.Popen) -> int:
    """The first child of `process` (the trainer a `train_run start` has just forked)."""
    return wait_for(lambda: next((c.pid for c in psutil.Process(process.pid).children()), None),
                    "train_run start to launch its trainer", interval=0.002)


def finished_run(template_run: Path, tmp_path: Path) -> Path:
    """A copy of the template: finished at step 4 = runtime.max_steps, checkpoints at 2 and 4."""
    return copy_run(template_run, tmp_path / "run")


# -- MUST 4: nothing to train ----------------------------------------------------------------------------

def test_start_on_a_finished_run_refuses_with_the_trainers_message(template_run, tmp_path, launched):
    run_dir = finished_run(template_run, tmp_path)
    launched.append(run_dir)
    before = tree(run_dir)
    result = tool("start", *settings_args(run_dir, *TEMPLATE_SETS))
    assert result.returncode == 2, describe(result)
    line = assert_user_error(result.stderr, r"nothing to train: .*step-000000004\.pt is at step 4, "
                                            r"and runtime\.max_steps is 4")
    assert result.stdout == "" and tree(run_dir) == before  # nothing launched, nothing written
    # The trainer, asked the same, says the very same thing (in this process: only its answer is read).
    trained = trainer_in_process("train", *settings_args(run_dir, *TEMPLATE_SETS), cwd=tmp_path)
    assert trained.returncode == 0 and trained.stdout.strip() == line.split(": error: ", 1)[1]
    status = tool("status", "--out-dir", str(run_dir))
    assert status.returncode == 0 and "state       finished" in status.stdout, describe(status)


def test_start_refuses_a_stop_step_that_is_not_after_the_checkpoint(template_run, tmp_path, launched):
    run_dir = finished_run(template_run, tmp_path)
    launched.append(run_dir)
    before = tree(run_dir)
    result = tool("start", *settings_args(run_dir, *TEMPLATE_SETS, "runtime.max_steps=8"), "--stop-at-step", "3")
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, r"--stop-at-step 3: must be after the start step \(4\) and at most "
                                     r"runtime\.max_steps \(8\)")
    assert tree(run_dir) == before


def test_a_cut_short_newest_checkpoint_is_not_taken_for_the_end(template_run, tmp_path, launched):
    """The trainer skips a truncated step-4 checkpoint and resumes from step 2: start must let it."""
    run_dir = finished_run(template_run, tmp_path)
    launched.append(run_dir)
    newest = run_dir / "step-000000004.pt"
    newest.write_bytes(newest.read_bytes()[:1_000_000])
    result = tool("start", *settings_args(run_dir, *TEMPLATE_SETS))
    assert result.returncode == 0, describe(result)
    assert "at step 2" in result.stdout  # where the trainer resumed, from its run_started
    started = [e for e in events_of(run_dir) if e["kind"] == "run_started"][-1]
    assert started["step"] == 2 and started["resumed_from"].endswith("step-000000002.pt")


def test_what_only_the_trainer_can_judge_is_reported_from_the_trainer(template_run, tmp_path, launched):
    """A bit flipped inside a tensor of the step-4 checkpoint: a wrong CRC, which torch does not check, so
    the trainer loads it and has nothing to train. Without torch that cannot be known; start launches,
    waits, and refuses with the trainer's answer, leaving no train.pid behind."""
    run_dir = finished_run(template_run, tmp_path)
    launched.append(run_dir)
    newest = run_dir / "step-000000004.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x40
    newest.write_bytes(bytes(data))
    result = tool("start", *settings_args(run_dir, *TEMPLATE_SETS))
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, r"nothing to train: .*step-000000004\.pt is at step 4")
    assert "nothing to train" in (run_dir / "train.log").read_text()
    assert not (run_dir / "train.pid").exists() and not (run_dir / "launch.json").exists()
    assert tool("status", "--out-dir", str(run_dir)).returncode == 0


def test_start_reports_a_file_only_the_trainer_can_refuse(tmp_path, launched):
    """A --resume file whose name gives no step: only the trainer reads it; start waits and says what it said."""
    run_dir = tmp_path / "run"
    launched.append(run_dir)
    junk = tmp_path / "weights.pt"
    junk.write_bytes(b"PK\x03\x04 not really a zip archive")
    result = tool("start", *settings_args(run_dir, *ENDLESS), "--resume", str(junk))
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, r"--resume .*weights\.pt: corrupt or truncated checkpoint .*the trainer "
                                     r"refused to start; see .*train\.log")
    # Its output stays in train.log; no train.pid names a process that never ran the run.
    assert "weights.pt" in (run_dir / "train.log").read_text()
    assert not (run_dir / "train.pid").exists() and not (run_dir / "launch.json").exists()


def test_a_trainer_that_fails_before_training_is_reported_with_its_last_line(tmp_path, launched):
    """The disk fills up as the trainer writes run_started (injected ENOSPC): it took the directory and
    exits 1 with no run_started. start says so, exit 1, quoting its last line; train.pid stays, and status
    reports the attempt vanished."""
    run_dir = tmp_path / "run"
    launched.append(run_dir)
    result = subprocess.run([*TOOL, "start", *settings_args(run_dir, *ENDLESS)], cwd=REPO_ROOT,
                            env=child_env(fault_env(tmp_path, events="1,sticky")), capture_output=True, text=True,
                            timeout=180, stdin=subprocess.DEVNULL)
    assert result.returncode == 1, describe(result)
    (line,) = result.stderr.strip().splitlines()
    assert re.fullmatch(r"python -m tideborn\.tools\.train_run start: error: the trainer exited with status 1 "
                        r"before it started training: .*No space left on device.* \(see .*train\.log\)", line), line
    assert result.stdout == ""
    record = read_pid_record(run_dir)
    assert record is not None and process_gone(record.pid)
    status = tool("status", "--out-dir", str(run_dir))
    assert status.returncode == 1 and "state       vanished" in status.stdout, describe(status)


# -- MUST 4: the TUI's start key --------------------------------------------------------------------------

def tui_for(run_dir: Path):
    return create_app(TuiOptions(run_dir=run_dir, clock=time.time, use_nvml=False, follow=False))


def notices(messages: list) -> list[Notify]:
    return [m for m in messages if isinstance(m, Notify)]


async def test_tui_start_key_shows_the_refusal_and_keeps_running(template_run, tmp_path):
    run_dir = finished_run(template_run, tmp_path)
    write_launch_file(run_dir, *TEMPLATE_SETS)
    before = tree(run_dir)
    seen: list = []
    async with tui_for(run_dir).run_test(size=(110, 32), message_hook=seen.append) as pilot:
        screen = pilot.app.screen
        assert isinstance(screen, DashboardScreen)
        await until(pilot, screen.ready.is_set, "the dashboard to read the run")
        await pilot.press("s")
        refusal = await until(pilot, lambda: next((n for n in notices(seen) if n.notification.title == "cannot start"),
                                                  None), "the refusal")
        assert re.search(r"nothing to train: .*step-000000004\.pt is at step 4", refusal.notification.message)
        assert refusal.notification.severity == "error"
        assert isinstance(pilot.app.screen, DashboardScreen)  # no question asked, and the app goes on
        await pilot.press("m")
        assert pilot.app.is_running
    assert tree(run_dir) == before


async def test_tui_start_key_asks_first_and_launches_only_on_yes(template_run, tmp_path, launched):
    run_dir = finished_run(template_run, tmp_path)
    launched.append(run_dir)
    write_launch_file(run_dir, *TEMPLATE_SETS, "runtime.max_steps=6")
    seen: list = []
    async with tui_for(run_dir).run_test(size=(110, 32), message_hook=seen.append) as pilot:
        screen = pilot.app.screen
        await until(pilot, screen.ready.is_set, "the dashboard to read the run")
        await pilot.press("s")
        question = await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen) and pilot.app.screen,
                               "the start confirmation")
        assert f"Start a run in {run_dir}" in question.question
        assert "resumes from step-000000004.pt (step 4) to step 6" in question.question
        await pilot.press("n")
        assert isinstance(pilot.app.screen, DashboardScreen)
        await pilot.pause(0.5)
        assert not (run_dir / "train.pid").exists() and not (run_dir / "train.log").exists()  # declined
        await pilot.press("s")
        await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), "the start confirmation again")
        await pilot.press("y")
        started = await until(pilot, lambda: next((n for n in notices(seen) if n.notification.title == "start"),
                                                  None), "the start notice")
        record = read_pid_record(run_dir)
        assert record is not None and f"pid {record.pid}" in started.notification.message
        assert "at step 4" in started.notification.message
        await until(pilot, lambda: process_gone(record.pid), "the trainer to finish its two steps")
    assert kinds(run_dir)[-1] == "run_finished"


# -- MUST 5: a terminal trainer racing start ---------------------------------------------------------------

def test_start_racing_a_terminal_trainer_reports_the_real_outcome(tmp_path, start_trainer, pids):
    """start's checks find the directory free; a `tideborn train` in a terminal takes it before start's
    trainer does; start must say its trainer was refused, naming the terminal trainer."""
    run_dir = tmp_path / "run"
    starting = subprocess.Popen([*TOOL, "start", *settings_args(run_dir, *ENDLESS)], cwd=REPO_ROOT,
                                env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Its trainer is still importing torch: hold it there while the terminal trainer takes the directory.
        child = child_of(starting)
        pids.append(child)
        os.kill(child, signal.SIGSTOP)
        terminal = start_trainer("train", *settings_args(run_dir, *ENDLESS))
        wait_for(lambda: held(run_dir) and holder_pid(run_dir), "the terminal trainer to take the directory")
        assert holder_pid(run_dir) == terminal.pid
        os.kill(child, signal.SIGCONT)
        out, err = starting.communicate(timeout=180)
    finally:
        if starting.poll() is None:
            starting.kill()
            starting.wait()
    assert starting.returncode == 2, f"exit {starting.returncode}\n{out}\n{err}"
    assert out == ""
    assert_user_error(err, rf"another trainer is using this run directory: pid {terminal.pid} \(a trainer "
                           r"started outside train_run holds \.trainer\.lock\).*the trainer refused to start")
    assert process_gone(child)
    # No train.pid names the refused trainer: status reports the terminal trainer, running.
    assert not (run_dir / "train.pid").exists()
    wait_for(lambda: "step" in kinds(run_dir), "the terminal trainer's first step")
    status = tool("status", "--out-dir", str(run_dir), "--json")
    report = json.loads(status.stdout)
    assert status.returncode == 0 and report["state"] == "running" and report["pid"] == terminal.pid


# -- MUST 5: a lock held by a dead trainer's child ---------------------------------------------------------

@pytest.fixture
def teacher_data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    write_records(root / "train.hcpe", hcpe_records(random_positions(600, seed=3), seed=3))
    return root


def test_dataloader_workers_do_not_hold_the_trainer_lock(teacher_data, tmp_path, start_trainer):
    run_dir = tmp_path / "run"
    sets = (*ENDLESS, f"paths.data_root={json.dumps(str(teacher_data))}", 'data.kind="hcpe"',
            'data.train=["train.hcpe"]', "data.test=[]", "data.workers=2")
    trainer = start_trainer("train", *settings_args(run_dir, *sets))
    wait_for(lambda: "step" in kinds(run_dir), "the first step")
    workers = psutil.Process(trainer.pid).children()
    assert len(workers) >= 2, [w.cmdline() for w in workers]
    lock = str((run_dir / ".trainer.lock").resolve())
    assert any(f.path == lock for f in psutil.Process(trainer.pid).open_files())
    for worker in workers:
        assert all(f.path != lock for f in worker.open_files()), f"worker {worker.pid} holds {lock}"
    # SIGKILLed, the trainer leaves the directory free at once (its workers notice their orphaning later).
    trainer.send(signal.SIGKILL)
    trainer.wait()
    assert not held(run_dir)
    for worker in workers:
        try:
            worker.wait(timeout=60)
        except psutil.NoSuchProcess:
            pass  # already gone


LEFTOVER = r'''
import fcntl, json, os, socket, sys, time
import psutil
lock = sys.argv[1]
fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
me = psutil.Process()
os.write(fd, json.dumps({"pid": me.pid, "host": socket.gethostname(), "start_time": me.create_time(),
                         "launched_pid": None}).encode())
if os.fork() == 0:  # the child keeps the descriptor, and with it the lock, as a DataLoader worker did
    print(os.getpid(), flush=True)
    time.sleep(120)
    os._exit(0)
time.sleep(0.2)
os._exit(0)  # the trainer dies; its child lives on
'''


def test_a_lock_left_by_a_dead_trainers_child_is_told_as_such(tmp_path, pids):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", LEFTOVER, str(run_dir / ".trainer.lock")],
                            stdout=subprocess.PIPE, text=True)
    pids.append(int(dead.stdout.readline()))
    dead.wait(timeout=30)
    assert held(run_dir)
    result = tool("start", *settings_args(run_dir, *ENDLESS))
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, rf"a leftover child of dead trainer pid {dead.pid} .*still holds "
                                     r"\.trainer\.lock; it lets go within seconds")
    assert not (run_dir / "train.pid").exists()
    trained = trainer_in_process("train", *settings_args(run_dir, *ENDLESS), cwd=tmp_path)
    assert trained.returncode == 2
    assert_user_error(trained.stderr, rf"leftover child of dead trainer pid {dead.pid}")


# -- MUST 5: a start killed before it wrote train.pid -------------------------------------------------------

@pytest.mark.parametrize("left", ["no train.pid", "an earlier launch's train.pid"])
def test_a_trainer_whose_start_was_killed_records_itself_and_can_be_stopped(left, tmp_path, pids):
    run_dir = tmp_path / "run"
    starting = subprocess.Popen([*TOOL, "start", *settings_args(run_dir, *ENDLESS)], cwd=REPO_ROOT,
                                env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = child_of(starting)
    pids.append(child)
    os.kill(child, signal.SIGSTOP)  # still importing torch: it cannot have taken the directory yet
    starting.kill()
    starting.wait()
    # What a start killed before it wrote train.pid and launch.json leaves behind.
    (run_dir / "launch.json").unlink(missing_ok=True)
    if left == "no train.pid":
        (run_dir / "train.pid").unlink(missing_ok=True)
    else:
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        earlier = {"v": 1, "pid": int(gone.stdout), "start_time": time.time() - 3600, "host": os.uname().nodename,
                   "argv": ["x"], "started_at": time.time() - 3600, "cwd": "/", "log_offset": 0}
        (run_dir / "train.pid").write_text(json.dumps(earlier))
        with open(run_dir / "events.jsonl", "ab") as events:
            events.write(encode_event("run_started", {"step": 0, "pid": earlier["pid"], "host": earlier["host"],
                                                      "max_steps": 10}, now=time.time() - 3500))
            events.write(encode_event("run_stopped", {"step": 0, "reason": "SIGTERM"}, now=time.time() - 3400))
    os.kill(child, signal.SIGCONT)

    wait_for(lambda: "step" in kinds(run_dir), "the orphaned trainer's first step")
    record = read_pid_record(run_dir)
    assert record is not None and record.pid == child, "the trainer did not record itself in train.pid"
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["overrides"][-len(ENDLESS):] == list(ENDLESS)
    status = tool("status", "--out-dir", str(run_dir), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running", describe(status)
    stopped = tool("stop", "--out-dir", str(run_dir), "--timeout", "60")
    assert stopped.returncode == 0, describe(stopped)
    assert f"sent SIGTERM to pid {child}" in stopped.stdout and "the run ended: run_stopped" in stopped.stdout
    assert kinds(run_dir)[-1] == "run_stopped"


def test_the_torch_free_mark_is_the_checkpoint_format():
    from tideborn.network.checkpoint import FORMAT
    from tideborn.trainer.preflight import CHECKPOINT_FORMAT_MARK

    assert CHECKPOINT_FORMAT_MARK == FORMAT.encode()


def test_the_start_check_agrees_with_the_trainer_on_every_checkpoint_state(template_run, tmp_path):
    """`check_start_step` (no torch) against `newest_loadable` (torch): the file the trainer resumes from,
    or no answer where only torch can tell; never another file."""
    from tideborn.config.load import load_settings
    from tideborn.network.checkpoint import newest_loadable
    from tideborn.trainer.preflight import check_start_step

    settings = load_settings(str(SMOKE_CONFIG), [*TEMPLATE_SETS, "runtime.max_steps=2"], environ={},
                             cwd=tmp_path).settings

    def flip(data: bytes, at: int) -> bytes:
        return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]

    cases = {"whole": (lambda data: data, True), "empty": (lambda data: b"", True),
             "cut": (lambda data: data[:1000], True), "foreign zip": (lambda data: _foreign_zip(tmp_path), True),
             "tensor bit": (lambda data: flip(data, len(data) // 2), False),
             "pickle bit": (lambda data: flip(data, 100), False), "not a zip": (lambda data: b"\x80\x02junk", False)}
    for name, (damage, answers) in cases.items():
        run_dir = shutil.copytree(template_run, tmp_path / name)
        newest = run_dir / "step-000000004.pt"
        newest.write_bytes(damage(newest.read_bytes()))
        used, _, _ = newest_loadable(run_dir)
        assert used is not None
        try:
            told: object = check_start_step(settings, run_dir)
        except UserError as exc:
            told = str(exc)
        if told is None:
            assert not answers, f"{name}: no answer"
            continue
        assert re.fullmatch(rf"nothing to train: {re.escape(str(used))} is at step \d.*", told), (name, told)


def _foreign_zip(tmp_path: Path) -> bytes:
    import zipfile

    path = tmp_path / "foreign.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    return path.read_bytes()
