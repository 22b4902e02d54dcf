"""Ctrl-C at any moment of a command's start-up: `data convert`, `data split`, `train` and `scripts/setup.sh`.

A real SIGINT, sent by the process to itself at a chosen point (the start of an import, a call, an event
written), as a terminal's Ctrl-C would land there: one line on stderr, exit status 130, nothing half-written,
and for a trainer that had written `run_started` a terminal event.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.common import REPO_ROOT, child_env, console_script, describe, settings_args
from tests.helpers.data import random_csa_games
from tideborn.data.tools.convert import convert_games
from tideborn.data.tools.split import split_games

CTRL_C_SITE = r'''
"""Test-only (tests/e2e/test_reliability_ctrl_c.py), loaded through PYTHONPATH: a real SIGINT to this process
(as Ctrl-C at a terminal) at the moment TIDEBORN_CTRL_C_AT names, once:
  import:NAME           module NAME starts importing (before its code runs, inside whatever imports it: a C
                        extension's module init that imports numpy gets the KeyboardInterrupt there)
  call:MODULE:FUNCTION  FUNCTION of MODULE is called (patched as MODULE is loaded)
  event:KIND            the trainer has written its event KIND to events.jsonl
"""
import importlib.machinery
import os
import signal
import sys

_spec = os.environ.get("TIDEBORN_CTRL_C_AT", "")
_kind, _, _what = _spec.partition(":")
_fired = []


def _ctrl_c():
    if not _fired:
        _fired.append(True)
        os.kill(os.getpid(), signal.SIGINT)


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if _kind == "import" and name == _what:
            _ctrl_c()
            return None
        module, _, function = _what.partition(":")
        if _kind == "event":
            module, function = "tideborn.rundir.events", "EventWriter"
        if _kind not in ("call", "event") or name != module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def patched(loaded):
            exec_module(loaded)
            if _kind == "call":
                real = getattr(loaded, function)

                def call(*args, **kwargs):
                    _ctrl_c()
                    return real(*args, **kwargs)

                setattr(loaded, function, call)
            else:
                emit = loaded.EventWriter.emit

                def emitted(self, record, **fields):  # record: the event's record class (rundir.kinds)
                    emit(self, record, **fields)
                    if record.KIND == _what:
                        _ctrl_c()

                loaded.EventWriter.emit = emitted

        spec.loader.exec_module = patched
        return spec


if _kind:
    # Ctrl-C as in a terminal's foreground job, even where the test runs with SIGINT ignored (a background job)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.meta_path.insert(0, _Finder())
'''


def ctrl_c_env(tmp_path: Path, at: str) -> dict[str, str]:
    site = tmp_path / "ctrl-c-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(CTRL_C_SITE)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)]), "TIDEBORN_CTRL_C_AT": at}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, cwd=cwd, env=child_env(env), capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command)} did not finish in 300 s (hung?)")


def one_line(result: subprocess.CompletedProcess, pattern: str) -> None:
    """Exit status 130 and one line on stderr matching `pattern`, nothing else (no traceback)."""
    assert result.returncode == 130, describe(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(pattern, lines[0]), describe(result)


def files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# -- data convert and data split --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def games_hcpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted hcpe file of 20 random games, with its game index, and the games as CSA files."""
    root = tmp_path_factory.mktemp("games")
    random_csa_games(root / "games", 20)
    convert_games([root / "games"], root / "all.hcpe", progress=False)
    return root / "all.hcpe"


# numpy, and its C core, imported by cshogi's module init, which turned the KeyboardInterrupt into
# "numpy.core.multiarray failed to import" (an ImportError that keeps no trace of it)
IMPORTS = ["numpy", "numpy._core._multiarray_umath"]


@pytest.mark.parametrize("module", IMPORTS)
@pytest.mark.parametrize("how", ["python -m tideborn.data", "tideborn data"])
def test_ctrl_c_while_convert_imports_is_one_line(games_hcpe, tmp_path, module, how):
    """Before: a 17-line traceback ending in numpy's `failed to import`, exit status 1."""
    command = [sys.executable, "-m", "tideborn.data"] if how.startswith("python") else [str(console_script()), "data"]
    done = run([*command, "convert", str(games_hcpe.parent / "games"), "--output", "out/all.hcpe"], tmp_path,
               ctrl_c_env(tmp_path, f"import:{module}"))
    one_line(done, rf"^{re.escape(how)} convert: interrupted \(Ctrl-C\); nothing half-written is left$")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", IMPORTS)
def test_ctrl_c_while_split_imports_is_one_line_and_keeps_the_old_pair(games_hcpe, tmp_path, module):
    pair = tmp_path / "pair"
    pair.mkdir()
    split_games(games_hcpe, pair / "train.hcpe", pair / "test.hcpe", test_fraction=0.3, seed=1, progress=False)
    before = {name: (pair / name).read_bytes() for name in files_under(pair)}
    done = run([sys.executable, "-m", "tideborn.data", "split", str(games_hcpe), "--train", "pair/train.hcpe",
                "--test", "pair/test.hcpe", "--seed", "2"], tmp_path, ctrl_c_env(tmp_path, f"import:{module}"))
    one_line(done, r"^python -m tideborn\.data split: interrupted \(Ctrl-C\); nothing half-written is left$")
    assert {name: (pair / name).read_bytes() for name in files_under(pair)} == before


# -- train start-up ----------------------------------------------------------------------------------------------

def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("config", "at"), [
    ("smoke-teacher", "import:numpy"),  # imported by cshogi's init: the KeyboardInterrupt becomes an ImportError
    ("smoke", "import:numpy"),  # imported by torch's init, which drops the KeyboardInterrupt and goes on without numpy
    ("smoke", "import:torch"),
    ("smoke-teacher", "call:tideborn.data.sets.sources:training_source"),  # the teacher data's first open
])
def test_ctrl_c_before_the_trainer_takes_its_run_directory_writes_nothing(games_hcpe, tmp_path, config, at):
    """The process ends at once (or, where an import swallowed the Ctrl-C, before it writes anything): one line,
    nothing written. (Before: the start-up went on, then `stopped (SIGINT) at step 0; checkpoint None` and exit
    status 0.)"""
    data = tmp_path / "data"
    data.mkdir()
    split_games(games_hcpe, data / "train.hcpe", data / "test.hcpe", test_fraction=0.3, seed=1, progress=False)
    run_dir = tmp_path / "run"
    teacher = ['data.train=["data/train.hcpe"]', 'data.test=["data/test.hcpe"]'] if config == "smoke-teacher" else []
    done = run([str(console_script()), "train",
                *settings_args(run_dir, *teacher, config=REPO_ROOT / "configs" / f"{config}.toml")],
               tmp_path, ctrl_c_env(tmp_path, at))
    one_line(done, r"^tideborn train: interrupted \(Ctrl-C\) before the first step; nothing was written$")
    assert not run_dir.exists() and done.stdout == "", describe(done)


