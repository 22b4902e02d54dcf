"""The typed contract between the run directory's reader and what shows it: `RunStatus` (what `status` prints,
in words and as JSON, and what the monitor's header and run list show) and the typed event records."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import psutil
import pytest

from tideborn.rundir.events import encode_event
from tideborn.rundir.files import this_host
from tideborn.rundir.state import RunTracker
from tideborn.tools import train_run

REPO = Path(__file__).resolve().parents[2]
NOW = 1_700_000_100.0


def write(run_dir: Path, events: list[tuple[str, dict, float]], log: str = "") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events.jsonl").write_bytes(b"".join(encode_event(kind, fields, now=when)
                                                    for kind, fields, when in events))
    (run_dir / "train.log").write_text(log)


def started(pid: int, host: str, when: float) -> tuple[str, dict, float]:
    return ("run_started", {"step": 0, "settings": {"runtime": {"device": "cpu"}}, "device": "cpu, fp32",
                            "resumed_from": None, "pid": pid, "host": host, "max_steps": 100, "batch_size": 8,
                            "launcher_pid": None, "start_ticks": None, "boot_id": None}, when)


def ended_run(run_dir: Path) -> None:
    """A run that went through most kinds and failed: every part of the report has something in it."""
    t = NOW - 100
    write(run_dir, [
        started(4242, "elsewhere", t),
        ("step", {"step": 10, "loss": 2.5, "policy_loss": 2.0, "value_loss": 0.5, "lr": 0.01, "grad_norm": 1,
                  "positions_per_second": 1234.5}, t + 1),
        ("step", {"step": 20, "loss": "nan", "policy_loss": 2.0, "value_loss": "inf", "lr": 0.01,
                  "grad_norm": 1.5, "positions_per_second": 1300}, t + 2),
        ("eval", {"step": 20, "policy_loss": 2.1, "value_accuracy": None, "ema": {"policy_loss": 2.2}}, t + 3),
        ("gpu", {"step": 20, "devices": [], "torch_peak_memory_bytes": 5}, t + 4),
        ("checkpoint_saved", {"step": 20, "path": str(run_dir / "step-000000020.pt"), "bytes": 3}, t + 5),
        ("match", {"step": 20, "elo": 0.0, "elo_low": "-inf", "elo_high": "inf", "reference_step": 20}, t + 6),
        ("match", {"step": 30, "elo": 35.5, "elo_low": 1.0, "elo_high": "nan", "reference_step": 20}, t + 7),
        ("warning", {"step": 30, "message": "the match reference was lost", "match_rebaseline": True,
                     "old_reference_step": 20, "reference_step": 30}, t + 8),
        ("warning", {"step": 31, "message": "a second warning"}, t + 9),
        ("something_new", {"step": 31, "x": 1}, t + 9.5),
        ("watchdog", {"step": 32, "reason": "grad_norm_spike", "trip_step": 31, "grad_norm": 90.0, "median": 1.0,
                      "factor": 10.0, "consecutive": 3, "resume_from": str(run_dir / "step-000000020.pt")}, t + 10),
        ("run_failed", {"step": 32, "error": "gradient watchdog", "traceback": None, "rank": 0, "pid": 4242,
                        "elapsed_seconds": 11.0, "resume_from": str(run_dir / "step-000000020.pt")}, t + 11),
    ], log="starting\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    os.utime(run_dir / "train.log", (t + 11, t + 11))
    checkpoint = run_dir / "step-000000020.pt"
    checkpoint.write_bytes(b"1234")  # not the size it was saved at
    os.utime(checkpoint, (t + 5, t + 5))


def live_now() -> float:
    """A clock 20 s after this process started: its run_started (at 0 s) is then one it could have written."""
    return float(int(psutil.Process().create_time())) + 21


def running_run(run_dir: Path, now: float) -> None:
    """A live run (this process stands in for the trainer) that was asked to stop."""
    t = now - 20
    write(run_dir, [
        started(os.getpid(), this_host(), t),
        ("step", {"step": 40, "loss": 1.5, "policy_loss": 1.0, "value_loss": 0.5, "lr": 0.02, "grad_norm": 0.5,
                  "positions_per_second": 800.0}, t + 2),
        ("step", {"step": 50, "loss": 1.4, "policy_loss": 1.0, "value_loss": 0.4, "lr": 0.02, "grad_norm": 0.5,
                  "positions_per_second": 800.0}, t + 12),
        ("stop_requested", {"step": 50, "signal": "SIGTERM", "requested_at": t + 13}, t + 14),
    ])
    for name in ("events.jsonl", "train.log"):
        os.utime(run_dir / name, (now - 5, now - 5))


def status_of(run_dir: Path, now: float = NOW):
    tracker = RunTracker(run_dir, start="tail")
    tracker.refresh(now=now, keep_events=False)
    tracker.finish_log()
    return tracker.status(now)


def as_recorded(report: dict, run_dir: Path) -> dict:
    """The report with what depends on this machine (the directory, this process) put in words."""
    text = json.dumps(report).replace(str(run_dir), "RUN")
    if report["host"] == this_host():
        text = text.replace(json.dumps(this_host()), '"HOST"').replace(f": {os.getpid()},", ": 1,")
    return json.loads(text)


ENDED_JSON = {
    "run_dir": "RUN", "state": "failed", "pid": 4242, "host": "elsewhere", "pid_file": False, "launch_started": True,
    "step": 32, "max_steps": 100, "progress": 0.32,
    "loss": {"loss": "nan", "policy_loss": 2.0, "value_loss": "inf"}, "loss_step": 20, "lr": 0.01, "grad_norm": 1.5,
    "positions_per_second": 1300, "steps_per_second": 10.0, "eta_seconds": None, "elapsed_seconds": 11.0,
    "session_started": 1700000000.0, "resumed_from": None,
    "last_checkpoint": {"step": 20, "path": "RUN/step-000000020.pt", "bytes": 4, "age_seconds": 95.0,
                        "saved_bytes": 3, "changed_since_saved": True},
    "last_eval": {"time": 1700000003.0, "kind": "eval", "step": 20, "policy_loss": 2.1, "value_accuracy": None,
                  "ema": {"policy_loss": 2.2}},
    "resume_from": "RUN/step-000000020.pt",
    "elo_curve": [[20, 0.0, "-inf", "inf", 20], [30, 35.5, 1.0, None, 20]], "elo_rebaselines": [[30, 20, 30]],
    "terminal": {"time": 1700000011.0, "kind": "run_failed", "step": 32, "error": "gradient watchdog",
                 "traceback": None, "rank": 0, "pid": 4242, "elapsed_seconds": 11.0,
                 "resume_from": "RUN/step-000000020.pt"},
    "stop_requested": None, "warnings": {"count": 2, "last": "a second warning"}, "last_event_time": 1700000011.0,
    "events_read": 13, "events_malformed": 0, "tail_only": False, "log_error_counts": {"cuda_oom": 1},
    "events_rotated": False, "run_started_missing": False,
    "anomalies": [
        {"rule": "nonfinite_loss", "message": "non-finite loss at step 20: loss nan, value_loss inf",
         "evidence": {"step": 20, "loss": "nan", "policy_loss": 2.0, "value_loss": "inf"}, "time": 1700000002.0},
        {"rule": "gradient", "message": "gradient norm 90 at step 31 above 10.0 x its running median 1 for 3 step(s) "
         "in a row; the watchdog halted the run", "evidence": {"step": 31, "reason": "grad_norm_spike",
                                                               "grad_norm": 90.0, "median": 1.0, "factor": 10.0,
                                                               "consecutive": 3}, "time": 1700000010.0},
        {"rule": "run_failed", "message": "run failed at step 32: gradient watchdog",
         "evidence": {"step": 32, "error": "gradient watchdog"}, "time": 1700000011.0},
        {"rule": "cuda_oom", "message": "CUDA out of memory in train.log line 2: RuntimeError: CUDA out of memory. "
         "Tried to allocate 2.00 GiB", "evidence": {"line": 2, "text": "RuntimeError: CUDA out of memory. Tried to "
                                                    "allocate 2.00 GiB"}, "time": 1700000011.0}],
    "restarts": 0, "world_size": None,
}
"""`status --json` of `ended_run`, as recorded before the report was typed."""

ENDED_TEXT = """\
run dir     RUN
state       failed (pid 4242 on elsewhere)
step        32 / 100 (32.0%)  elapsed 11s
loss        nan (policy 2, value inf) at step 20; lr 1.00e-02; 1,300 pos/s
checkpoint  step-000000020.pt (step 20), 1m35s ago; CHANGED since it was saved (4 bytes, saved as 3): the next \
train skips it if it does not load
resume      RUN/step-000000020.pt (the newest healthy checkpoint; train resumes from it)
eval        step 20: value accuracy n/a, policy loss 2.1; EMA policy loss 2.2
match       step 30 vs step 20: Elo +36 [+1, ?] (95%)
elo curve   20:+0 30:+36
elo origin  MOVED at step 30: the match reference (step 20) was lost, matches now play step 30; Elo before and \
after it are not comparable
warnings    2 (last: a second warning)
ended       run_failed at step 32: gradient watchdog
anomalies   4
  ! nonfinite_loss: non-finite loss at step 20: loss nan, value_loss inf
  ! gradient: gradient norm 90 at step 31 above 10.0 x its running median 1 for 3 step(s) in a row; the watchdog \
