"""Bad input to the trainer's commands: exit status 2, one line on stderr naming the problem, no
traceback, nothing on stdout, and nothing written (no run directory, no events, no checkpoints)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.common import (
    SMOKE_CONFIG,
    TEMPLATE_SETS,
    assert_user_error,
    copy_run,
    describe,
    out_dir_set,
    run_trainer,
    settings_args,
    tree,
)
from tideborn.trainer.cli import main

SMOKE = ["--config", str(SMOKE_CONFIG), "--set", "runtime.out_dir={work}/run"]

# (argv with {work} for the working directory, files to write there first, pattern for the error line)
BAD_INPUT = {
    "unknown-section-in-file": (
        ["train", "--config", "bad.toml"], {"bad.toml": "[optimm]\nlr = 0.1\n"},
        r"bad\.toml: unknown section \[optimm\] \(did you mean optim\?\)"),
    "unknown-section-in-set": (
        ["train", *SMOKE, "--set", "optimm.lr=0.1"], {},
        r"--set optimm\.lr=0\.1: unknown section 'optimm' \(did you mean optim\?\)"),
    "unknown-key-in-set": (
        ["train", *SMOKE, "--set", "optim.lrr=0.1"], {},
        r"--set optim\.lrr=0\.1: unknown key optim\.lrr \(did you mean optim\.lr\?\)"),
    "unknown-key-in-file": (
        ["train", "--config", "bad.toml"], {"bad.toml": "[optim]\nbatch_sise = 8\n"},
        r"bad\.toml: unknown key optim\.batch_sise \(did you mean optim\.batch_size\?\)"),
    "wrong-type-in-file": (
        ["train", "--config", "bad.toml"], {"bad.toml": '[optim]\nbatch_size = "big"\n'},
        r'bad\.toml: optim\.batch_size expects an integer, got "big" \(a string\)'),
    "wrong-type-in-set": (
        ["train", *SMOKE, "--set", "runtime.max_steps=2.5"], {},
        r"--set runtime\.max_steps=2\.5: runtime\.max_steps expects an integer, got 2\.5 \(a number\)"),
    "malformed-toml": (
        ["train", "--config", "bad.toml"], {"bad.toml": "[optim]\nlr = 0.1\nbatch_size = \n"},
        r"bad\.toml: malformed TOML: .*line 3"),
    "malformed-json": (
        ["train", "--config", "bad.json"], {"bad.json": '{"optim": {"lr": 0.1,}}\n'},
        r"bad\.json: malformed JSON at line 1"),
    "missing-config-file": (
        ["train", "--config", "nope.toml"], {},
        r"config file not found: nope\.toml"),
    "config-is-a-directory": (
        ["train", "--config", "{work}"], {},
        r"config file is not a regular file: .*work"),
    "lr-zero": (
        ["train", *SMOKE, "--set", "optim.lr=0"], {},
        r"optim\.lr must be > 0; got 0\.0 \(from --set optim\.lr=0\)"),
    "lr-negative-in-file": (
        ["train", "--config", "bad.toml"], {"bad.toml": "[optim]\nlr = -0.5\n"},
        r"optim\.lr must be > 0; got -0\.5 \(from bad\.toml\)"),
    "accumulation-steps-zero": (
        ["train", *SMOKE, "--set", "optim.accumulation_steps=0"], {},
        r"optim\.accumulation_steps must be >= 1; got 0"),
    "blocks-zero": (
        ["train", *SMOKE, "--set", "model.blocks=0"], {},
        r"model\.blocks must be >= 1; got 0"),
    "accumulation-does-not-divide-batch": (
        ["train", *SMOKE, "--set", "optim.accumulation_steps=3"], {},
        r"optim\.accumulation_steps must divide optim\.batch_size \(64\); got 3"),
    "type-nnue": (
        ["train", *SMOKE, "--type", "nnue"], {},
        r"run\.type 'nnue' is not handled by this trainer.*dl"),
    "unknown-network": (
        ["train", *SMOKE, "--network", "resnet2x23"], {},
        r"unknown network preset 'resnet2x23' \(did you mean resnet2x32\?\)"),
    "finetune-without-init-checkpoint": (
        ["train", *SMOKE, "--mode", "finetune"], {},
        r"run\.init_checkpoint must name a checkpoint when run\.mode is 'finetune'"),
    "finetune-from-missing-checkpoint": (
        ["train", *SMOKE, "--mode", "finetune", "--set", "run.init_checkpoint=gone.pt"], {},
        r"run\.init_checkpoint: gone\.pt: no such checkpoint"),
    "fresh-with-resume": (
        ["train", *SMOKE, "--fresh", "--resume", "some.pt"], {},
        r"--fresh and --resume exclude each other"),
    "resume-missing-checkpoint": (
        ["train", *SMOKE, "--resume", "gone.pt"], {},
        r"--resume gone\.pt: no such checkpoint"),
    "resume-not-a-checkpoint": (
        ["train", *SMOKE, "--resume", "notes.pt"], {"notes.pt": "just text\n"},
        r"--resume notes\.pt: not a checkpoint \(neither a PyTorch zip archive nor a pickle stream\)$"),
    "stop-at-step-zero": (
        ["train", *SMOKE, "--stop-at-step", "0"], {},
        r"--stop-at-step 0: must be .*runtime\.max_steps \(20\)"),
    "stop-at-step-past-max-steps": (
        ["train", *SMOKE, "--stop-at-step", "21"], {},
        r"--stop-at-step 21: must be .*runtime\.max_steps \(20\)"),
    "stop-at-step-not-a-number": (
        ["train", *SMOKE, "--stop-at-step", "ten"], {},
        r"argument --stop-at-step: invalid int value: 'ten'"),
    "compile-mode-unknown": (
        ["summary", *SMOKE, "--set", 'runtime.compile_mode="fast"'], {},
        r"runtime\.compile_mode must be one of default, reduce-overhead, max-autotune, "
        r"max-autotune-no-cudagraphs; got 'fast'"),
    "fp16-on-cpu": (
        ["train", *SMOKE, "--set", "runtime.precision=fp16"], {},
        r"runtime\.precision=\"fp16\" needs CUDA"),
    "out-dir-is-a-file": (
        ["train", "--config", str(SMOKE_CONFIG), "--set", "runtime.out_dir={work}/taken"], {"taken": "x"},
        r"runtime\.out_dir: .*taken exists and is not a directory"),
    "unknown-command": (
        ["bogus"], {},
        r"invalid choice: 'bogus'"),
    "summary-with-unknown-key": (
        ["summary", *SMOKE, "--set", "model.chanels=8"], {},
        r"unknown key model\.chanels \(did you mean model\.channels\?\)"),
    "config-with-bad-value": (
        ["config", *SMOKE, "--set", "optim.betas=[0.9]"], {},
        r"optim\.betas expects a list of 2 numbers"),
}


def prepare_case(name: str, work: Path) -> tuple[list[str], str]:
    argv, files, pattern = BAD_INPUT[name]
    for file_name, text in files.items():
        (work / file_name).write_text(text)
    return [arg.replace("{work}", str(work)) for arg in argv], pattern


def run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors
        return int(exc.code)


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name: str, workdir: Path, capsys) -> None:
    argv, pattern = prepare_case(name, workdir)
    before = tree(workdir)

    rc = run_main(argv)

    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert out == ""
    assert_user_error(err, r"error: .*" + pattern)
    assert tree(workdir) == before
    assert not (workdir / "run").exists() and not (workdir / "runs").exists()


@pytest.mark.parametrize(("name", "script"), [
    ("unknown-key-in-set", True),
    ("malformed-toml", False),
    ("type-nnue", False),
    ("fresh-with-resume", True),
    ("stop-at-step-past-max-steps", False),
])
def test_bad_input_in_a_real_process(name: str, script: bool, workdir: Path) -> None:
    argv, pattern = prepare_case(name, workdir)
    before = tree(workdir)

    result = run_trainer(*argv, cwd=workdir, script=script)

    assert result.returncode == 2, describe(result)
    assert result.stdout == ""
    prog = "tideborn" if script else r"python -m tideborn\.trainer"
    assert_user_error(result.stderr, rf"^{prog} {argv[0]}: error: .*" + pattern)
    assert tree(workdir) == before


@pytest.mark.parametrize(("change", "pattern"), [
    ("model.channels=16", r"model\.channels was 32, now 16"),
    ("model.activation=silu", r"model\.activation was 'relu', now 'silu'"),
    ("optim.optimizer=adamw", r"optim\.optimizer was 'sgd', now 'adamw'"),
])
def test_resume_is_refused_when_the_network_or_optimizer_changed(
        change: str, pattern: str, template_run: Path, tmp_path: Path, workdir: Path, capsys) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    before = tree(run_dir)

    rc = run_main(["train", *settings_args(run_dir, *TEMPLATE_SETS, "runtime.max_steps=8", change)])

    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, rf"cannot resume from .*step-000000004\.pt: {pattern}\. .*--fresh")
    assert tree(run_dir) == before  # events.jsonl byte for byte, and no new files


def test_resume_of_a_named_checkpoint_is_refused_when_the_shape_changed(
        template_run: Path, tmp_path: Path, workdir: Path, capsys) -> None:
    other = tmp_path / "other"
    rc = run_main(["train", *settings_args(other, "model.channels=16"),
                   "--resume", str(template_run / "step-000000002.pt")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, r"cannot resume from .*step-000000002\.pt: model\.channels was 32, now 16")
    assert not other.exists()


def test_finetune_is_refused_when_the_shape_changed(template_run: Path, tmp_path: Path, workdir: Path,
                                                   capsys) -> None:
    other = tmp_path / "other"
    init = json.dumps(str(template_run / "step-000000004.pt"))
    rc = run_main(["train", *settings_args(other, "model.blocks=3", f"run.init_checkpoint={init}"),
                   "--mode", "finetune"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, r"cannot fine-tune from .*step-000000004\.pt: model\.blocks was 2, now 3")
    assert not other.exists()


def test_stop_at_step_must_come_after_the_resumed_step(template_run: Path, tmp_path: Path, workdir: Path,
                                                      capsys) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    before = tree(run_dir)
    rc = run_main(["train", *settings_args(run_dir, *TEMPLATE_SETS, "runtime.max_steps=8"), "--stop-at-step", "4"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, r"--stop-at-step 4: must be after the start step \(4\) and at most runtime\.max_steps \(8\)")
    assert tree(run_dir) == before


def test_a_finished_run_has_nothing_to_train_and_writes_nothing(template_run: Path, tmp_path: Path,
                                                               workdir: Path, capsys) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    before = tree(run_dir)
    rc = run_main(["train", *settings_args(run_dir, *TEMPLATE_SETS)])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert re.search(r"nothing to train: .*step-000000004\.pt is at step 4, and runtime\.max_steps is 4", out)
    assert tree(run_dir) == before


def test_the_console_script_without_a_command_prints_usage_and_exits_2(workdir: Path) -> None:
    result = run_trainer(cwd=workdir, script=True)
    assert result.returncode == 2
    assert "usage: tideborn COMMAND" in result.stderr and result.stdout == ""  # a mistake: usage to stderr


def test_set_takes_a_quoted_out_dir_with_spaces(workdir: Path) -> None:
    from tideborn.config.load import load_settings

    target = workdir / "dir with space" / "run"
    settings = load_settings(SMOKE_CONFIG, [out_dir_set(target)], environ={}).settings
    assert settings.runtime.out_dir == str(target)

