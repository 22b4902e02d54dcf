"""Readers against what a run directory may really hold: files rotated under a live run, and contents that
are not what they should be.

- copytruncate log rotation (copy the file, truncate it in place) while a real writer keeps appending: every
  reader starts the file again from its first line, even when the file grew past the old offset before the
  next read; `status`, `stop` and `watch` keep the run's identity through it, against a real trainer.
- JSON nested 100,000 deep, events.jsonl / train.log / train.pid that are a FIFO or a directory, and an
  `archive` that is a file: status, watch, stop, the tracker and the TUI give a line or an anomaly, never a
  traceback or a hang.

Hangs fail through timeouts (subprocess timeouts and pytest-timeout), never through timing assertions.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from tests.helpers.common import REPO_ROOT, child_env, describe, settings_args
from tests.helpers.reliability import launched_runs
from tideborn.rundir.events import EventReader, encode_event, read_events
from tideborn.rundir.files import LogReader, read_pid_record
from tideborn.rundir.layout import EVENTS_FILE, LOG_FILE, PID_FILE
from tideborn.rundir.state import RunTracker
from tideborn.tools import train_run

TOOL = [sys.executable, "-m", "tideborn.tools.train_run"]
WAIT_SECONDS = 600  # a reader or run that never gets there fails the test; not a performance threshold
ENDLESS = ("runtime.max_steps=1000000", "optim.batch_size=16", "runtime.log_every=1",
           "runtime.checkpoint_every=1000000", "runtime.threads=1")
DEEP = b"[" * 100_000


def tool(*args: str, timeout: float = WAIT_SECONDS) -> subprocess.CompletedProcess:
    return subprocess.run([*TOOL, *args], cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def tool_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """The tool's `main(args)` in this process, as its process would end (a process costs its Python start
    each time). An exception it lets out fails the test, as a traceback would; a hang meets the test's
    timeout (pytest-timeout) instead of the subprocess's."""
    capsys.readouterr()
    try:
        code = train_run.main(list(args))
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([*TOOL, *args], code, out, err)


