"""The commands the run tools print for the user to paste quote their paths for the shell: a run directory with a
space and a `;` in its name comes back, through the shell's word splitting (`shlex.split`, what bash does to a
pasted line without expansions), as the one argument it is, never as the start of a second command; a plain path
is printed bare. Each command is the real one, run in this process (`main(argv)`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.common import assert_user_error, settings_args
from tideborn.rundir.events import EventWriter
from tideborn.rundir.files import PidRecord, boot_relative_start, this_host
from tideborn.rundir.kinds import Step
from tideborn.tools import control, train_run

PROG = "python -m tideborn.tools.train_run"
HOSTILE = "my runs; touch pwned"
"""A folder name that, printed bare, splits in two and runs `touch pwned` when the line is pasted."""


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    parent = tmp_path / HOSTILE
    parent.mkdir()
    return parent / "run"


def pasted(line: str) -> list[str]:
    """The argv a shell gives the command `line`, as pasted."""
    return shlex.split(line)


def printed_command(out: str, label: str) -> str:
    (line,) = [line for line in out.splitlines() if line.strip().startswith(label + " ")]
    return line.strip()[len(label):].strip()


def launched_at(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`start` as if its trainer were training in `run_dir` (the launch itself, a process, is the e2e tests')."""
    record = PidRecord(pid=12345, start_time=time.time(), host=this_host(), argv=["x"], started_at=time.time())
    monkeypatch.setattr(train_run, "launch_run", lambda request, wait_seconds: control.Launched(
        run_dir, record, process=None, outcome="running", started_step=0))  # type: ignore[arg-type]


def test_start_prints_status_and_stop_commands_that_paste_as_one_argument(hostile_dir, monkeypatch, capsys):
    launched_at(hostile_dir, monkeypatch)
    assert train_run.main(["start", *settings_args(hostile_dir)]) == 0
    out = capsys.readouterr().out
    for command in ("status", "stop"):
        assert pasted(printed_command(out, command)) == [*PROG.split(), command, "--out-dir", str(hostile_dir)]
    # called as `tideborn run`, the words it was called by lead the command, unquoted
    assert train_run.main(["start", *settings_args(hostile_dir)], prog="tideborn run") == 0
    assert pasted(printed_command(capsys.readouterr().out, "stop")) == [
        "tideborn", "run", "stop", "--out-dir", str(hostile_dir)]


def test_a_plain_path_is_printed_bare(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "runs" / "ckpt" / "x"
    launched_at(run_dir, monkeypatch)
    assert train_run.main(["start", *settings_args(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"  status   {PROG} status --out-dir {run_dir}\n" in out and "'" not in out


def test_the_refusal_of_a_live_run_names_a_stop_command_that_pastes_as_one_argument(hostile_dir, capsys):
    """A live process recorded in train.pid (this one) holds the run directory: start refuses, naming how to stop it."""
    hostile_dir.mkdir()
    me = psutil.Process(os.getpid())
    record = PidRecord(pid=me.pid, start_time=me.create_time(), host=this_host(), argv=["x"], started_at=time.time(),
                       **boot_relative_start(me.pid))
    (hostile_dir / "train.pid").write_text(json.dumps(record.to_dict()))
    assert train_run.main(["start", *settings_args(hostile_dir)]) == 2
    line = assert_user_error(capsys.readouterr().err, rf"a run is already going there: pid {me.pid} ")
    command = re.search(r"stop it first \((.*)\) or choose another runtime\.out_dir$", line)
    assert command, line
    assert pasted(command.group(1)) == [*PROG.split(), "stop", "--out-dir", str(hostile_dir)]


def test_the_chmod_a_refusal_suggests_pastes_as_one_argument(hostile_dir, capsys):
    hostile_dir.mkdir()
    os.chmod(hostile_dir, 0o777)
    assert train_run.main(["start", *settings_args(hostile_dir)]) == 2
    line = assert_user_error(capsys.readouterr().err, r"is writable by others \(mode 777\)")
    command = re.search(r": (chmod .*), or choose another runtime\.out_dir$", line)
    assert command, line
    assert pasted(command.group(1)) == ["chmod", "go-w", str(hostile_dir)]


def test_tensorboard_prints_a_view_command_that_pastes_as_one_argument(hostile_dir, capsys):
    hostile_dir.mkdir()
    with EventWriter(hostile_dir / "events.jsonl") as writer:
        writer.emit(Step, step=1, loss=2.0, policy_loss=1.5, value_loss=0.5, lr=0.1)
    assert train_run.main(["tensorboard", "--out-dir", str(hostile_dir)]) == 0
    out = capsys.readouterr().out
    assert pasted(printed_command(out, "view")) == ["tensorboard", "--logdir", str(hostile_dir / "tensorboard")]