@pytest.mark.parametrize("at", ["call:tideborn.network.model:build_model", "event:run_started"])
def test_ctrl_c_after_the_trainer_took_its_run_directory_ends_the_attempt_in_its_events(tmp_path, at):
    """The model's build (the run directory held, `run_started` not yet written) and right after `run_started`:
    the attempt ends with `run_stopped`, no checkpoint, one line, exit status 130. (Before: exit status 0 and
    `stopped (SIGINT) at step 0; checkpoint None`.)"""
    run_dir = tmp_path / "run"
    done = run([sys.executable, "-m", "tideborn.trainer", "train", *settings_args(run_dir)], tmp_path,
               ctrl_c_env(tmp_path, at))
    one_line(done, r"^python -m tideborn\.trainer train: interrupted \(Ctrl-C\) before the first step; no checkpoint "
                   r"was written, the events end in run_stopped$")
    assert "checkpoint None" not in done.stdout, describe(done)
    kinds = [event["kind"] for event in events(run_dir)]
    assert kinds == ["run_started", "stop_requested", "run_stopped"], kinds
    stopped = events(run_dir)[-1]
    assert stopped["reason"] == "SIGINT" and stopped["step"] == 0 and stopped["checkpoint"] is None
    assert [name for name in files_under(run_dir) if name.endswith(".pt") or ".tmp" in name] == []


# -- scripts/setup.sh --------------------------------------------------------------------------------------------

