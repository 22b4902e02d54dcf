"""A full disk: a checkpoint or event write that fails with ENOSPC.

The promise (docs/reliability.md): the previous checkpoints stay intact and loadable, the run ends with
`run_failed` and a non-zero exit status, no half checkpoint is left where resume would take it, a torn
event line never swallows the next event, and once space is back a resume works.

Two ways to fill a disk: a real, small tmpfs (needs root and a kernel that lets us mount one; skipped
otherwise, with the reason), and ENOSPC injected at the write call inside a real trainer process
(`fault_env`: a sitecustomize on PYTHONPATH), which runs everywhere and can aim at one exact write.
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

from tests.helpers.common import TEMPLATE_SETS, assert_user_error, describe, run_trainer, settings_args, train
from tests.helpers.reliability import check_attempts, fault_env, read_history
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir.anomaly import AnomalyThresholds
from tideborn.rundir.layout import list_checkpoints, temp_checkpoints
from tideborn.rundir.state import RunTracker

SETS = ("runtime.max_steps=6", "runtime.checkpoint_every=2", "runtime.log_every=1", "runtime.keep_checkpoints=5",
        "optim.batch_size=16", "runtime.progress=plain")


def train_with(run_dir: Path, cwd: Path, env: dict | None, *sets: str) -> subprocess.CompletedProcess:
    return run_trainer("train", *settings_args(run_dir, *SETS, *sets), cwd=cwd, env=env)


def assert_checkpoints_intact(run_dir: Path, steps: list[int]) -> None:
    assert [step for step, _ in list_checkpoints(run_dir)] == steps
    for step, path in list_checkpoints(run_dir):
        assert load_checkpoint(path)["step"] == step
    assert temp_checkpoints(run_dir) == [], "a half-written checkpoint was left behind"


def status_of(run_dir: Path) -> dict:
    tracker = RunTracker(run_dir, AnomalyThresholds(), start="tail")
    tracker.refresh(keep_events=False)
    return tracker.status().to_json()


def resume_to_the_end(run_dir: Path, cwd: Path, from_step: int, malformed: int) -> list[dict]:
    # Space is back: a plain resume, with no fault of its own, whose outputs alone are read (in this process).
    train(run_dir, *SETS, cwd=cwd)
    events, bad_lines = read_history(run_dir)
    assert bad_lines == malformed
    last = [e for e in events if e["kind"] == "run_started"][-1]
    assert last["step"] == from_step
    assert events[-1]["kind"] == "run_finished" and events[-1]["step"] == 6
    assert_checkpoints_intact(run_dir, [s for s in (2, 4, 6) if s > 0])
    return events


# -- injected -------------------------------------------------------------------------------------------

def test_a_checkpoint_write_failing_with_enospc_keeps_the_last_checkpoint_and_fails_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # The second save (step 4) gets 1 MB into its temp file, then the disk is full.
    result = train_with(run_dir, tmp_path, fault_env(tmp_path, checkpoint="2,1000000"))

    assert result.returncode == 1, describe(result)
    assert_checkpoints_intact(run_dir, [2])
    events, malformed = read_history(run_dir)
    assert malformed == 0
    check_attempts(events, [True])
    failed = events[-1]
    assert failed["kind"] == "run_failed" and failed["step"] == 4
    assert "No space left on device while writing checkpoint" in failed["error"]
    assert "step-000000004.pt" in failed["error"] and "earlier checkpoints are intact" in failed["error"]
    report = status_of(run_dir)
    assert report["state"] == "failed" and [a["rule"] for a in report["anomalies"]] == ["run_failed"]
    assert report["last_checkpoint"]["step"] == 2

    events = resume_to_the_end(run_dir, tmp_path, from_step=2, malformed=0)
    check_attempts(events, [True, True])


def test_an_event_write_cut_short_by_enospc_ends_the_run_with_run_failed_on_a_line_of_its_own(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Writes: run_started, step 1, step 2, checkpoint_saved 2, then step 3 gets half a line in; the disk
    # then has room again (say, the save that failed freed its temp file), so run_failed can be written.
    result = train_with(run_dir, tmp_path, fault_env(tmp_path, events="5"))

    assert result.returncode == 1, describe(result)
    events, malformed = read_history(run_dir)
    assert malformed == 1  # the torn half of step 3: one bad line, not glued to run_failed
    assert [e["kind"] for e in events] == ["run_started", "step", "step", "checkpoint_saved", "run_failed"]
    assert "No space left on device" in events[-1]["error"] and events[-1]["step"] == 3
    check_attempts(events, [True])
    assert_checkpoints_intact(run_dir, [2])

    events = resume_to_the_end(run_dir, tmp_path, from_step=2, malformed=1)
    check_attempts(events, [True, True])


@pytest.mark.parametrize("nth, said", [
    (1, "run_failed not written to events.jsonl: this attempt's run_started is not there"),
    (5, "could not write run_failed to"),
])
def test_event_writes_failing_for_good_exit_nonzero_and_the_next_run_starts_on_a_fresh_line(
        tmp_path: Path, nth: int, said: str) -> None:
    run_dir = tmp_path / "run"
    result = train_with(run_dir, tmp_path, fault_env(tmp_path, events=f"{nth},sticky"))

    assert result.returncode == 1, describe(result)
    assert said in result.stderr and "No space left on device" in result.stderr, describe(result)
    events, malformed = read_history(run_dir)
    assert malformed == 0  # the torn line has no newline yet: readers wait for it
    assert (run_dir / "events.jsonl").read_bytes()[-1:] != b"\n"
    # The attempt could not write its terminal event: it reads as an attempt that was killed.
    assert [e["kind"] for e in events] == ([] if nth == 1 else ["run_started", "step", "step", "checkpoint_saved"])
    check_attempts(events)
    assert_checkpoints_intact(run_dir, [] if nth == 1 else [2])

    events = resume_to_the_end(run_dir, tmp_path, from_step=0 if nth == 1 else 2, malformed=1)
    check_attempts(events, [True] if nth == 1 else [False, True])


# -- a real full filesystem --------------------------------------------------------------------------------

def fill(path: Path) -> None:
    """Write `path` until the filesystem is full."""
    with open(path, "wb", buffering=0) as handle:
        block = b"\0" * 65536
        try:
            while True:
                handle.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_on_a_real_full_filesystem_checkpoints_survive_and_resume_works_once_space_is_back(
        template_run: Path, tmp_path: Path, small_filesystem) -> None:
    mount_point, resize = small_filesystem
    checkpoint_bytes = (template_run / "step-000000004.pt").stat().st_size
    # Room for three checkpoints and half of a fourth: saves at steps 1-3 succeed, the fourth runs out.
    resize(3 * checkpoint_bytes + checkpoint_bytes // 2 + 256 * 1024)
    run_dir = mount_point / "run"
    sets = (*TEMPLATE_SETS, "runtime.max_steps=6", "runtime.checkpoint_every=1", "runtime.keep_checkpoints=100")

    first = run_trainer("train", *settings_args(run_dir, *sets), cwd=tmp_path)

    assert first.returncode == 1, describe(first)
    assert_checkpoints_intact(run_dir, [1, 2, 3])
    events, malformed = read_history(run_dir)
    assert malformed == 0 and events[-1]["kind"] == "run_failed"
    assert "No space left on device while writing checkpoint" in events[-1]["error"], events[-1]
    assert status_of(run_dir)["state"] == "failed"

    # Now fill what is left, so that the event writes fail too (tmpfs gives a short write, then ENOSPC).
    fill(mount_point / "filler")
    second = run_trainer("train", *settings_args(run_dir, *sets), cwd=tmp_path)
    assert second.returncode == 2, describe(second)  # a disk full at start: refused in one line, before torch
    assert_user_error(second.stderr, r"cannot write in .*run: no space left on the device \[ENOSPC\]")
    assert_checkpoints_intact(run_dir, [1, 2, 3])
    events, malformed = read_history(run_dir)
    check_attempts(events)
    assert malformed == 0  # at most a torn last line, which readers hold back

    (mount_point / "filler").unlink()
    resize(64 * 1024 * 1024)
    third = train(run_dir, *sets, cwd=tmp_path)
    events, malformed = read_history(run_dir)
    assert malformed <= 1, third.stdout  # the torn line of the second attempt, if it left one
    attempts = check_attempts(events)
    assert attempts[0][-1]["kind"] == "run_failed"
    assert attempts[-1][0]["step"] == 3 and attempts[-1][0]["resumed_from"] == str(run_dir / "step-000000003.pt")
    assert attempts[-1][-1]["kind"] == "run_finished" and attempts[-1][-1]["step"] == 6
    assert_checkpoints_intact(run_dir, [1, 2, 3, 4, 5, 6])
