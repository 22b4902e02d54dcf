"""The `tideborn` console script (also `python -m tideborn`): one entry point for the trainer's commands and the
tools. Dispatch only: each command's module parses its own arguments, and the usage below is made from those
parsers and the table of commands, so it lists exactly what dispatches and says what each command's help says."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from dataclasses import dataclass

from tideborn import __version__
from tideborn.errors import run_reporting_ctrl_c


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    """Where `main(argv, prog)` and `build_parser(prog)` live."""
    example: str
    """One command line that works from a fresh clone's setup (tests parse each with the command's parser)."""
    trainer: bool = False
    """One of the trainer's commands: its parser takes the command's name as its first argument."""


COMMANDS = (
    Command("train", "tideborn.trainer.cli", "tideborn train --config configs/smoke.toml", trainer=True),
    Command("summary", "tideborn.trainer.cli", "tideborn summary --config configs/smoke.toml", trainer=True),
    Command("config", "tideborn.trainer.cli", "tideborn config --config configs/smoke.toml", trainer=True),
    Command("run", "tideborn.tools.train_run", "tideborn run status --out-dir runs/ckpt/smoke"),
    Command("data", "tideborn.data.tools.cli", "tideborn data inspect data/teacher/train.hcpe"),
    Command("export", "tideborn.export.cli", "tideborn export --checkpoint CKPT --out model.onnx"),
    Command("match", "tideborn.match.cli", "tideborn match A.pt B.pt --games 200"),
    Command("usi", "tideborn.usi.cli", "tideborn usi model.onnx"),
)
BY_NAME = {command.name: command for command in COMMANDS}
USAGE_WIDTH = 100


def command_parser(command: Command, prog: str = "tideborn") -> argparse.ArgumentParser:
    """The parser `tideborn NAME` parses with (the trainer's: the subcommand's own)."""
    module = importlib.import_module(command.module)
    if not command.trainer:
        return module.build_parser(f"{prog} {command.name}")
    for action in module.build_parser(prog)._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command.name]
    raise LookupError(f"{command.module} has no {command.name} command")


def summary_of(command: Command, prog: str = "tideborn") -> str:
    """What the command does, as its own parser says it (with its subcommands, where it has any)."""
    parser = command_parser(command, prog)
    text = (parser.description or "").strip().rstrip(".")
    text = text[:1].lower() + text[1:]
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if subcommands:
        text = f"{'|'.join(subcommands[0].choices)}: {text}"
    return text


def usage(prog: str = "tideborn") -> str:
    width = max(len(command.name) for command in COMMANDS)
    lines = [f"usage: {prog} COMMAND ...", "", "commands:"]
    indent = " " * (width + 4)
    for command in COMMANDS:
        lines += textwrap.wrap(summary_of(command, prog), USAGE_WIDTH, initial_indent=f"  {command.name:<{width}}  ",
                               subsequent_indent=indent)
        lines.append(f"{indent}e.g. {command.example}")
    lines += ["", f"Each command takes --help. {prog} --version prints the version ({__version__})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "tideborn") -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C at any moment is one line and exit status 130, during the command's imports too: each command says
    # it in its own words, and a Ctrl-C that escapes one (or lands while its module loads) is said here.
    program = f"{prog} {argv[0]}" if argv and argv[0] in BY_NAME else prog
    return run_reporting_ctrl_c(lambda: dispatch(argv, prog), program)


def dispatch(argv: list[str], prog: str = "tideborn") -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog), file=sys.stdout if argv else sys.stderr)  # asked-for help is output; a bare call, a mistake
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"{prog} {__version__}")
        return 0
    command = BY_NAME.get(argv[0])
    if command is None:
        print(f"{prog}: error: unknown command {argv[0]!r} (see {prog} --help)", file=sys.stderr)
        return 2
    module = importlib.import_module(command.module)
    if command.trainer:
        return module.main(argv, prog=prog)
    return module.main(argv[1:], prog=f"{prog} {command.name}")


if __name__ == "__main__":
    sys.exit(main())
