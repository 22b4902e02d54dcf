"""The command line of `tideborn-tui` and what it resolves to: a run directory to show, or a folder of
runs to pick from, and the launch plan the start key uses. No textual here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

from tideborn import __version__
from tideborn.errors import UserError
from tideborn.rundir.access import check_readable_dir
from tideborn.rundir.anomaly import AnomalyThresholds
from tideborn.rundir.layout import EVENTS_FILE, LAUNCH_FILE, PID_FILE
from tideborn.trainer.options import add_settings_arguments
from tideborn.tui.plan import LaunchPlan

RUN_MARKERS = (EVENTS_FILE, PID_FILE, LAUNCH_FILE)
WINDOWS = (1_000, 10_000, 100_000, 1_000_000)
"""The `n` key cycles the plot through the last N steps of these."""


@dataclass
class TuiOptions:
    run_dir: Path | None = None
    """The run to show (None: `runs_folder` is set)."""
    runs_folder: Path | None = None
    """A folder of runs: start with the picker."""
    plan: LaunchPlan | None = None
    """What the start key launches (from --config/--set); else the run's own launch.json."""
    ascii: bool = False
    colour: bool = True
    smoothing: float = 0.9
    window: int | None = None
    thresholds: AnomalyThresholds = field(default_factory=AnomalyThresholds)
    use_nvml: bool = True
    clock: typing.Callable[[], float] = time.time
    """Wall time for ages and ETAs; tests give a fixed one."""
    follow: bool = True
    """Keep watching the files (tests of a fixed directory may read them once)."""


def is_run_dir(path: Path) -> bool:
    try:
        return any((path / name).exists() for name in RUN_MARKERS)
    except PermissionError:
        return False  # another user's directory we may not look into: not one of our runs to pick


def runs_in(folder: Path) -> list[Path]:
    """Run directories directly inside `folder`, by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and is_run_dir(p))


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        raise UserError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="tideborn-tui", description="Watch, start and stop tideborn training runs.")
    parser.add_argument("path", nargs="?", type=Path,
                        help="a run directory (runtime.out_dir), or a folder of them to pick from")
    add_settings_arguments(parser, config_help="settings file the start key launches with")
    parser.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                        help="the start key launches N trainer processes through torchrun (DDP)")
    parser.add_argument("--ascii", action="store_true",
                        help="ASCII only: no braille, no box drawing, no colour (for plain terminals)")
    parser.add_argument("--smoothing", type=float, default=0.9, metavar="W",
                        help="weight of the moving average the plot smooths with, in [0, 1) (default 0.9)")
    parser.add_argument("--last", type=int, metavar="N", help="start showing only the last N steps")
    parser.add_argument("--no-nvml", action="store_true", help="do not read GPUs through NVML here")
    parser.add_argument("--stall-seconds", type=float, default=AnomalyThresholds().stall_seconds, metavar="S",
                        help="stalled after S seconds without output (as for train_run status)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_options(argv: typing.Sequence[str] | None = None, cwd: Path | None = None) -> TuiOptions:
    """Resolve the command line; raises UserError (one line) for anything wrong."""
    args = build_parser().parse_args(argv)
    cwd = Path.cwd() if cwd is None else cwd
    if not 0 <= args.smoothing < 1:
        raise UserError(f"--smoothing {args.smoothing}: must be at least 0 and below 1")
    if args.nproc_per_node < 1:
        raise UserError(f"--nproc-per-node {args.nproc_per_node}: must be at least 1")
    if args.last is not None and args.last < 1:
        raise UserError(f"--last {args.last}: must be at least 1")
    try:
        thresholds = AnomalyThresholds(stall_seconds=args.stall_seconds)
    except ValueError as exc:
        raise UserError(f"--stall-seconds: {exc}") from None
    flags = {"type": args.type, "network": args.network, "mode": args.mode}
    plan = None
    if args.config is not None or args.overrides or any(flags.values()):
        plan = LaunchPlan(config=args.config, overrides=tuple(args.overrides),
                          flags={k: v for k, v in flags.items() if v is not None},
                          nproc_per_node=args.nproc_per_node, cwd=cwd)
    options = TuiOptions(plan=plan, ascii=args.ascii, colour=not args.ascii and "NO_COLOR" not in os.environ,
                         smoothing=args.smoothing, window=args.last, thresholds=thresholds,
                         use_nvml=not args.no_nvml)
    path: Path | None = args.path
    if path is None:
        if plan is None:
            raise UserError("give a run directory, a folder of runs, or --config FILE to prepare a launch")
        options.run_dir = plan.run_dir()  # bad settings fail here, in one line, before the screen opens
        return options
    path = path if path.is_absolute() else cwd / path
    check_readable_dir(path)  # another user's private run: whose it is, in one line
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: not a directory (give a run directory or a folder of runs)")
    if plan is None and not path.exists():
        raise UserError(f"{path}: no such directory (to prepare a new run there, add --config FILE)")
    if plan is None and not is_run_dir(path) and runs_in(path):
        options.runs_folder = path
        return options
    if plan is not None:
        plan.run_dir()  # the settings must resolve now, not when the start key is pressed
    options.run_dir = path
    return options


def main_error(exc: UserError) -> int:
    print(f"tideborn-tui: error: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2
