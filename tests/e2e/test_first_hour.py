"""A newcomer's first hour: what the README promises holds (the suite's size, a clone left clean by its
commands), `summary` says where `train` would stop, a second trainer is turned away before torch loads, and
the wheel carries the package without its benchmarks."""

from __future__ import annotations

import json
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import warnings
import zipfile

import pytest

from tests.helpers.common import (
    REPO_ROOT,
    TEMPLATE_SETS,
    assert_user_error,
    child_env,
    copy_run,
    settings_args,
    trainer_in_process,
    tree,
)
from tideborn.cli import main as tideborn_main

README = REPO_ROOT / "README.md"
TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"


def readme_commands() -> list[list[str]]:
    """Every command line of the README's shell blocks (fenced blocks without a language), as words."""
    blocks = re.findall(r"^```\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [words for block in blocks for line in block.splitlines()
            if (words := shlex.split(line, comments=True))]


# -- the README's commands leave the clone clean -----------------------------------------------------------

OUTPUT_OPTIONS = ("--out", "--output", "-o", "--train", "--test", "--out-dir", "--save-games")


def readme_outputs() -> set[str]:
    """What the README's commands write inside the clone: their output options, the run tools' run
    directories, the GPU check's results directory, and `runs/`, where every training run goes (paths.runs_root)."""
    found = {"runs/"}
    for words in readme_commands():
        for at, word in enumerate(words[:-1]):
            if word in OUTPUT_OPTIONS:
                found.add(words[at + 1])
        if words[0].endswith("gpu-check.sh") and len(words) > 1:
            found.add(words[1].rstrip("/") + "/")
    return found


def test_the_readme_commands_leave_no_untracked_file_in_the_clone():
    """`git status` in a clone stays clean after the README's commands (the exported model included): each
    file or directory they write is under a path git ignores."""
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot ask git what it ignores")
    outputs = readme_outputs()
    assert any(path.endswith(".onnx") for path in outputs), "README: no export example found"
    done = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO_ROOT, capture_output=True,
                          text=True, input="\n".join(sorted(outputs)) + "\n", timeout=60)
    assert done.returncode in (0, 1), done.stderr
    ignored = set(done.stdout.splitlines())
    assert not outputs - ignored, f"README commands write these, which git does not ignore: {sorted(outputs - ignored)}"


# -- summary says where train would stop -------------------------------------------------------------------

def test_summary_says_what_train_says_when_a_data_pattern_matches_nothing(workdir, capsys):
    """smoke-teacher.toml before the README's `data convert` and `data split` (no data/teacher/ yet)."""
    assert tideborn_main(["train", "--config", str(TEACHER_CONFIG)]) == 2
    refusal = assert_user_error(capsys.readouterr().err, r"^tideborn train: error: data\.train: ")
    message = refusal.removeprefix("tideborn train: error: ")
    assert "data/teacher/train.hcpe" in message

    assert tideborn_main(["summary", "--config", str(TEACHER_CONFIG)]) == 0  # it still describes the run
    out, err = capsys.readouterr()
    (data_row,) = [line for line in out.splitlines() if line.startswith("Data ")]
    assert data_row.endswith(f"; train would refuse: {message}")
    assert err == "" and not any(workdir.iterdir()), "summary writes nothing"


@pytest.mark.slow  # a trainer run, and the template run
def test_summary_says_what_train_says_when_there_is_nothing_to_train(template_run, tmp_path, capsys):
    run_dir = copy_run(template_run, tmp_path / "run")  # 4 steps of runtime.max_steps=4
    args = settings_args(run_dir, *TEMPLATE_SETS)
    trained = trainer_in_process("train", *args, cwd=tmp_path)
    assert trained.returncode == 0 and trained.stderr == ""
    said = trained.stdout.strip()
    assert said.startswith(f"nothing to train: {run_dir / 'step-000000004.pt'} is at step 4"), said

    before = tree(run_dir)
    assert tideborn_main(["summary", *args]) == 0
    (run_row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Run dir ")]
    assert run_row.endswith(f"would resume from {run_dir / 'step-000000004.pt'}; {said}")
    assert tree(run_dir) == before


# -- a busy run directory is refused before torch loads ----------------------------------------------------

HOLD_THE_LOCK = """
import sys
from pathlib import Path
from tideborn.rundir.lock import RunDirLock
with RunDirLock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""

SECOND_TRAINER = """
import json, sys
from tideborn.trainer.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch loaded": "torch" in sys.modules}))
"""


def test_a_second_trainer_on_a_busy_run_directory_is_refused_before_torch_loads(tmp_path):
    """Another process holds the run directory's lock, as a running trainer does: `train` names it and
    exits 2 without importing torch (which takes seconds), and touches nothing in the directory."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(run_dir)], cwd=tmp_path, env=child_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree(run_dir)
        second = subprocess.run([sys.executable, "-c", SECOND_TRAINER, "train", *settings_args(run_dir)],
                                cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=180,
                                stdin=subprocess.DEVNULL)
        assert tree(run_dir) == before
    finally:
        holder.communicate(input="", timeout=60)
    assert json.loads(second.stdout) == {"code": 2, "torch loaded": False}, second.stdout + second.stderr
    assert_user_error(second.stderr, rf"^python -m tideborn\.trainer train: error: {re.escape(str(run_dir))}: another "
                                     rf"trainer is using this run directory: pid {holder.pid} \(a trainer started "
                                     r"outside train_run holds \.trainer\.lock\); stop it first")


# -- the wheel ---------------------------------------------------------------------------------------------

def test_the_wheel_ships_the_package_without_its_benchmarks(tmp_path, monkeypatch, capsys):
    """The benchmarks run from a checkout (docs/benchmarks.md, scripts/gpu-check.sh); a wheel leaves them out."""
    pytest.importorskip("setuptools", reason="builds the wheel with the environment's setuptools (no network)")
    source = tmp_path / "source"
    # the checkout's tree as the build sees it: the package with the benchmarks beside it
    for folder in ("tideborn", "benchmarks"):
        shutil.copytree(REPO_ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(tmp_path / "wheel"), str(source)], env=child_env(),
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheel").glob("tideborn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"tideborn/cli.py", "tideborn/tui/tideborn.tcss", "tideborn/match/openings.sfen"} <= set(names)
    assert [name for name in names if name.startswith("benchmarks/")] == []
    # ... while a checkout still runs them as docs/benchmarks.md says (`python -m`, as runpy runs a module:
    # in this process, which already has torch, rather than a new one importing it again)
    monkeypatch.setattr(sys, "argv", ["benchmarks.train", "--help"])
    monkeypatch.chdir(REPO_ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # another test file in this process imported the module
        with pytest.raises(SystemExit) as ended:
            runpy.run_module("benchmarks.train", run_name="__main__", alter_sys=True)
    assert ended.value.code == 0
    assert "train-overhead" in capsys.readouterr().out
