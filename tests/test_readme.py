"""Every command in the README's shell blocks runs as written from a clone: its program exists (after
`source .venv/bin/activate`, which the README asks for once, up front) and its `--help` works; the
teacher-data commands run as they are, on the sample games that ship with the project."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, child_env, events_of

README = REPO_ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
ACTIVATE = "source .venv/bin/activate"
SUBCOMMAND = re.compile(r"^[a-z][a-z0-9_-]*$")


def shell_blocks() -> list[list[str]]:
    """The README's fenced blocks without a language (its shell commands), as lines, comments removed."""
    blocks = re.findall(r"^```\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [[line for line in (shlex.join(shlex.split(raw, comments=True)) for raw in block.splitlines()) if line]
            for block in blocks]


def commands() -> list[tuple[int, str]]:
    """Every command (`a && b` is two) with the index of its block."""
    return [(index, part.strip()) for index, block in enumerate(shell_blocks()) for line in block
            for part in line.split(" && ")]


def help_argv(command: str) -> list[str]:
    """The command's program and subcommand words, then `--help`."""
    words = shlex.split(command)
    program = words[0]
    if program == "python" and words[1] == "-m":
        keep = words[:3] + [w for w in words[3:4] if SUBCOMMAND.match(w)]
    elif program == "uv":
        keep = words[:2]  # `uv run --help`, not the command it would run
    else:
        keep = [program]
        for word in words[1:]:
            if not SUBCOMMAND.match(word):
                break
            keep.append(word)
    return [*keep, "--help"]


def activated_env() -> dict[str, str]:
    """The environment after `source .venv/bin/activate`: the virtual environment's programs first."""
    env = child_env()
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    return env


def test_the_readme_asks_once_to_activate_the_environment_before_any_bare_command():
    found = commands()
    activation = [index for index, (_, command) in enumerate(found) if command == ACTIVATE]
    assert activation, f"README: no `{ACTIVATE}` block"
    assert (VENV_BIN.parent / "bin" / "activate").is_file() or (REPO_ROOT / ".venv/bin/activate").is_file()
    for number, (_, command) in enumerate(found):
        program = shlex.split(command)[0]
        if "/" not in program and program not in ("source", "uv"):
            assert number > activation[0], f"README: `{command}` comes before `{ACTIVATE}`"


@pytest.mark.parametrize("command", sorted({c for _, c in commands() if c != ACTIVATE}))
def test_each_readme_command_exists_and_its_help_works(command):
    argv = help_argv(command)
    program = argv[0]
    if program == "uv" and shutil.which("uv") is None:
        pytest.skip("uv is not installed here (the README's uv path is optional)")
    if "/" in program:
        path = REPO_ROOT / program
        assert path.is_file() and os.access(path, os.X_OK), f"README: `{command}`: {program} is not an executable"
    elif program != "uv":
        assert (VENV_BIN / program).is_file(), f"README: `{command}`: {program} is not in the environment"
    done = subprocess.run(argv, cwd=REPO_ROOT, env=activated_env(), capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"`{shlex.join(argv)}` exited {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip(), f"`{shlex.join(argv)}` printed no help"
    if "Traceback" in done.stderr:
        pytest.fail(f"`{shlex.join(argv)}`: {done.stderr[-2000:]}")


def teacher_block() -> list[str]:
    block = [b for b in shell_blocks() if any("data convert" in line for line in b)]
    assert len(block) == 1, "README: one block converts game records"
    return block[0]


@pytest.mark.slow
def test_the_readme_teacher_data_commands_run_as_written_on_the_shipped_games(tmp_path):
    """As in a fresh clone: only what git tracks (samples/, configs/) and no ../shared beside it."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for tracked in ("samples", "configs"):
        shutil.copytree(REPO_ROOT / tracked, clone / tracked)
    env = activated_env()
    for command in teacher_block():
        done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}: {done.stderr[-2000:]}"
    events = events_of(clone / "runs" / "ckpt" / "smoke-teacher")
    evals = [e for e in events if e["kind"] == "eval"]
    assert evals and evals[-1]["step"] == 300 and evals[-1]["positions"] > 500
    assert evals[-1]["policy_accuracy"] > 1 / 2187
