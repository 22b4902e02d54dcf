"""The command line of `python -m tideborn.trainer summary|train|config` (and `tideborn train|summary|config`),
parsed without torch or the trainer: `train_run start` and the monitor check a launch's arguments with it."""

from __future__ import annotations

import argparse
from pathlib import Path

from tideborn.cliparser import OneLineParser

COMMANDS = ("summary", "train", "config")


def add_settings_arguments(parser: argparse.ArgumentParser,
                           config_help: str = "settings file (TOML, or JSON as `config` prints)") -> None:
    """The options that choose a run's settings, the same for `train`, `train_run start` and the monitor's
    start key (which pass them on to `train`)."""
    parser.add_argument("--config", metavar="FILE", help=config_help)
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                        help="override one setting, e.g. --set optim.lr=1e-3 (value is TOML; repeatable)")
    parser.add_argument("--type", help="engine family (run.type); only 'dl' is trained here")
    parser.add_argument("--network", help="architecture preset (run.network), e.g. resnet10x192")
    parser.add_argument("--mode", help="scratch (default) or finetune (run.mode)")


def build_parser(prog: str = "python -m tideborn.trainer") -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Train DLManaka's policy/value ResNet.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{summary,train,config}",
                                parser_class=OneLineParser)
    summary = sub.add_parser("summary", help="show the network and the settings train would use",
                             description="Show the network and the settings train would use.")
    add_settings_arguments(summary)
    train = sub.add_parser("train", help="train (resumes from the newest checkpoint in the run directory)",
                           description="Train (resumes from the newest checkpoint in the run directory).")
    add_settings_arguments(train)
    train.add_argument("--resume", metavar="PATH", type=Path, help="resume from this checkpoint")
    train.add_argument("--fresh", action="store_true",
                       help="start at step 0; old checkpoints and events move to OUT_DIR/archive/")
    train.add_argument("--stop-at-step", type=int, metavar="N",
                       help="checkpoint and stop (run_stopped) after step N")
    config = sub.add_parser("config", help="print the fully resolved settings as JSON",
                            description="Print the fully resolved settings as JSON.")
    add_settings_arguments(config)
    config.add_argument("--from-checkpoint", metavar="PATH", type=Path,
                        help="print the settings stored in a checkpoint instead")
    return parser