def wait_for(condition: typing.Callable[[], object], what: str, timeout: float = WAIT_SECONDS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def copytruncate(path: Path, suffix: str = ".1") -> Path:
    """What logrotate's copytruncate does: copy the file aside, then truncate it in place (same inode)."""
    rotated = path.with_name(path.name + suffix)
    shutil.copyfile(path, rotated)
    os.truncate(path, 0)
    return rotated


def first_line(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.readline().rstrip(b"\n")


def one_line_error(stderr: str, pattern: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert pattern in lines[0], stderr


# -- rotation under a live writer ---------------------------------------------------------------------------

WRITER = r'''
import os, socket, sys, time
from tideborn.rundir.events import encode_event
run_dir, stop = sys.argv[1], sys.argv[2]
events = os.open(os.path.join(run_dir, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
log = os.open(os.path.join(run_dir, "train.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(events, encode_event("run_started", {"step": 0, "pid": os.getpid(), "host": socket.gethostname(),
                                              "max_steps": 10**9, "batch_size": 1, "seq": -1}))
seq = 0
while not os.path.exists(stop):
    os.write(events, encode_event("step", {"step": seq + 1, "seq": seq, "loss": 1.0, "policy_loss": 0.5,
                                           "value_loss": 0.5, "padding": "x" * (seq % 50)}))
    os.write(log, f"step {seq + 1} seq {seq}\n".encode())
    seq += 1
    time.sleep(0.001)
os.write(events, encode_event("run_finished", {"step": seq, "seq": seq, "checkpoint": None}))
'''


@pytest.fixture
def live_writer(tmp_path: Path):
    """A process appending a step event and a log line every millisecond or so, until told to finish."""
    run_dir, stop = tmp_path / "run", tmp_path / "stop"
    run_dir.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(stop)], cwd=REPO_ROOT, env=child_env())
    wait_for(lambda: (run_dir / LOG_FILE).exists() and (run_dir / LOG_FILE).stat().st_size > 0, "the writer")
    yield run_dir, writer, stop
    stop.touch()
    try:
        writer.wait(timeout=30)
    except subprocess.TimeoutExpired:
        writer.kill()
        writer.wait()


def test_every_reader_starts_a_copytruncated_file_again_even_once_it_grew_past_the_old_offset(live_writer):
    """The reader's offset lands inside the new content: size alone cannot tell, the first bytes do."""
    from tideborn.tui.follow import RunFollower
    from tideborn.tui.messages import EventsArrived, LogLinesArrived

    run_dir, writer, stop = live_writer
    events_path, log_path = run_dir / EVENTS_FILE, run_dir / LOG_FILE
    wait_for(lambda: events_path.stat().st_size > 20_000, "some events")
    reader, log_reader = EventReader(events_path), LogReader(log_path)
    tracker = RunTracker(run_dir, start="beginning")
    follower = RunFollower(run_dir, use_nvml=False)
    before = reader.read_new()
    log_reader.read_new()
    tracker.refresh()
    follower.poll()
    assert before and before[0]["kind"] == "run_started" and reader.malformed == 0
    offsets = {events_path: max(reader.offset, tracker.events.offset, follower.tracker.events.offset),
               log_path: max(log_reader.offset, follower.log.offset)}

    for path in offsets:
        copytruncate(path)
    for path, offset in offsets.items():  # the writer goes on: let it pass the old offsets before any read
        wait_for(lambda p=path, o=offset: p.stat().st_size > o + 2000, f"{path.name} to grow past its old offset")
    new_first_event = json.loads(first_line(events_path))
    new_first_log_line = first_line(log_path).decode()
    assert new_first_event["kind"] == "step" and new_first_event["seq"] > before[-1]["seq"]

    def check_events(events: list[dict], who: str) -> None:
        assert events, who
        assert events[0]["seq"] == new_first_event["seq"], f"{who} did not start again at the new first line"
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"{who}: events missing or repeated"

    after = reader.read_new()
    check_events(after, "EventReader")
    assert reader.restarts == 1 and reader.malformed == 0
    lines = log_reader.read_new()
    assert log_reader.restarts == 1 and lines[0] == (1, new_first_log_line)

    update = tracker.refresh()
    check_events(update.events, "RunTracker")
    assert tracker.events.malformed == 0 and tracker.events_rotated
    report = tracker.status().to_json()
    assert report["events_rotated"] and report["launch_started"] and not report["run_started_missing"]
    assert report["max_steps"] == 10**9  # the run_started read before the rotation is kept

    messages = follower.poll()
    arrived = [m for m in messages if isinstance(m, EventsArrived)]
    logged = [m for m in messages if isinstance(m, LogLinesArrived)]
    assert len(arrived) == 1 and arrived[0].reset and follower.tracker.events.malformed == 0
    check_events(arrived[0].events, "the TUI's RunFollower")
    assert len(logged) == 1 and logged[0].reset and logged[0].lines[0][:2] == (1, new_first_log_line)

    stop.touch()
    assert writer.wait(timeout=WAIT_SECONDS) == 0
    final = reader.read_new()
    assert final[-1]["kind"] == "run_finished" and reader.malformed == 0
    seqs = [e["seq"] for e in after + final]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


@pytest.fixture
def launched():
    yield from launched_runs()


def steps_in(path: Path) -> int:
    return sum(1 for e in read_events(path) if e["kind"] == "step") if path.exists() else 0


def test_status_stop_and_watch_keep_a_real_run_through_copytruncate(tmp_path: Path, launched, capsys) -> None:
    run_dir = tmp_path / "run"
    launched.append(run_dir)
    started = tool("start", *settings_args(run_dir, *ENDLESS))
    assert started.returncode == 0, describe(started)
    pid = read_pid_record(run_dir).pid
    events_path, log_path = run_dir / EVENTS_FILE, run_dir / LOG_FILE
    wait_for(lambda: steps_in(events_path) >= 3, "the first steps")
    watch = subprocess.Popen([*TOOL, "watch", "--out-dir", str(run_dir)], cwd=REPO_ROOT, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        selector = selectors.DefaultSelector()
        selector.register(watch.stdout, selectors.EVENT_READ)
        assert selector.select(timeout=WAIT_SECONDS), "watch printed nothing"
        # watch is frozen while the file is rotated and grows past anything watch can have read.
        watch.send_signal(signal.SIGSTOP)
        old_size = events_path.stat().st_size
        rotated = copytruncate(events_path)
        copytruncate(log_path)
        wait_for(lambda: events_path.stat().st_size > old_size + 2000, "events.jsonl to grow past its old size")
        watch.send_signal(signal.SIGCONT)
        new_first = json.loads(first_line(events_path))
        assert new_first["kind"] == "step" and read_events(rotated)[0]["kind"] == "run_started"

        status = tool_here(capsys, "status", "--out-dir", str(run_dir))
        assert status.returncode == 0, describe(status)
        assert f"running (pid {pid} " in status.stdout and "no run_started" not in status.stdout, status.stdout
        assert "events.jsonl does not begin with run_started" in status.stdout
        report = json.loads(tool_here(capsys, "status", "--out-dir", str(run_dir), "--json").stdout)
        assert report["state"] == "running" and report["pid"] == pid and report["launch_started"]
        assert report["events_rotated"] and report["run_started_missing"] and report["step"] >= new_first["step"]

        stop = tool_here(capsys, "stop", "--out-dir", str(run_dir), "--timeout", "60")
        assert stop.returncode == 0, describe(stop)
        assert "the run ended: run_stopped at step" in stop.stdout and "(SIGTERM)" in stop.stdout, stop.stdout
        out, err = watch.communicate(timeout=WAIT_SECONDS)
    finally:
        if watch.poll() is None:
            watch.send_signal(signal.SIGCONT)
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, err.decode()
    watched = [json.loads(line) for line in out.decode().splitlines()]
    assert watched[0]["kind"] == "run_started"
    assert new_first in watched, "watch did not read the rotated file again from its first line"
    after = watched[watched.index(new_first):]
    steps = [e["step"] for e in after if e["kind"] == "step"]
    assert steps == list(range(steps[0], steps[0] + len(steps))), "watch skipped or repeated events"
    assert after[-1]["kind"] == "run_stopped" and after[-1]["reason"] == "SIGTERM"
    assert not any(e["kind"] == "anomaly" for e in watched)


# -- odd contents -------------------------------------------------------------------------------------------

def ended_run(run_dir: Path, *middle: bytes) -> None:
    """A run that ended (pid 1 wrote it: certainly not a trainer), with `middle` lines amid its events."""
    run_dir.mkdir(parents=True, exist_ok=True)
    now = time.time() - 100
    with open(run_dir / EVENTS_FILE, "wb") as handle:
        handle.write(encode_event("run_started", {"step": 0, "pid": 1, "host": os.uname().nodename,
                                                  "max_steps": 20, "batch_size": 4}, now))
        handle.write(encode_event("step", {"step": 10, "loss": 1.0, "policy_loss": 0.5, "value_loss": 0.5}, now + 1))
        for line in middle:
            handle.write(line + b"\n")
        handle.write(encode_event("run_finished", {"step": 20, "checkpoint": None}, now + 2))


@pytest.mark.timeout(WAIT_SECONDS)
def test_json_nested_100000_deep_is_one_malformed_line_to_every_reader(tmp_path: Path, capsys) -> None:
    """It raised RecursionError in status, watch, stop and the TUI (which then exited 0)."""
    from tideborn.tui.follow import RunFollower
    from tideborn.tui.history import load_history

    run_dir = tmp_path / "run"
    deep_field = b'{"kind":"eval","step":15,"x":' + DEEP + b"}"
    ended_run(run_dir, DEEP, deep_field, b'{"kind":"warning","step":15,"message":"' + DEEP + b'"}')
    tracker = RunTracker(run_dir)
    kinds = [e["kind"] for e in tracker.refresh().events]
    assert kinds == ["run_started", "step", "warning", "run_finished"] and tracker.events.malformed == 2
    status = tool_here(capsys, "status", "--out-dir", str(run_dir), "--json")
    assert status.returncode == 0 and "Traceback" not in status.stderr, describe(status)
    report = json.loads(status.stdout)
    assert report["state"] == "finished" and report["events_malformed"] == 2
    watch = tool_here(capsys, "watch", "--out-dir", str(run_dir))
    assert watch.returncode == 0 and "Traceback" not in watch.stderr, describe(watch)
    assert [json.loads(line)["kind"] for line in watch.stdout.splitlines()] == kinds
    stop = tool_here(capsys, "stop", "--out-dir", str(run_dir))
    assert stop.returncode == 3 and "already ended (run_finished at step 20)" in stop.stderr, describe(stop)
    follower = RunFollower(run_dir, use_nvml=False)
    follower.poll()
    assert follower.tracker.events.malformed == 2 and follower.tracker.state == "finished"
    history = load_history(run_dir / EVENTS_FILE, (run_dir / EVENTS_FILE).stat().st_size, 0.9)
    assert history is not None and history.points() == 1

    (run_dir / PID_FILE).write_bytes(DEEP)
    for command in ("status", "watch", "stop"):
        result = tool_here(capsys, command, "--out-dir", str(run_dir))
        assert result.returncode == 2, describe(result)
        one_line_error(result.stderr, "train.pid: not a train.pid written by train_run start")
        assert "nested deeper than 100 levels" in result.stderr
    follower = RunFollower(run_dir, use_nvml=False)
    follower.poll()
    problems = [a for a in follower.tracker.anomalies() if a.rule == "run_file"]
    assert problems and "train.pid cannot be read" in problems[0].message


def make_odd(path: Path, what: str) -> None:
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
        (path / "inside.jsonl").write_bytes(b'{"kind":"step","step":1}\n')


@pytest.mark.timeout(WAIT_SECONDS)
@pytest.mark.parametrize("what", ["fifo", "directory"])
@pytest.mark.parametrize("name", [EVENTS_FILE, LOG_FILE])
def test_a_fifo_or_directory_for_a_run_file_is_an_anomaly_never_a_hang(tmp_path: Path, name: str, what: str,
                                                                         capsys) -> None:
    """status hung on a FIFO (and watch, and the TUI's follower); a directory raised IsADirectoryError."""
    from tideborn.tui.follow import RunFollower
    from tideborn.tui.messages import AnomaliesFound

    run_dir = tmp_path / "run"
    if name == LOG_FILE:
        ended_run(run_dir)
    else:
        run_dir.mkdir()
        (run_dir / LOG_FILE).write_text("a log line\n")
    make_odd(run_dir / name, what)
    kind = "a FIFO (named pipe)" if what == "fifo" else "a directory"
    message = f"run_file: {name} cannot be read: {kind}, not a regular file"

    status = tool_here(capsys, "status", "--out-dir", str(run_dir))
    assert status.returncode == 1 and "Traceback" not in status.stderr, describe(status)
    assert f"! {message}" in status.stdout, status.stdout
    report = json.loads(tool_here(capsys, "status", "--out-dir", str(run_dir), "--json").stdout)
    assert [a["evidence"] for a in report["anomalies"]] == [{"file": name, "problem": f"{kind}, not a regular file"}]
    if name == LOG_FILE:
        assert report["state"] == "finished"  # the events are read all the same

    # watch says so as an anomaly line (and, for a run that never ends, keeps following it)
    watch = subprocess.Popen([*TOOL, "watch", "--out-dir", str(run_dir), "--format", "text"], cwd=REPO_ROOT,
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if name == LOG_FILE:
            out, err = watch.communicate(timeout=60)
            assert watch.returncode == 1 and "Traceback" not in err, err
        else:
            out = watch.stdout.readline()  # blocks until watch prints: a hung watch fails on the timeout
        assert f"ANOMALY {message}" in out, out
    finally:
        if watch.poll() is None:
            watch.kill()
        watch.communicate()

    follower = RunFollower(run_dir, use_nvml=False)
    found = [a for m in follower.poll() if isinstance(m, AnomaliesFound) for a in m.anomalies]
    assert [a.rule for a in found] == ["run_file"] and found[0].evidence["file"] == name


@pytest.mark.timeout(WAIT_SECONDS)
@pytest.mark.parametrize("what", ["fifo", "directory", "nested"])
def test_a_train_pid_that_is_a_fifo_a_directory_or_nested_json_is_one_line_exit_2(tmp_path: Path, what,
                                                                                  capsys) -> None:
    run_dir = tmp_path / "run"
    ended_run(run_dir)
    if what == "nested":
        (run_dir / PID_FILE).write_bytes(b'{"pid":' + DEEP)
    else:
        make_odd(run_dir / PID_FILE, what)
    for command in ("status", "stop", "watch"):
        result = tool_here(capsys, command, "--out-dir", str(run_dir))
        assert result.returncode == 2, describe(result)
        one_line_error(result.stderr, f"{run_dir / PID_FILE}: ")


async def test_the_tui_shows_odd_run_files_as_anomalies_and_keeps_running(tmp_path: Path) -> None:
    """Each used to end the app (a worker's RecursionError, IsADirectoryError or UserError) or hang it."""
    from tideborn.tui.app import create_app
    from tideborn.tui.options import TuiOptions
    from tideborn.tui.screens.dashboard import DashboardScreen
    from tideborn.tui.widgets.anomalies import AnomalyList

    cases: dict[str, tuple[typing.Callable[[Path], None], str | None]] = {
        "deep events": (lambda d: ended_run(d, DEEP), None),
        "deep train.pid": (lambda d: (ended_run(d), (d / PID_FILE).write_bytes(DEEP)), PID_FILE),
        "garbage train.pid": (lambda d: (ended_run(d), (d / PID_FILE).write_text("garbage")), PID_FILE),
        "fifo events": (lambda d: (d.mkdir(), os.mkfifo(d / EVENTS_FILE)), EVENTS_FILE),
        "directory events": (lambda d: (d.mkdir(), (d / EVENTS_FILE).mkdir()), EVENTS_FILE),
        "fifo log": (lambda d: (ended_run(d), os.mkfifo(d / LOG_FILE)), LOG_FILE),
        "archive file": (lambda d: (ended_run(d), (d / "archive").write_text("x")), None),
    }
    for label, (make, odd_file) in cases.items():
        run_dir = tmp_path / label.replace(" ", "-")
        make(run_dir)
        options = TuiOptions(run_dir=run_dir, clock=time.time, use_nvml=False, follow=False)
        app = create_app(options)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = pilot.app.screen
            assert isinstance(screen, DashboardScreen), label
            deadline = time.monotonic() + 30
            while not screen.ready.is_set():
                assert time.monotonic() < deadline, f"{label}: the dashboard never read the run"
                await pilot.pause(0.05)
            await pilot.pause(0.1)
            shown = pilot.app.screen.query_one("#anomalies", AnomalyList).anomalies
            files = [a.evidence.get("file") for a in shown if a.rule == "run_file"]
            assert files == ([odd_file] if odd_file else []), (label, shown)
            assert pilot.app.screen is screen and pilot.app.return_code is None, label
        assert app.return_code in (None, 0), label

    # the picker, over all of them at once
    from tideborn.tui.screens.run_picker import RunPickerScreen

    app = create_app(TuiOptions(runs_folder=tmp_path, clock=time.time, use_nvml=False, follow=False))
    async with app.run_test(size=(100, 30)) as pilot:
        picker = pilot.app.screen
        assert isinstance(picker, RunPickerScreen)
        deadline = time.monotonic() + 30
        while not picker.ready.is_set():
            assert time.monotonic() < deadline, "the picker never listed the runs"
            await pilot.pause(0.05)
        flagged = {r.name for r in picker.runs if any(a.rule == "run_file" for a in r.status.anomalies)}
        assert flagged == {label.replace(" ", "-") for label, (_make, odd) in cases.items() if odd}
        assert pilot.app.return_code is None


def test_an_archive_that_is_a_file_is_refused_by_fresh_and_ignored_by_readers(tmp_path: Path, capsys) -> None:
    """`--fresh` moves old checkpoints and events into archive/: a file there crashed the trainer (its
    FileExistsError in train.log) after `start` had said it started."""
    run_dir = tmp_path / "run"
    ended_run(run_dir)
    (run_dir / "archive").write_text("not a directory\n")
    started = tool_here(capsys, "start", *settings_args(run_dir, *ENDLESS), "--fresh")
    assert started.returncode == 2, describe(started)
    one_line_error(started.stderr, "archive is not a directory")
    assert not (run_dir / PID_FILE).exists()
    status = tool_here(capsys, "status", "--out-dir", str(run_dir))
    assert status.returncode == 0 and "state       finished" in status.stdout, describe(status)


@pytest.mark.timeout(WAIT_SECONDS)
@pytest.mark.parametrize("what", ["fifo", "directory", "nested"])
def test_the_tui_start_key_reads_launch_json_without_hanging_or_recursing(tmp_path: Path, what: str) -> None:
    """The start key reads launch.json on the UI thread: a FIFO there froze the TUI, 100,000 `[` raised
    RecursionError. Both are the one-line error the dashboard shows for an unreadable launch.json."""
    from tideborn.errors import UserError
    from tideborn.tui.plan import LaunchPlan

    run_dir = tmp_path / "run"
    ended_run(run_dir)
    if what == "nested":
        (run_dir / "launch.json").write_bytes(DEEP)
    else:
        make_odd(run_dir / "launch.json", what)
    with pytest.raises(UserError, match=r"launch\.json: unreadable .*; start with --config instead"):
        LaunchPlan.from_launch_file(run_dir)
