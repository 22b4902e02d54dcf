"""Every command in the README's shell blocks runs as written from a clone: its program exists (after
`source .venv/bin/activate`, which the README asks for once, up front) and its `--help` works; every file
it reads (a config, teacher files, a checkpoint, a run directory) ships with the project or is made by an
earlier README command; and the teacher-data commands run as they are, on the sample games that ship
with the project."""

from __future__ import annotations

import argparse
import fnmatch
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import typing
from pathlib import Path

import pytest

from tests.helpers.common import REPO_ROOT
from tests.helpers.readme import VENV_BIN, activated_env, shell_blocks, teacher_block

ACTIVATE = "source .venv/bin/activate"
SUBCOMMAND = re.compile(r"^[a-z][a-z0-9_-]*$")


def commands() -> list[tuple[int, str]]:
    """Every command (`a && b` is two) with the index of its block."""
    found = []
    for index, block in enumerate(shell_blocks()):
        for line in block:
            words = shlex.split(line)
            cuts = [-1] + [at for at, word in enumerate(words) if word == "&&"] + [len(words)]
            found += [(index, shlex.join(words[a + 1:b])) for a, b in zip(cuts, cuts[1:], strict=False) if b > a + 1]
    return found


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


def test_the_readme_asks_once_to_activate_the_environment_before_any_bare_command():
    found = commands()
    activation = [index for index, (_, command) in enumerate(found) if command == ACTIVATE]
    assert activation, f"README: no `{ACTIVATE}` block"
    assert (VENV_BIN.parent / "bin" / "activate").is_file() or (REPO_ROOT / ".venv/bin/activate").is_file()
    for number, (_, command) in enumerate(found):
        program = shlex.split(command)[0]
        if "/" not in program and program not in ("source", "uv"):
            assert number > activation[0], f"README: `{command}` comes before `{ACTIVATE}`"


@pytest.fixture(scope="module")
def help_of() -> typing.Callable[[list[str]], subprocess.CompletedProcess]:
    """Each `--help` command line run once: README commands with the same program and subcommand words
    (`./scripts/test.sh` and `./scripts/test.sh -m 'not slow'`) ask for the same help, seconds each for
    the test script (it checks the environment, then pytest loads its plugins)."""
    done: dict[tuple[str, ...], subprocess.CompletedProcess] = {}

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        if tuple(argv) not in done:
            done[tuple(argv)] = subprocess.run(argv, cwd=REPO_ROOT, env=activated_env(), capture_output=True,
                                               text=True, timeout=180, stdin=subprocess.DEVNULL)
        return done[tuple(argv)]
    return run


@pytest.mark.parametrize("command", sorted({c for _, c in commands() if c != ACTIVATE}))
def test_each_readme_command_exists_and_its_help_works(command, help_of):
    argv = help_argv(command)
    program = argv[0]
    if program == "uv" and shutil.which("uv") is None:
        pytest.skip("uv is not installed here (the README's uv path is optional)")
    if "/" in program:
        path = REPO_ROOT / program
        assert path.is_file() and os.access(path, os.X_OK), f"README: `{command}`: {program} is not an executable"
    elif program != "uv":
        assert (VENV_BIN / program).is_file(), f"README: `{command}`: {program} is not in the environment"
    done = help_of(argv)
    assert done.returncode == 0, f"`{shlex.join(argv)}` exited {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip(), f"`{shlex.join(argv)}` printed no help"
    if "Traceback" in done.stderr:
        pytest.fail(f"`{shlex.join(argv)}`: {done.stderr[-2000:]}")


# -- what each command reads was made before it -------------------------------------------------------

def tracked_files() -> set[str]:
    """What a fresh clone holds: the files git tracks."""
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot tell what a fresh clone holds")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return {name for name in listed.stdout.split("\0") if name}


def tideborn_words(command: str) -> list[str] | None:
    """The command as `tideborn` arguments (`tui` for the monitor), or None for setup, tests and scripts."""
    words = shlex.split(command)
    if words[:2] == ["uv", "run"]:
        words = words[2:]
    if not words:
        return None
    program = posixpath.basename(words[0])
    modules = {"tideborn.trainer": [], "tideborn.tools.train_run": ["run"], "tideborn.data": ["data"]}
    if program == "python" and words[1] == "-m" and words[2] in modules:
        return modules[words[2]] + words[3:]
    if program == "tideborn":
        return words[1:]
    if program == "tideborn-tui":
        return ["tui", *words[1:]]
    return None


def parsed(words: list[str]) -> argparse.Namespace:
    """The command's options as its own parser reads them."""
    from tideborn.data.tools.cli import build_parser as data_parser
    from tideborn.export.cli import build_parser as export_parser
    from tideborn.match.cli import build_parser as match_parser
    from tideborn.tools.train_run import build_parser as run_parser
    from tideborn.trainer.cli import build_parser as trainer_parser
    from tideborn.tui.options import build_parser as tui_parser

    head, rest = words[0], words[1:]
    parser = {"run": run_parser("tideborn run"), "data": data_parser("tideborn data"), "export": export_parser(),
              "match": match_parser(), "tui": tui_parser()}.get(head)
    return parser.parse_args(rest) if parser is not None else trainer_parser("tideborn").parse_args(words)


