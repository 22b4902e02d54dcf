"""The smoke run end to end, as the README tells a new user to try it: train (through the installed `tideborn`
console script, a real process), look at the summary, start over with --fresh (the same commands run in the test
process: they read and write only the run's files, and the script's start-up is proven by the first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.common import (
    SMOKE_CONFIG,
    describe,
    events_of,
    run_trainer,
    step_events,
    terminal_events,
    trainer_in_process,
)
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir.kinds import TERMINAL_KINDS
from tideborn.rundir.layout import ARCHIVE_DIR, EVENTS_FILE, list_checkpoints

# smoke.toml's out_dir "ckpt/smoke" under the default paths.runs_root "runs", from the current directory.
SMOKE_RUN_DIR = Path("runs") / "ckpt" / "smoke"
BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """`tideborn train --config configs/smoke.toml`, run once in an empty directory."""
    work = tmp_path_factory.mktemp("smoke")
    result = run_trainer("train", "--config", str(SMOKE_CONFIG), cwd=work, script=True)
    return work, result


def test_smoke_run_finishes_with_valid_events_and_a_loadable_checkpoint(smoke) -> None:
    work, result = smoke
    assert result.returncode == 0, describe(result)
    run_dir = work / SMOKE_RUN_DIR

    lines = (run_dir / EVENTS_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is strict JSON
    for record in records:
        assert record["v"] == 1 and isinstance(record["time"], float) and isinstance(record["kind"], str)
    assert records[0]["kind"] == "run_started" and records[0]["resumed_from"] is None
    assert [e["step"] for e in step_events(records)] == [5, 10, 15, 20]
    assert [e["kind"] for e in terminal_events(records)] == ["run_finished"]
    assert records[-1]["kind"] == "run_finished" and records[-1]["step"] == 20
    assert [r["kind"] for r in records if r["kind"] in TERMINAL_KINDS] == ["run_finished"]

    assert [step for step, _ in list_checkpoints(run_dir)] == [10, 20]
    final = load_checkpoint(run_dir / "step-000000020.pt")
    assert final["step"] == 20 and final["settings"]["run"]["network"] == "resnet2x32"
    assert "step 20/20" in result.stdout and "finished at step 20" in result.stdout
    assert result.stderr == ""


def test_summary_shows_parameters_flops_and_the_run_directory(smoke) -> None:
    work, _ = smoke
    result = trainer_in_process("summary", "--config", str(SMOKE_CONFIG), cwd=work)
    assert result.returncode == 0, describe(result)

    weights = load_checkpoint(work / SMOKE_RUN_DIR / "step-000000020.pt")["model"]
    parameters = sum(t.numel() for name, t in weights.items() if not name.endswith(BUFFER_SUFFIXES))
    assert f"Total parameters:     {parameters:,}" in result.stdout
    assert "FLOPs" in result.stdout
    assert str(SMOKE_RUN_DIR) in result.stdout
    assert f"would resume from {SMOKE_RUN_DIR / 'step-000000020.pt'}" in result.stdout


def test_fresh_archives_old_checkpoints_and_events_and_starts_at_step_0(smoke) -> None:
    work, first = smoke
    assert first.returncode == 0, describe(first)
    run_dir = work / SMOKE_RUN_DIR
    old_events = (run_dir / EVENTS_FILE).read_bytes()
    old_checkpoints = {path.name: path.read_bytes() for _, path in list_checkpoints(run_dir)}

    result = trainer_in_process("train", "--config", str(SMOKE_CONFIG), "--fresh", "--stop-at-step", "2", cwd=work)
    assert result.returncode == 0, describe(result)

    archives = list((run_dir / ARCHIVE_DIR).iterdir())
    assert len(archives) == 1
    archive = archives[0]
    assert (archive / EVENTS_FILE).read_bytes() == old_events
    for name, data in old_checkpoints.items():
        assert (archive / name).read_bytes() == data  # moved whole, not deleted
    assert load_checkpoint(archive / "step-000000020.pt")["step"] == 20

    events = events_of(run_dir)
    started = events[0]
    assert started["kind"] == "run_started" and started["step"] == 0
    assert started["fresh"] is True and started["resumed_from"] is None
    assert (work / started["archived_to"]).resolve() == archive.resolve()  # relative to the trainer's cwd
    assert [e["step"] for e in step_events(events)] == [2]
    assert [e["kind"] for e in terminal_events(events)] == ["run_stopped"]
    assert [step for step, _ in list_checkpoints(run_dir)] == [2]
    assert "--fresh: moved 3 file(s)" in result.stdout
