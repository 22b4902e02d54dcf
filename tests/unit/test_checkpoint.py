"""Checkpoints on disk: only complete files count, a process killed mid-save leaves nothing that
resume would trip over, and a file that needs pickle to load is refused without running anything."""

from __future__ import annotations

import json
import pathlib
from pathlib import Path

import pytest
import torch

from tests.helpers.common import (
    TEMPLATE_SETS,
    assert_user_error,
    copy_run,
    describe,
    events_of,
    settings_args,
    terminal_events,
    train,
    trainer_in_process,
)
from tideborn.network.checkpoint import FORMAT, FORMAT_VERSION, CheckpointError, load_checkpoint
from tideborn.rundir.layout import latest_checkpoint, list_checkpoints, temp_checkpoints
from tideborn.trainer.cli import main

# -- which files count ----------------------------------------------------------------------------

def test_only_complete_step_files_are_checkpoints(tmp_path: Path) -> None:
    for name in ("step-000000005.pt", "step-000000010.pt", ".step-000000030.pt.tmp-123", "step-30.pt",
                 "step-000000040.pt.bak", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "step-000000050.pt").mkdir()

    assert list_checkpoints(tmp_path) == [(5, tmp_path / "step-000000005.pt"),
                                          (10, tmp_path / "step-000000010.pt")]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000000010.pt"
    assert temp_checkpoints(tmp_path) == [tmp_path / ".step-000000030.pt.tmp-123"]
    assert list_checkpoints(tmp_path / "missing") == [] and latest_checkpoint(tmp_path / "missing") is None


def test_a_leftover_temp_file_is_never_resumed_from_and_is_removed_with_a_warning(
        template_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    leftover = run_dir / ".step-000000030.pt.tmp-123"
    leftover.write_bytes((run_dir / "step-000000004.pt").read_bytes()[:1000])
    history = len(events_of(run_dir))

    train(run_dir, *TEMPLATE_SETS, "runtime.max_steps=5", cwd=tmp_path)

    assert not leftover.exists()
    run = events_of(run_dir)[history:]
    warnings = [e["message"] for e in run if e["kind"] == "warning"]
    assert len(warnings) == 1 and ".step-000000030.pt.tmp-123" in warnings[0], run
    started = next(e for e in run if e["kind"] == "run_started")
    assert started["resumed_from"] == str(run_dir / "step-000000004.pt")
    assert [e["kind"] for e in terminal_events(run)] == ["run_finished"]


# -- killed while saving --------------------------------------------------------------------------

# A value head 8x wider than the smoke net's makes each save ~36 MB, so a save is a good part of a step.


# -- pickle payloads ------------------------------------------------------------------------------

class CreatesFile:
    """Unpickling this creates `marker`: what a hostile "checkpoint" would do, minus the harm."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def write_hostile_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"format": FORMAT, "format_version": FORMAT_VERSION, "step": 6, "settings": {},
                "model": {"w": torch.zeros(2)}, "payload": CreatesFile(marker)}, path)
    return path


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint-looking file whose unpickling would create a marker file, and that marker."""
    # First prove the payload is live: an unsafe load of a twin does create its marker.
    twin_marker = tmp_path / "twin-marker"
    twin = write_hostile_checkpoint(tmp_path / "twin.pt", twin_marker)
    torch.load(twin, weights_only=False)
    assert twin_marker.exists()

    marker = tmp_path / "marker"
    return write_hostile_checkpoint(tmp_path / "hostile.pt", marker), marker


def test_load_checkpoint_refuses_a_pickle_payload(hostile) -> None:
    path, marker = hostile
    with pytest.raises(CheckpointError, match=r"hostile\.pt: refused: loading it would need pickle"):
        load_checkpoint(path)
    assert not marker.exists()


def test_train_resume_refuses_a_pickle_payload(hostile, tmp_path: Path, workdir: Path, capsys) -> None:
    path, marker = hostile
    rc = main(["train", *settings_args(tmp_path / "run"), "--resume", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, r"--resume .*hostile\.pt: refused: loading it would need pickle")
    assert not marker.exists()
    assert not (tmp_path / "run").exists()


def test_finetune_refuses_a_pickle_payload(hostile, tmp_path: Path, workdir: Path, capsys) -> None:
    path, marker = hostile
    rc = main(["train", *settings_args(tmp_path / "run", f"run.init_checkpoint={json.dumps(str(path))}"),
               "--mode", "finetune"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, r"run\.init_checkpoint: .*hostile\.pt: refused: loading it would need pickle")
    assert not marker.exists()


def test_config_from_checkpoint_refuses_a_pickle_payload_in_a_real_process(hostile, tmp_path: Path) -> None:
    path, marker = hostile
    result = trainer_in_process("config", "--from-checkpoint", str(path), cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", describe(result)
    assert_user_error(result.stderr, r"hostile\.pt: refused: loading it would need pickle")
    assert not marker.exists()


def test_a_pickle_payload_as_newest_checkpoint_is_skipped_with_a_warning(
        hostile, template_run: Path, tmp_path: Path) -> None:
    path, marker = hostile
    run_dir = copy_run(template_run, tmp_path / "run")
    (run_dir / "step-000000006.pt").write_bytes(path.read_bytes())
    history = len(events_of(run_dir))

    train(run_dir, *TEMPLATE_SETS, "runtime.max_steps=6", cwd=tmp_path)

    assert not marker.exists()
    run = events_of(run_dir)[history:]
    warnings = [e["message"] for e in run if e["kind"] == "warning"]
    assert len(warnings) == 1 and "step-000000006.pt" in warnings[0] and "refused" in warnings[0]
    started = next(e for e in run if e["kind"] == "run_started")
    assert started["resumed_from"] == str(run_dir / "step-000000004.pt")
    assert load_checkpoint(run_dir / "step-000000006.pt")["step"] == 6  # replaced by a real one
