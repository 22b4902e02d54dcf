"""The trainer on real teacher data: game records converted and split with the data tools, trained by the
real `train` command, evaluated on held-out games, and resumed mid-epoch exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.common import REPO_ROOT, events_of, settings_args, step_events, trainer_in_process
from tests.helpers.data import SAMPLE_GAMES
from tideborn.data.decode.features import Decoder
from tideborn.data.formats.records import RecordSet
from tideborn.data.tools.convert import convert_games
from tideborn.data.tools.split import split_games
from tideborn.network.checkpoint import load_checkpoint

TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"


@pytest.fixture(scope="module")
def teacher_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real game records that ship with the project (samples/games), converted and split by game."""
    assert SAMPLE_GAMES.is_dir(), f"{SAMPLE_GAMES}: the sample games are part of the repository"
    root = tmp_path_factory.mktemp("teacher")
    convert_games([SAMPLE_GAMES], root / "all.hcpe", progress=False)
    split_games(root / "all.hcpe", root / "train.hcpe", root / "test.hcpe", test_fraction=0.15, seed=0,
                progress=False)
    return root


def teacher_args(files: Path, run_dir: Path, *sets: str) -> list[str]:
    return settings_args(run_dir, f"paths.data_root={str(files)!r}", 'data.train=["train.hcpe"]',
                         'data.test=["test.hcpe"]', "runtime.progress=\"plain\"", *sets, config=TEACHER_CONFIG)


def test_trained_net_beats_chance_and_the_most_frequent_move_on_held_out_games(teacher_files, tmp_path):
    run_dir = tmp_path / "run"
    result = trainer_in_process("train", *teacher_args(teacher_files, run_dir, "runtime.max_steps=120",
                                                       "runtime.eval_every=60"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    evals = [e for e in events_of(run_dir) if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [60, 120]
    assert "eval at step 120" in result.stdout

    train = RecordSet([teacher_files / "train.hcpe"], "hcpe")
    test = RecordSet([teacher_files / "test.hcpe"], "hcpe")
    decoder = Decoder("hcpe", 756.0, 0.0)
    train_labels = decoder.decode(train.read(np.arange(len(train)))).policy
    test_labels = decoder.decode(test.read(np.arange(len(test)))).policy
    most_frequent = int(np.bincount(train_labels, minlength=2187).argmax())
    baseline = float((test_labels == most_frequent).mean())
    accuracy = evals[-1]["policy_accuracy"]
    assert evals[-1]["positions"] == len(test_labels)
    assert accuracy > 1 / 2187
    assert accuracy > baseline, f"top-1 {accuracy:.3f} vs most-frequent-move baseline {baseline:.3f}"


def test_resume_mid_epoch_on_teacher_data_is_exact(teacher_files, tmp_path):
    sets = ("runtime.max_steps=12", "runtime.log_every=1", "runtime.checkpoint_every=6", "runtime.eval_every=6",
            "optim.batch_size=32", "data.workers=2")
    straight, pieces = tmp_path / "straight", tmp_path / "pieces"
    assert trainer_in_process("train", *teacher_args(teacher_files, straight, *sets), cwd=tmp_path).returncode == 0
    first = trainer_in_process("train", *teacher_args(teacher_files, pieces, *sets), "--stop-at-step", "6",
                               cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = trainer_in_process("train", *teacher_args(teacher_files, pieces, *sets), cwd=tmp_path)
    assert second.returncode == 0, second.stderr

    def losses(run_dir: Path) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in step_events(events_of(run_dir))}

    assert losses(pieces) == losses(straight)
    assert len(losses(straight)) == 12
    cursor = load_checkpoint(pieces / "step-000000006.pt")["data_cursor"]
    assert cursor["position"] > 0, "the stop must fall mid-epoch for this test to mean anything"
    a = load_checkpoint(straight / "step-000000012.pt")["model"]
    b = load_checkpoint(pieces / "step-000000012.pt")["model"]
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_missing_teacher_file_is_refused_before_anything_is_written(teacher_files, tmp_path):
    run_dir = tmp_path / "run"
    result = trainer_in_process("train", *teacher_args(teacher_files, run_dir, 'data.train=["nope-*.hcpe"]'),
                                cwd=tmp_path)
    assert result.returncode == 2
    assert "nope-*.hcpe" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not run_dir.exists()


def test_with_ema_evaluation_reports_raw_and_averaged_weights(teacher_files, tmp_path):
    run_dir = tmp_path / "run"
    result = trainer_in_process("train", *teacher_args(teacher_files, run_dir, "runtime.max_steps=4",
                                                       "runtime.eval_every=4", "optim.ema_decay=0.5",
                                                       "optim.batch_size=32"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (evaluation,) = [e for e in events_of(run_dir) if e["kind"] == "eval"]
    assert set(evaluation["ema"]) == {"policy_loss", "value_loss", "policy_accuracy", "value_accuracy"}
    assert evaluation["ema"]["policy_loss"] != evaluation["policy_loss"]
    assert "EMA policy top-1" in result.stdout
