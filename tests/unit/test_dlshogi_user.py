"""A dlshogi user's run: hcpe3 self-play files mixed with hcpe, with the options they use with dlshogi's
train.py (`--use_average`, `--use_evalfix`, `--temperature`, `--val_lambda_decay_epoch`, `--beta`, weight
decay on every parameter) all at once, data workers and a held-out file. The options were written one by
one; these runs check them together: the run trains, reports its data and scales, evaluates with the new
figures, resumes exactly after a stop mid-epoch, and `train_run status` reads it cleanly."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.common import (
    REPO_ROOT,
    assert_user_error,
    child_env,
    events_of,
    settings_args,
    step_events,
    trainer_in_process,
    tree,
)
from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.data.tools.convert import convert_games
from tideborn.network.checkpoint import load_checkpoint

TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"

DLSHOGI_SETS = (
    'data.kind="auto"', "data.use_average=true", 'data.eval_scale_fit="per_file"',
    "data.policy_temperature=0.5", "loss.value_lambda=0.5", "loss.value_lambda_final=0.1",
    "loss.value_lambda_decay_steps=30", "optim.policy_entropy_beta=0.01", 'optim.weight_decay_policy="all"',
    "optim.grad_clip_norm=10.0", "data.workers=2", "optim.batch_size=128", "runtime.max_steps=40",
    "runtime.log_every=1", "runtime.checkpoint_every=5", "runtime.eval_every=20", "runtime.keep_checkpoints=10",
    'runtime.progress="plain"', "data.eval_positions=512")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hcpe3 files that share games (so averaging merges), an hcpe file, and a held-out hcpe3 file."""
    games = sample_games()
    root = tmp_path_factory.mktemp("dlshogi")
    write_hcpe3(root / "selfplay-a.hcpe3", games[:30], seed=1, eval_unit=300)
    write_hcpe3(root / "selfplay-b.hcpe3", games[20:45], seed=2, eval_unit=900)
    write_hcpe3(root / "test.hcpe3", games[55:], seed=3, eval_unit=600)
    convert_games([REPO_ROOT / "samples" / "games" / "wcsc28"], root / "all.hcpe", progress=False)
    (root / "extra.hcpe").write_bytes((root / "all.hcpe").read_bytes()[:38 * 800])
    (root / "all.hcpe").unlink()
    (root / "all.games.csv").unlink(missing_ok=True)
    return root


def dlshogi_args(root: Path, run_dir: Path, *sets: str) -> list[str]:
    return settings_args(run_dir, f"paths.data_root={str(root)!r}",
                         'data.train=["selfplay-*.hcpe3", "extra.hcpe"]', 'data.test=["test.hcpe3"]',
                         *DLSHOGI_SETS, *sets, config=TEACHER_CONFIG)


def losses(run_dir: Path) -> dict[int, tuple[float, float, float]]:
    return {e["step"]: (e["loss"], e["policy_loss"], e["value_loss"]) for e in step_events(events_of(run_dir))}


