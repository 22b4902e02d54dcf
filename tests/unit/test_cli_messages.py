"""The command line as a newcomer meets it: `train` refuses to start the bare defaults' day-long run, a
missing teacher file names its setting and how to make it, one error prefix (`tideborn COMMAND: error:`),
a description in every subcommand's --help, help for every option, one wording of --config, and a bare
`tideborn` prints its usage to stderr."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.common import REPO_ROOT, child_env, console_script, copy_run, trainer_in_process, tree
from tideborn.data.tools.cli import build_parser as data_parser
from tideborn.tools.train_run import build_parser as run_parser
from tideborn.tools.train_run import main as run_tools_main
from tideborn.trainer.cli import build_parser as trainer_parser


def tideborn(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`tideborn ARGS` through the console script's own `main`, in this process: these tests read only the exit
    status and the lines written, which `main` makes itself. The console script and `python -m
    tideborn.tools.train_run` as real processes: `tideborn_process`, in the tests of the bare `tideborn` and of
    an empty directory (and `tideborn-tui`'s in the monitor's)."""
    return trainer_in_process(*args, cwd=cwd, console=True)


def tideborn_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(console_script()), *args], cwd=cwd, env=child_env(), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_train_without_chosen_settings_refuses_before_anything_is_written(tmp_path):
    done = tideborn("train", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tideborn train: error: no settings chosen")
    assert "--config" in lines[0] and "10x192" in lines[0]
    assert tree(tmp_path) == {} and done.stdout == ""


def test_train_with_a_project_file_or_a_preset_is_not_refused(tmp_path):
    # settings someone chose, each stopped later by its missing teacher file: the refusal is not what stops it
    (tmp_path / "tideborn.toml").write_text('[data]\nkind = "hcpe"\ntrain = ["nope.hcpe"]\n', encoding="utf-8")
    done = tideborn("train", cwd=tmp_path)
    assert done.returncode == 2 and "data.train: " in done.stderr and "no settings chosen" not in done.stderr
    (tmp_path / "tideborn.toml").unlink()
    done = tideborn("train", "--network", "resnet2x32", "--set", 'data.kind="hcpe"',
                    "--set", 'data.train=["nope.hcpe"]', cwd=tmp_path)
    assert done.returncode == 2 and "data.train: " in done.stderr and "no settings chosen" not in done.stderr


def test_a_missing_teacher_file_names_its_setting_and_how_to_make_it(tmp_path):
    config = REPO_ROOT / "configs" / "smoke-teacher.toml"
    done = trainer_in_process("train", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("python -m tideborn.trainer train: error: data.train: ")
    assert "data/teacher/train.hcpe: no such file; make it with `tideborn data convert" in line
    assert not (tmp_path / "runs").exists()


def test_a_teacher_glob_that_matches_nothing_names_its_setting_and_how_to_make_the_files(tmp_path):
    # the production config in a fresh clone: no teacher files in train/ yet
    done = tideborn("train", "--config", str(REPO_ROOT / "configs" / "rtx4070ti.toml"), "--set",
                    'runtime.device="cpu"', cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("tideborn train: error: data.train: 'train/*.hcpe' matches no files (looked for ")
    assert line.endswith("; make them with `tideborn data convert RECORDS --output ALL.hcpe` then `tideborn data "
                         "split` (README, docs/data.md)")
    assert tree(tmp_path) == {}


@pytest.mark.parametrize(("args", "prefix"), [
    (["train", "--config", "missing.toml"], "tideborn train: error: "),
    (["data", "inspect", "missing.hcpe"], "tideborn data inspect: error: "),
    (["run", "start", "--config", "missing.toml"], "tideborn run start: error: "),
    (["export", "--checkpoint", "missing.pt", "--out", "m.onnx"], "tideborn export: error: "),
])
def test_every_command_prefixes_its_errors_with_its_own_name(tmp_path, args, prefix):
    done = tideborn(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(prefix), line


ONE_STYLE = re.compile(r"(?P<program>tideborn|python -m tideborn\.tools\.train_run|tideborn-tui)(?P<command>( [a-z]+)*)"
                       r": error: \S.*")


@pytest.mark.parametrize(("args", "command", "code"), [
    (["train", "--config", "missing.toml"], "train", 2),
    (["summary", "--config", "missing.toml"], "summary", 2),
    (["config", "--config", "missing.toml"], "config", 2),
    (["train", "--no-such-option"], "train", 2),
    (["data", "inspect", "missing.hcpe"], "data inspect", 2),
    (["data", "verify", "missing.hcpe"], "data verify", 2),
    (["data", "convert", "missing", "--output", "out.hcpe"], "data convert", 2),
    (["data", "split", "missing.hcpe", "--train", "a.hcpe", "--test", "b.hcpe"], "data split", 2),
    (["export", "--checkpoint", "missing.pt", "--out", "m.onnx"], "export", 2),
    (["match", "missing.pt", "other.pt"], "match", 2),
    (["run", "start", "--config", "missing.toml"], "run start", 2),
    (["run", "status"], "run status", 2),
    (["run", "status", "--out-dir", "missing", "--no-such-option"], "run status", 2),
    (["data", "inspect", "missing.hcpe", "--no-such-option"], "data inspect", 2),
    (["run", "status", "--out-dir", "missing"], "run status", 3),
    (["run", "stop", "--out-dir", "missing"], "run stop", 3),
    (["run", "stop", "--out-dir", "."], "run stop", 3),
    (["run", "watch", "--out-dir", "missing"], "run watch", 3),
    (["bogus"], "", 2),
])
def test_every_commands_error_line_has_one_style(tmp_path, args, command, code):
    """`tideborn COMMAND: error: MESSAGE`, one line on stderr, for bad input and usage (2) as for the run
    tools' "no run there" (3): the trainer, the data tools, export, match and the run tools alike."""
    done = tideborn(*args, cwd=tmp_path)
    assert done.returncode == code, done.stderr
    [line] = done.stderr.strip().splitlines()
    found = ONE_STYLE.fullmatch(line)
    assert found and found["program"] == "tideborn" and found["command"] == (f" {command}" if command else ""), line


@pytest.mark.parametrize("command", ["status", "stop", "watch"])
def test_the_run_tools_errors_have_the_same_style_when_run_as_a_module(tmp_path, monkeypatch, capsys, command):
    # `python -m tideborn.tools.train_run` runs this `main` with its default prog; the module run as a real
    # process is in the empty directory's test below
    monkeypatch.chdir(tmp_path)
    assert run_tools_main([command, "--out-dir", "missing"]) == 3
    done = capsys.readouterr()
    [line] = done.err.strip().splitlines()
    assert line == f"python -m tideborn.tools.train_run {command}: error: missing: no such directory"


@pytest.mark.parametrize("prog", ["tideborn run", "python -m tideborn.tools.train_run"])
def test_an_empty_directory_says_how_to_start_a_run_the_way_the_user_called_the_tools(tmp_path, prog):
    (tmp_path / "empty").mkdir()
    command = [str(console_script()), "run"] if prog == "tideborn run" else \
        [sys.executable, "-m", "tideborn.tools.train_run"]
    done = subprocess.run([*command, "status", "--out-dir", "empty"], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 3
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"{prog} status: error: empty: no run here"), line
    assert line.endswith(f"start one with {prog} start"), line


def test_the_monitors_errors_have_the_same_style(tmp_path):
    for args, message in ((["--no-such-option"], "unrecognized arguments: --no-such-option (see --help)"),
                          (["missing"], f"{tmp_path / 'missing'}: no such directory")):
        done = subprocess.run([str(console_script().parent / "tideborn-tui"), *args], cwd=tmp_path,
                              env=child_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 2
        [line] = done.stderr.strip().splitlines()
        assert ONE_STYLE.fullmatch(line) and line.startswith(f"tideborn-tui: error: {message}"), line


def test_stop_on_an_ended_run_is_an_error_line_of_the_same_style(template_run, tmp_path):
    run_dir = copy_run(template_run, tmp_path / "run")
    done = tideborn("run", "stop", "--out-dir", str(run_dir), cwd=tmp_path)
    assert done.returncode == 3 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line == (f"tideborn run stop: error: {run_dir}: the run is not running: it already ended (run_finished at "
                    "step 4); nothing was signalled")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    found = {}
    for name, parser in (("tideborn", trainer_parser("tideborn")), ("tideborn data", data_parser("tideborn data")),
                         ("tideborn run", run_parser("tideborn run"))):
        [choices] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        found.update({f"{name} {command}": sub for command, sub in choices.choices.items()})
    return found


def test_every_subcommand_has_a_description_and_every_option_has_help():
    for name, parser in subcommands().items():
        assert parser.description, f"{name} --help has no description"
        undocumented = [a.option_strings or a.dest for a in parser._actions if not a.help]
        assert not undocumented, f"{name}: options without help: {undocumented}"


def test_config_is_described_the_same_way_everywhere():
    wordings = {a.help for parser in subcommands().values() for a in parser._actions if "--config" in a.option_strings}
    assert len(wordings) == 1, wordings


def test_bare_tideborn_prints_its_usage_to_stderr_and_help_to_stdout(tmp_path):
    # the console script as a real process: what the in-process `tideborn` above stands for
    bare = tideborn_process(cwd=tmp_path)
    assert bare.returncode == 2 and bare.stdout == "" and "usage: tideborn COMMAND" in bare.stderr
    asked = tideborn_process("--help", cwd=tmp_path)
    assert asked.returncode == 0 and asked.stderr == "" and "usage: tideborn COMMAND" in asked.stdout


@pytest.mark.parametrize(("cores", "load", "workers", "threads"), [
    (2, 0.0, 1, 2),    # an idle 2-core machine, smoke-teacher's one worker: both cores (torch's default)
    (2, 0.0, 2, 1),    # the second worker takes a core
    (2, 2.5, 1, 1),    # a busy 2-core machine: one thread, not an oversubscribed two (3x slower there)
    (16, 3.2, 2, 12),  # 13 free cores, less one for the second worker
    (1, 0.0, 0, 1),
    (8, 20.0, 4, 1),   # never fewer than one
])
def test_auto_threads_count_free_cores_and_data_workers(cores, load, workers, threads):
    from tideborn.trainer.device import auto_threads

    assert auto_threads(workers, cores=cores, load=load) == threads


def test_a_cpu_run_records_the_threads_it_chose(tmp_path):
    from tests.helpers.common import SMOKE_CONFIG, events_of

    env = child_env()
    env.pop("OMP_NUM_THREADS")  # as a user runs it: the trainer chooses
    run_dir = tmp_path / "run"
    done = subprocess.run([str(console_script()), "train", "--config", str(SMOKE_CONFIG), "--set",
                           f"runtime.out_dir={str(run_dir)!r}", "--set", "runtime.max_steps=2"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    [started] = [e for e in events_of(run_dir) if e["kind"] == "run_started"]
    assert 1 <= started["cpu_threads"] <= len(os.sched_getaffinity(0))


def test_ctrl_c_is_one_line_where_an_import_swallowed_its_keyboard_interrupt_and_a_bug_is_a_traceback(capsys):
    """A real SIGINT in this process. cshogi's module init turns a Ctrl-C that lands in numpy's import into
    `numpy.core.multiarray failed to import`: an ImportError with no cause or context. The one line still; and
    an error chained from a KeyboardInterrupt. The same ImportError with no Ctrl-C is a bug: raised as it is."""
    import signal

    from tideborn.errors import run_reporting_ctrl_c

    def swallowed() -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the KeyboardInterrupt is raised as it returns
            raise AssertionError("no KeyboardInterrupt")
        except KeyboardInterrupt:
            pass  # as the C extension's init does, leaving no trace of it
        raise ImportError("numpy.core.multiarray failed to import")

    def chained() -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            raise AssertionError("no KeyboardInterrupt")
        except KeyboardInterrupt as exc:
            raise ImportError("failed to import") from exc

    def bug() -> int:
        raise ImportError("numpy.core.multiarray failed to import")

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground job
    try:
        assert run_reporting_ctrl_c(swallowed, "tideborn data convert") == 130
        assert run_reporting_ctrl_c(chained, "tideborn data split") == 130
        with pytest.raises(ImportError, match="failed to import"):
            run_reporting_ctrl_c(bug, "tideborn data convert")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err.splitlines() == [
        "tideborn data convert: interrupted (Ctrl-C); nothing half-written is left",
        "tideborn data split: interrupted (Ctrl-C); nothing half-written is left"]