halted the run
  ! run_failed: run failed at step 32: gradient watchdog
  ! cuda_oom: CUDA out of memory in train.log line 2: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"""

ENDED_HEADER = (" FAILED  4 anomalies  step 32 / 100 (32.0%)  1,300 pos/s  lr 1.00e-02\n"
                " run_failed at step 32: gradient watchdog  event 1m36s ago  checkpoint step 20 (1m42s ago)  "
                "Elo +36 [+1, ?] at step 30 ▁█ (origin "
                "moved at step 30: vs step 30)")


def running_expected(now: float) -> dict:
    t = now - 20
    return {
        "run_dir": "RUN", "state": "running", "pid": 1, "host": "HOST", "pid_file": False, "launch_started": True,
        "step": 50, "max_steps": 100, "progress": 0.5, "loss": {"loss": 1.4, "policy_loss": 1.0, "value_loss": 0.4},
        "loss_step": 50, "lr": 0.02, "grad_norm": 0.5, "positions_per_second": 800.0, "steps_per_second": 1.0,
        "eta_seconds": 50.0, "elapsed_seconds": 20.0, "session_started": t, "resumed_from": None,
        "last_checkpoint": None, "last_eval": None, "resume_from": None, "elo_curve": [], "elo_rebaselines": [],
        "terminal": None, "stop_requested": {"time": t + 14, "kind": "stop_requested", "step": 50, "signal": "SIGTERM",
                                             "requested_at": t + 13},
        "warnings": {"count": 0, "last": None}, "last_event_time": t + 14, "events_read": 4, "events_malformed": 0,
        "tail_only": False, "log_error_counts": {}, "events_rotated": False, "run_started_missing": False,
        "anomalies": [], "restarts": 0, "world_size": None,
    }


def test_the_status_is_a_frozen_dataclass_with_typed_parts(tmp_path: Path) -> None:
    from tideborn.rundir.kinds import Eval, RunEnded
    from tideborn.rundir.status import CheckpointOnDisk, EloPoint, RunStatus

    run_dir = tmp_path / "run"
    ended_run(run_dir)
    status = status_of(run_dir)
    assert isinstance(status, RunStatus) and dataclasses.is_dataclass(status)
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.state = "running"  # type: ignore[misc]
    assert isinstance(status.last_checkpoint, CheckpointOnDisk) and status.last_checkpoint.changed_since_saved
    assert isinstance(status.terminal, RunEnded) and status.terminal.error == "gradient watchdog"
    assert isinstance(status.last_eval, Eval) and status.last_eval.figures()["policy_loss"] == 2.1
    assert status.elo_curve[-1] == EloPoint(30, 35.5, 1.0, None, 20)
    assert [a.rule for a in status.anomalies] == ["nonfinite_loss", "gradient", "run_failed", "cuda_oom"]


def test_status_json_keeps_its_keys_and_values(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ended_run(run_dir)
    assert as_recorded(status_of(run_dir).to_json(), run_dir) == ENDED_JSON
    assert list(status_of(run_dir).to_json()) == list(ENDED_JSON)  # the order too

    live = tmp_path / "live"
    now = live_now()
    running_run(live, now)
    assert as_recorded(status_of(live, now).to_json(), live) == running_expected(now)


def test_status_json_is_what_train_run_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    ended_run(run_dir)
    assert train_run.main(["status", "--out-dir", str(run_dir), "--json"]) == 1  # it holds anomalies
    printed = as_recorded(json.loads(capsys.readouterr().out), run_dir)
    assert printed["last_checkpoint"].pop("age_seconds") > 0  # from the wall clock, not NOW
    expected = json.loads(json.dumps(ENDED_JSON))
    del expected["last_checkpoint"]["age_seconds"]
    assert printed == expected


def test_status_text_renders_the_typed_status(tmp_path: Path) -> None:
    from tideborn.humanize import clock
    from tideborn.rundir.report import status_text

    run_dir = tmp_path / "run"
    ended_run(run_dir)
    assert status_text(status_of(run_dir)).replace(str(run_dir), "RUN") == ENDED_TEXT

    live = tmp_path / "live"
    now = live_now()
    running_run(live, now)
    text = status_text(status_of(live, now))
    assert text.splitlines() == [
        f"run dir     {live}", f"state       running (pid {os.getpid()} on {this_host()})",
        f"stopping    SIGTERM at {clock(now - 7)}: finishing its step, then a checkpoint and run_stopped (stop again "
        "waits for it)",
        "step        50 / 100 (50.0%)  elapsed 20s  ETA 50s",
        "loss        1.4 (policy 1, value 0.4) at step 50; lr 2.00e-02; 800 pos/s",
        "checkpoint  none yet", "eval        none", "anomalies   none"]


def test_the_monitor_header_renders_the_typed_status(tmp_path: Path) -> None:
    from tideborn.tui.widgets.header import RunHeader

    run_dir = tmp_path / "run"
    ended_run(run_dir)
    header = RunHeader(run_dir, lambda: NOW + 7)
    header.status, header.checked_at = status_of(run_dir), NOW
    assert header.text().plain == ENDED_HEADER

    live = tmp_path / "live"
    now = live_now()
    running_run(live, now)
    header = RunHeader(live, lambda: now + 7)
    header.status, header.checked_at = status_of(live, now), now
    assert header.text().plain == (" RUNNING (stopping, SIGTERM 14s ago)  step 50 / 100 (50.0%)  ETA 50s  800 pos/s  "
                                   f"lr 2.00e-02\n event 13s ago  no checkpoint  pid {os.getpid()}")
    header.watch_problem = "inotify watch limit reached"
    assert header.text().plain.endswith("  polling every 2 s (inotify watch limit reached)")


# -- event kinds ----------------------------------------------------------------------------------------------

def test_every_kind_is_written_and_read_through_its_record_and_documented(tmp_path: Path) -> None:
    """The writer takes a record class, never a kind's name: every kind written has the record that reads it."""
    from tideborn.rundir.events import EventWriter, read_events
    from tideborn.rundir.kinds import RECORDS, EventRecord, RunEnded, RunFailed, Step, parse_event

    assert {"run_started", "step", "stop_requested", "run_finished", "run_stopped", "run_failed"} <= set(RECORDS)
    assert all(kind == record.KIND for kind, record in RECORDS.items())
    docs = (REPO / "docs" / "events.md").read_text()
    documented = set(re.findall(r"^### `(\w+)`", docs, re.M)) | set(re.findall(r"^\| `(run_\w+)` \|", docs, re.M))
    undocumented = sorted(set(RECORDS) - documented)
    assert not undocumented, f"records without a section in docs/events.md: {undocumented}"
    for kind, record in RECORDS.items():
        parsed = parse_event({"v": 1, "time": 1.0, "kind": kind, "step": 3})
        assert type(parsed) is record and isinstance(parsed, EventRecord) and (parsed.kind, parsed.step) == (kind, 3)
    assert isinstance(parse_event({"kind": "run_failed"}), RunEnded)

    with EventWriter(tmp_path / "events.jsonl") as writer:
        assert writer.emit(Step, step=1, loss=0.5)["kind"] == "step"
        writer.emit(RunFailed, step=1, error="boom")
        for not_a_record in ("step", Step(event={}, kind="step", time=None, step=1, loss=None, policy_loss=None,
                                          value_loss=None, lr=None, grad_norm=None, positions_per_second=None),
                             EventRecord, dict):
            with pytest.raises(TypeError, match="event record class"):
                writer.emit(not_a_record, step=2)
    assert [event["kind"] for event in read_events(tmp_path / "events.jsonl")] == ["step", "run_failed"]
    assert parse_event({"kind": "something_new", "step": 1}) is None  # a newer writer's kind: skipped


def test_a_field_of_the_wrong_type_reads_as_absent() -> None:
    from tideborn.rundir.kinds import RunStarted, Step, parse_event

    started = parse_event({"kind": "run_started", "pid": True, "host": 5, "max_steps": 10.0, "settings": []})
    assert isinstance(started, RunStarted)
    assert (started.pid, started.host, started.max_steps, started.settings) == (None, None, None, None)
    step = parse_event({"kind": "step", "step": 2, "loss": "nan", "lr": "fast", "positions_per_second": 12})
    assert isinstance(step, Step) and step.lr is None and step.positions_per_second == 12
    assert step.loss != step.loss and step.losses().keys() == {"loss"}