def test_a_dlshogi_style_run_trains_reports_and_resumes_exactly(data_root, tmp_path):
    straight, pieces = tmp_path / "straight", tmp_path / "pieces"
    done = trainer_in_process("train", *dlshogi_args(data_root, straight), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    events = events_of(straight)

    started = next(e for e in events if e["kind"] == "run_started")
    average = started["data"]["average"]
    assert average["merged"] > 0 and average["positions"] == average["inputs"] - average["merged"]
    assert started["data"]["kinds"] == ["hcpe", "hcpe3"]
    scales = started["eval_scales"]
    by_name = {Path(path).name: scale for path, scale in scales.items()}
    assert set(by_name) == {"selfplay-a.hcpe3", "selfplay-b.hcpe3", "extra.hcpe", "test.hcpe3"}, scales
    # evals written at 300 and 900 units per result fit to different scales; the hcpe file's evals are all 0
    assert by_name["selfplay-a.hcpe3"] < by_name["selfplay-b.hcpe3"] and by_name["extra.hcpe"] == 756.0864962951762

    steps = step_events(events)
    assert [e["step"] for e in steps] == list(range(1, 41))
    lambdas = [e["value_lambda"] for e in steps]
    assert lambdas[0] == pytest.approx(0.5) and lambdas[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lambdas, lambdas[1:]))

    evals = [e for e in events if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [20, 40]
    for evaluation in evals:
        for field in ("policy_accuracy_legal", "policy_entropy", "value_entropy", "policy_loss", "value_loss"):
            assert isinstance(evaluation[field], float), (field, evaluation)
        assert evaluation["policy_accuracy_legal"] >= evaluation["policy_accuracy"]
        assert evaluation["positions"] > 0

    # Stopped at step 35, and then as if killed after the checkpoint at 30: the next `train` resumes from the
    # newest checkpoint there is (mid-epoch: an epoch is 32 batches of 128) and crosses into the next epoch.
    first = trainer_in_process("train", *dlshogi_args(data_root, pieces), "--stop-at-step", "35", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    (pieces / "step-000000035.pt").unlink()
    cursor = load_checkpoint(pieces / "step-000000030.pt")["data_cursor"]
    assert cursor["epoch"] == 0 and 0 < cursor["batch_in_epoch"] < 32, cursor
    second = trainer_in_process("train", *dlshogi_args(data_root, pieces), cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "step-000000030.pt" in second.stdout + second.stderr
    attempts = [e for e in events_of(pieces) if e["kind"] == "run_started"]
    assert [e["resumed_from"] is not None for e in attempts] == [False, True]
    assert all(e["data"] == started["data"] and e["eval_scales"] == scales for e in attempts)
    assert losses(pieces) == losses(straight) and len(losses(straight)) == 40
    a = load_checkpoint(straight / "step-000000040.pt")["model"]
    b = load_checkpoint(pieces / "step-000000040.pt")["model"]
    assert all(torch.equal(a[name], b[name]) for name in a)

    def evals_of(run_dir: Path) -> dict[int, tuple]:
        return {e["step"]: tuple(e[k] for k in ("policy_loss", "value_loss", "policy_accuracy_legal",
                                                 "policy_entropy", "value_entropy"))
                for e in events_of(run_dir) if e["kind"] == "eval"}

    stopped = evals_of(pieces)
    assert 35 in stopped, "a stop evaluates the weights it saves"
    assert {step: stopped[step] for step in (20, 40)} == evals_of(straight)

    status = subprocess.run([sys.executable, "-m", "tideborn.tools.train_run", "status", "--out-dir",
                             str(pieces), "--json"], env=child_env(), capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert status.stderr == "", status.stderr
    assert report["state"] == "finished" and report["step"] == 40 and report["anomalies"] == [], report
    assert report["last_eval"]["policy_accuracy_legal"] == evals_of(straight)[40][2]


def test_new_selfplay_files_under_the_glob_refuse_the_resume_in_one_line(data_root, tmp_path):
    """Self-play keeps writing files: a resume whose glob now matches more positions cannot continue the
    data order. It is refused before anything starts, in one line that says what to do, and the run
    directory is left as it was (no run_failed for an attempt that never started)."""
    root = tmp_path / "data"
    root.mkdir()
    for name in ("selfplay-a.hcpe3", "extra.hcpe", "test.hcpe3"):
        (root / name).write_bytes((data_root / name).read_bytes())
    run_dir = tmp_path / "run"
    sets = ("runtime.max_steps=6", "runtime.eval_every=100", "data.workers=0", "optim.batch_size=32")
    first = trainer_in_process("train", *dlshogi_args(root, run_dir, *sets), "--stop-at-step", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    (root / "selfplay-b.hcpe3").write_bytes((data_root / "selfplay-b.hcpe3").read_bytes())
    before = {name: data for name, data in tree(run_dir).items() if name != ".trainer.lock"}  # who holds the dir

    again = trainer_in_process("train", *dlshogi_args(root, run_dir, *sets), cwd=tmp_path)
    assert again.returncode == 2, again.stdout + again.stderr
    assert_user_error(again.stderr, r"cannot resume the data order: data.train's record count was \d+ when the "
                                    r"checkpoint was written and is \d+ now; .*new files under a glob.*--mode finetune")
    assert {name: data for name, data in tree(run_dir).items() if name != ".trainer.lock"} == before


def test_records_left_out_of_the_average_are_a_warning(data_root, tmp_path):
    """Without averaging, skipped records (an empty move) are counted by the loader and reported in a
    `warning` event; averaging leaves them out while merging, and the run must say so too."""
    from cshogi import HuffmanCodedPosAndEval

    records = np.fromfile(data_root / "extra.hcpe", dtype=HuffmanCodedPosAndEval)[:300]
    records["bestMove16"][[3, 50, 200]] = 0
    root = tmp_path / "data"
    root.mkdir()
    records.tofile(root / "extra.hcpe")
    (root / "selfplay-a.hcpe3").write_bytes((data_root / "selfplay-a.hcpe3").read_bytes())
    (root / "test.hcpe3").write_bytes((data_root / "test.hcpe3").read_bytes())
    run_dir = tmp_path / "run"
    done = trainer_in_process("train", *dlshogi_args(root, run_dir, "runtime.max_steps=2", "data.workers=0",
                                              "optim.batch_size=32", 'data.train=["selfplay-a.hcpe3", "extra.hcpe"]'),
                       cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    events = events_of(run_dir)
    assert next(e for e in events if e["kind"] == "run_started")["data"]["average"]["skipped"] == 3
    warnings = [e["message"] for e in events if e["kind"] == "warning"]
    assert any("left out 3 teacher record(s) with an empty or illegal move" in text for text in warnings), warnings


# -- the "For dlshogi users" table in docs/training.md ------------------------------------------------------

DLSHOGI_OPTIONS = ("train_data", "test_data", "--batchsize", "--testbatchsize", "--epoch", "--network", "--checkpoint",
                   "--resume", "--reset_optimizer", "--initmodel", "--model", "--optimizer", "--lr", "--weight_decay",
                   "--lr_scheduler", "--clip_grad_max_norm", "--use_critic", "--beta", "--val_lambda",
                   "--val_lambda_decay_epoch", "--eval_interval", "--use_swa", "--use_amp", "--amp_dtype",
                   "--use_average", "--use_evalfix", "--temperature", "--patch", "--cache", "--gpu")
"""dlshogi/train.py's options (at the version the table was written from) that the table must map."""

NOT_SETTINGS = {"train.py", "train_run start", "tideborn.toml", "train.log", "events.jsonl", "torch.optim.lr_scheduler",
                "configs/dlshogi-hcpe3.toml"}
"""Dotted names in the section that are files or commands, not settings."""


def dlshogi_section() -> str:
    text = (REPO_ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    start = text.index("\n## For dlshogi users\n")
    return text[start:text.index("\n## ", start + 1)]


def test_every_setting_the_dlshogi_table_names_exists():
    """A renamed or removed setting fails here rather than leaving the table pointing at nothing."""
    from tideborn.config.schema import SECTIONS

    keys = {f"{name}.{field.name}" for name, cls in SECTIONS.items() for field in dataclasses.fields(cls)}
    named = set()
    for span in re.findall(r"`([^`\n]+)`", dlshogi_section()):
        dotted = re.match(r"([a-z_]+)\.([a-z_0-9]+)(?:\s*=.*)?$", span)
        if dotted and span not in NOT_SETTINGS:
            assert dotted.group(1) in SECTIONS, f"docs/training.md, For dlshogi users: `{span}` is no setting"
            named.add(f"{dotted.group(1)}.{dotted.group(2)}")
    missing = sorted(named - keys)
    assert not missing, f"docs/training.md, For dlshogi users, names settings that do not exist: {missing}"
    assert len(named) >= 30, sorted(named)


def test_the_dlshogi_table_maps_every_train_py_option():
    rows = [line for line in dlshogi_section().splitlines() if line.startswith("| `")]
    first_column = " ".join(row.split(" | ")[0] for row in rows)
    for option in DLSHOGI_OPTIONS:
        assert f"`{option}`" in first_column, f"docs/training.md, For dlshogi users: no row for {option}"
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 3 and all(cells), f"a row needs an option, tideborn's side and a note: {row}"


def test_the_dlshogi_config_is_summarised_without_any_data(tmp_path):
    """configs/dlshogi-hcpe3.toml names data under a data_root the user sets: `summary` shows it without
    reading any, and shows the dlshogi options."""
    done = trainer_in_process("summary", "--config", str(REPO_ROOT / "configs" / "dlshogi-hcpe3.toml"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "duplicate positions averaged" in text and "hcpe3 policy temperature 1" in text
    assert "eval scale fitted per file" in text and "clip grad norm at 10" in text
    assert "(every parameter)" in text and "silu" in text and "10 blocks x 192 channels" in text
    assert not any(tmp_path.iterdir()), "summary writes nothing"


# -- configs/dlshogi-defaults.toml: train.py with no options ----------------------------------------------

DLSHOGI_DEFAULTS = {
    "run.network": "resnet10x192", "model.activation": "silu", "model.blocks": 10, "model.channels": 192,
    "model.value_hidden": 256, "optim.batch_size": 1024, "optim.optimizer": "sgd", "optim.momentum": 0.9,
    "optim.nesterov": True, "optim.lr": 0.01, "optim.warmup_steps": 0, "optim.schedule": "constant",
    "optim.weight_decay": 1e-4, "optim.weight_decay_policy": "all", "optim.grad_clip_norm": 10.0,
    "optim.policy_entropy_beta": 0.0, "optim.ema_decay": 0.0, "loss.value_lambda": 0.333,
    "loss.value_lambda_decay_steps": 0, "data.use_average": False, "data.eval_scale_fit": "off",
    "data.eval_scale": 1 / 0.0013226, "data.policy_temperature": 1.0, "runtime.precision": "fp32",
    "runtime.eval_every": 1000, "runtime.log_every": 1000,
}
"""dlshogi/train.py's argparse defaults and what main() does with them (no --lr_scheduler: no scheduler; weight
decay on model.parameters(); clip_grad_norm_ at --clip_grad_max_norm 10; no --use_amp: fp32), in settings."""


def test_the_dlshogi_defaults_config_is_train_py_with_no_options(tmp_path):
    config = REPO_ROOT / "configs" / "dlshogi-defaults.toml"
    done = trainer_in_process("config", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    resolved = json.loads(done.stdout)
    got = {key: resolved[key.split(".")[0]][key.split(".")[1]] for key in DLSHOGI_DEFAULTS}
    assert got == pytest.approx(DLSHOGI_DEFAULTS)
    done = trainer_in_process("summary", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lr 0.01, weight decay 0.0001 (every parameter), warm-up 0 steps then constant, clip grad norm at 10" \
        in done.stdout
    assert "10 blocks x 192 channels, silu" in done.stdout and "cuda, fp32" in done.stdout
    assert not any(tmp_path.iterdir()), "config and summary write nothing"
    for line in config.read_text().splitlines():  # every key cites what it stands for
        if re.match(r"[a-z_]+ = ", line):
            assert "#" in line, f"configs/dlshogi-defaults.toml: {line!r} has no comment citing train.py"


def test_every_row_of_the_dlshogi_table_states_dlshogis_default():
    """Followed row by row, the table must say where tideborn's default is not dlshogi's (it did not say that
    dlshogi has no learning-rate schedule by default, and a user got a decaying rate)."""
    for row in dlshogi_section().splitlines():
        if row.startswith("| `") and not row.startswith("| `train.py` option"):
            option = row.split(" | ")[0]
            assert re.search(r"` \([^)]+\)", option), f"docs/training.md, For dlshogi users: no default in {option!r}"
    section = dlshogi_section()
    scheduler = next(row for row in section.splitlines() if row.startswith("| `--lr_scheduler`"))
    assert "(none: no schedule" in scheduler and 'optim.schedule = "constant"' in scheduler
    assert "configs/dlshogi-defaults.toml" in section
