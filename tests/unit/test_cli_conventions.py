"""The command-line conventions: `--version` on both console scripts, `python -m tideborn`, the version written
in one place, and a top-level usage made from the subcommands, so that it lists what dispatches and says what
each command's own help says."""

import argparse
import importlib.metadata
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import tideborn
from tideborn import cli

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_version_is_written_in_one_place() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tideborn.__version__"}
    assert importlib.metadata.version("tideborn") == tideborn.__version__, "stale install: run ./scripts/setup.sh"


@pytest.mark.parametrize("argv", [[str(BIN / "tideborn")], [sys.executable, "-m", "tideborn"],
                                  [str(BIN / "tideborn-tui")]], ids=["tideborn", "python -m tideborn", "tideborn-tui"])
def test_version(argv: list[str]) -> None:
    result = run(*argv, "--version")
    assert result.returncode == 0, result.stderr
    name = "tideborn-tui" if argv[0].endswith("tideborn-tui") else "tideborn"
    assert result.stdout == f"{name} {tideborn.__version__}\n" and result.stderr == ""


def test_python_m_tideborn_is_the_tideborn_command() -> None:
    help_text = run(sys.executable, "-m", "tideborn", "--help")
    assert help_text.returncode == 0 and help_text.stdout == run(str(BIN / "tideborn"), "--help").stdout
    assert help_text.stdout.startswith("usage: tideborn COMMAND")
    bare = run(sys.executable, "-m", "tideborn")
    assert bare.returncode == 2 and bare.stdout == "" and bare.stderr.startswith("usage: tideborn COMMAND")
    config = run(sys.executable, "-m", "tideborn", "config", "--config", "configs/smoke.toml")
    assert config.returncode == 0 and '"runtime"' in config.stdout, config.stderr
    unknown = run(sys.executable, "-m", "tideborn", "trian")
    assert unknown.returncode == 2 and "unknown command 'trian'" in unknown.stderr


def listed_commands(usage: str) -> list[str]:
    body = usage.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in body.splitlines() if line.startswith("  ") and not line.startswith("   ")]


def test_the_usage_lists_exactly_the_commands_that_dispatch() -> None:
    assert listed_commands(cli.usage()) == [command.name for command in cli.COMMANDS]
    for command in cli.COMMANDS:
        with pytest.raises(SystemExit) as exited:
            cli.main([command.name, "--help"])
        assert exited.value.code == 0


def test_the_usage_says_what_each_command_parser_says(monkeypatch: pytest.MonkeyPatch) -> None:
    usage = " ".join(cli.usage().split())
    for command in cli.COMMANDS:
        description = " ".join(cli.command_parser(command).description.split()).rstrip(".")
        assert description[1:] in usage, (command.name, description)
    # a changed description shows in the usage: it is made from the parser, not written twice
    import tideborn.export.cli as export_cli

    original = export_cli.build_parser

    def renamed(prog: str = "tideborn export") -> argparse.ArgumentParser:
        parser = original(prog)
        parser.description = "Turn a checkpoint into something else entirely."
        return parser

    monkeypatch.setattr(export_cli, "build_parser", renamed)
    assert "export   turn a checkpoint into something else entirely" in cli.usage()


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda command: command.name)
def test_each_usage_example_parses(command: cli.Command) -> None:
    words = shlex.split(command.example)
    assert words[:2] == ["tideborn", command.name]
    assert f"e.g. {command.example}" in cli.usage()
    cli.command_parser(command).parse_args(words[2:])  # a usage error would exit 2