FAKE_PYTHON = r'''#!/usr/bin/env bash
# Test-only (tests/e2e/test_reliability_ctrl_c.py): the interpreter of a scratch setup.sh run. It answers what
# setup.sh asks of a venv's python, installs nothing, and where CTRL_C_AT names its step, the command there is
# interrupted by Ctrl-C at the terminal: SIGINT to the whole process group, setup.sh included.
#   pip      `python -m pip install` (not --dry-run), which handles it as pip does: lines in its log, exit 1
#   inspect  `python -c ... installed` (which torch the venv has): Python's KeyboardInterrupt traceback
#   venv     `python -m venv DIR`: DIR made, then Python's KeyboardInterrupt traceback
#   pick     `python -c 'import sys, venv ...'` (is this a Python to make the venv with): a traceback
REAL=@REAL@
FAKES=@FAKES@
case "$1 $2" in
    "-m pip")
        case "$3" in
            --version) echo "pip 25.2 (fake)"; exit 0 ;;
            install)
                if [[ " $* " == *" --dry-run "* ]]; then
                    report="$(for a in "$@"; do [[ "$prev" == --report ]] && echo "$a"; prev="$a"; done)"
                    echo '{"install": [{"metadata": {"name": "torch", "version": "2.13.0+cpu"}}]}' > "$report"
                    exit 0
                fi
                [[ "$CTRL_C_AT" == pip ]] && exec "$REAL" "$FAKES/ctrl_c.py" handled
                exit 0 ;;
        esac ;;
    "-m venv")
        mkdir -p "$3/bin"
        [[ "$CTRL_C_AT" == venv ]] && exec "$REAL" "$FAKES/ctrl_c.py" traceback
        cp "$0" "$3/bin/python"; exit 0 ;;
esac
if [[ "$1" == -m ]]; then echo "fake python: unexpected $*" >&2; exit 99; fi
if [[ "$1" == -c && "$2" == *"import pip"* ]]; then exit 1; fi  # pip is new enough
if [[ "$1" == -c && "$2" == *"import sys, venv"* && "$CTRL_C_AT" == pick ]]; then
    exec "$REAL" "$FAKES/ctrl_c.py" traceback
fi
if [[ "$1" == -c && "${*: -1}" == installed ]]; then
    [[ "$CTRL_C_AT" == inspect ]] && exec "$REAL" "$FAKES/ctrl_c.py" traceback
    echo "none - -"; exit 0
fi
exec "$REAL" "$@"
'''

CTRL_C_PY = r'''
"""Ctrl-C at the terminal while this command runs: SIGINT to its whole process group (setup.sh's too). `handled`:
as pip takes it (lines in its log, then exit status 1); `traceback`: as Python takes it (a traceback)."""
import os
import signal
import sys
import time

signal.signal(signal.SIGINT, signal.default_int_handler)
for n in range(25):
    print(f"Collecting something ({n})", flush=True)
try:
    os.killpg(os.getpgid(0), signal.SIGINT)
    for _ in range(60_000):  # the KeyboardInterrupt comes at once; this only bounds a test that went wrong
        time.sleep(0.01)
    sys.exit("no SIGINT arrived")
except KeyboardInterrupt:
    if sys.argv[1] != "handled":
        raise
    print("ERROR: Operation cancelled by user", file=sys.stderr)
    sys.exit(1)
'''

# bash as a terminal's foreground job has SIGINT at its default (a trap can be set), whatever the test runs under
FOREGROUND_BASH = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execvp('bash', sys.argv[1:])")


@pytest.mark.parametrize("step", ["pip", "inspect", "venv", "pick"])
def test_ctrl_c_during_setup_is_one_line_and_leaves_no_stamp(tmp_path, step):
    """A copy of scripts/setup.sh in a scratch checkout, with a fake interpreter (nothing is installed, the
    project's .venv is not touched), interrupted while pip installs torch, while it inspects the venv's torch,
    while it makes the venv and, before anything changed, while it looks for a Python to make it with. Before:
    pip's last 30 log lines and `installing torch==2.13.0 failed`, exit 1, or Python's traceback, or no word
    at all; now one line, exit 130, and no stamp, so the next run does the setup again."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "ctrl_c.py").write_text(CTRL_C_PY)
    fake_python = fakes / "python"
    fake_python.write_text(FAKE_PYTHON.replace("@REAL@", sys.executable).replace("@FAKES@", str(fakes)))
    fake_python.chmod(0o755)
    no_network = fakes / "bin"
    no_network.mkdir()
    (no_network / "python3").write_text("#!/bin/sh\nexit 1\n")  # the PyTorch index probe: unreachable
    (no_network / "python3").chmod(0o755)
    if step not in ("venv", "pick"):
        (root / ".venv" / "bin").mkdir(parents=True)
        shutil.copy(fake_python, root / ".venv" / "bin" / "python")
    env = {**child_env(), "PATH": f"{no_network}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path),
           "TIDEBORN_TORCH": "cpu", "TIDEBORN_INSTALLER": "pip", "TIDEBORN_PYTHON": str(fake_python),
           "CTRL_C_AT": step}
    env.pop("TIDEBORN_SETUP_VERBOSE", None)
    try:
        done = subprocess.run([sys.executable, "-c", FOREGROUND_BASH, "bash", "scripts/setup.sh"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                              start_new_session=True)  # its own process group, as a terminal's job
    except subprocess.TimeoutExpired:
        pytest.fail("setup.sh did not finish in 300 s (hung?)")
    if step == "pick":
        one_line(done, r"^setup\.sh: interrupted \(Ctrl-C\); \.venv left as it was$")
        assert not (root / ".venv").exists()
        return
    one_line(done, r"^setup\.sh: interrupted \(Ctrl-C\); \.venv is not finished: run scripts/setup\.sh again$")
    assert "failed" not in done.stdout, describe(done)
    assert not (root / ".venv" / ".tideborn-setup").exists()
    assert not list((root / ".venv").glob("tideborn-torch-report*")), "pip's report left behind"