def saved_steps(start: int, end: int, every: int) -> list[int]:
    """The checkpoints a run from `start` to `end` writes: every `every` steps, and the last."""
    return sorted({*range((start // every + 1) * every, end + 1, every), end}) if end > start else []


class FreshClone:
    """What exists after each README command, in order: tracked files, files made, and each run directory's
    checkpoint steps (None: some, not known which: a detached run stopped at a moment)."""

    def __init__(self) -> None:
        self.files = tracked_files()
        self.runs: dict[str, set[int] | None] = {}

    def has_file(self, path: str | os.PathLike, why: str) -> None:
        name = posixpath.normpath(str(path))
        matches = (fnmatch.filter(self.files, name) if any(c in name for c in "*?[") else
                   [f for f in self.files if f == name or f.startswith(name + "/")])
        assert matches, f"{why}: {name} is neither in a fresh clone nor made by an earlier README command"

    def has_run(self, run_dir: str | os.PathLike, why: str) -> str:
        name = posixpath.normpath(str(run_dir))
        assert name in self.runs, f"{why}: no earlier README command trains in {run_dir}"
        return name

    def has_checkpoint(self, path: Path, why: str) -> None:
        from tideborn.rundir.layout import parse_step

        steps = self.runs.get(self.has_run(path.parent, why))
        assert steps is not None, f"{why}: which checkpoints {path.parent} holds depends on when it was stopped"
        assert parse_step(path) in steps, f"{why}: {path.parent} holds the steps {sorted(steps)}, not {path.name}"

    def trains(self, args: argparse.Namespace, why: str, detached: bool) -> None:
        from tideborn.config.load import load_settings
        from tideborn.rundir.layout import run_dir_of

        flags = {name: getattr(args, name) for name in ("type", "network", "mode")}
        settings = load_settings(args.config, args.overrides, flags, environ={}, cwd=REPO_ROOT).settings
        assert settings.runtime.device != "cuda", f"{why}: needs a CUDA GPU"
        if settings.data.kind != "synthetic":
            for pattern in [*settings.data.train, *settings.data.test]:
                self.has_file(posixpath.join(settings.paths.data_root, pattern), f"{why}: data")
        run_dir = posixpath.normpath(str(run_dir_of(settings)))
        before = set() if getattr(args, "fresh", False) else (self.runs.get(run_dir) or set())
        if detached or getattr(args, "stop_at_step", None) is not None or self.runs.get(run_dir, set()) is None:
            self.runs[run_dir] = None
            return
        runtime = settings.runtime
        steps = sorted(before | set(saved_steps(max(before, default=0), runtime.max_steps, runtime.checkpoint_every)))
        self.runs[run_dir] = set(steps[-runtime.keep_checkpoints:] if runtime.keep_checkpoints > 0 else steps)

    def run(self, command: str) -> None:
        words = tideborn_words(command)
        if words is None:
            return
        args = parsed(words)
        why = f"README: `{command}`"
        if getattr(args, "config", None) is not None:
            self.has_file(args.config, why)
        head = words[0]
        if head == "train" or (head == "run" and args.command == "start"):
            self.trains(args, why, detached=head == "run")
        elif head == "run":
            self.has_run(args.out_dir, why)
        elif head == "tui":
            self.has_run(args.path, why)
        elif head == "data" and args.command == "convert":
            for source in args.inputs:
                self.has_file(source, why)
            self.files |= {str(args.output), str(args.output.with_suffix(".games.csv"))}
        elif head == "data" and args.command == "split":
            self.has_file(args.source, why)
            self.files |= {str(args.train), str(args.test)}
        elif head == "data":
            for name in args.files:
                self.has_file(name, why)
        elif head == "export":
            self.has_checkpoint(args.checkpoint, why)
            self.files.add(str(args.out))
        elif head == "match":
            self.has_checkpoint(args.first, why)
            self.has_checkpoint(args.second, why)


def test_each_readme_command_reads_only_what_a_fresh_clone_or_an_earlier_readme_command_has():
    """A config that is not there, teacher files nobody made (`data.train: 'train/*.hcpe' matches no
    files`), a checkpoint or run directory no earlier command trains: each fails this, not a newcomer."""
    clone = FreshClone()
    for _, command in commands():
        clone.run(command)
    assert clone.runs, "README: no command trains"


@pytest.mark.parametrize(("readme", "problem"), [
    (["tideborn train --config configs/nope.toml"], "configs/nope.toml is neither in a fresh clone"),
    (["tideborn train --config configs/rtx4070ti.toml"], "needs a CUDA GPU"),
    (["tideborn train --config configs/rtx4070ti.toml --set runtime.device='\"cpu\"'"],
     "data: train/*.hcpe is neither in a fresh clone"),
    (["python -m tideborn.tools.train_run status --out-dir runs/ckpt/rtx4070ti"], "no earlier README command"),
    (["tideborn train --config configs/smoke.toml",
      "tideborn export --checkpoint runs/ckpt/smoke/step-000000005.pt --out m.onnx"], "not step-000000005.pt"),
    (["tideborn train --config configs/smoke.toml --set runtime.max_steps=100",
      "tideborn match runs/ckpt/smoke/step-000000010.pt runs/ckpt/smoke/step-000000100.pt"],
     "holds the steps [80, 90, 100], not step-000000010.pt"),
    (["python -m tideborn.tools.train_run start --config configs/smoke.toml",
      "tideborn export --checkpoint runs/ckpt/smoke/step-000000020.pt --out m.onnx"], "when it was stopped"),
])
def test_the_fresh_clone_check_catches_what_a_fresh_clone_lacks(readme, problem):
    clone = FreshClone()
    with pytest.raises(AssertionError, match=re.escape(problem)):
        for command in readme:
            clone.run(command)


def test_the_fresh_clone_check_follows_the_teacher_data_the_readme_makes():
    clone = FreshClone()
    for command in teacher_block():
        clone.run(command)
    assert clone.runs == {"runs/ckpt/smoke-teacher": {100, 200, 300}}
