"""`python -m tideborn.trainer summary|train|config` (also `tideborn train|summary|config`).

Parsing and settings resolution need no torch; each command imports what it uses, so `config` stays
quick and a bad setting is reported before torch is even loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tideborn.errors import Interrupted, UserError, caused_by_ctrl_c, run_command
from tideborn.trainer.options import build_parser


def resolve(args: argparse.Namespace):
    from tideborn.config.load import load_settings

    flags = {"type": args.type, "network": args.network, "mode": args.mode}
    return load_settings(args.config, args.overrides, flags)


def command_config(args: argparse.Namespace) -> int:
    if args.from_checkpoint is not None:
        if args.config or args.overrides or args.type or args.network or args.mode:
            raise UserError("--from-checkpoint prints the checkpoint's own settings; "
                            "it takes no --config, --set, --type, --network or --mode")
        from tideborn.network.checkpoint import CheckpointError, load_checkpoint

        try:
            settings = load_checkpoint(args.from_checkpoint)["settings"]
        except CheckpointError as exc:
            raise UserError(str(exc)) from None
    else:
        settings = resolve(args).settings.to_dict()
    json.dump(settings, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def command_summary(args: argparse.Namespace) -> int:
    resolved = resolve(args)
    from tideborn.trainer.overview import summary_text

    print(summary_text(resolved))
    return 0


def require_chosen_settings(args: argparse.Namespace) -> None:
    """`train` needs settings someone chose: the bare defaults are a GPU run (a 10x192 net, 1,000 steps of
    1,024 positions) that a CPU takes most of a day over, too easy to start by leaving out --config."""
    import os

    from tideborn.config.load import PROJECT_FILE_NAME, find_project_file

    if args.config is None and args.network is None and find_project_file(os.environ, Path.cwd()) is None:
        raise UserError(f"no settings chosen: name a settings file with --config (e.g. --config "
                        f"configs/smoke.toml, a 2x32 net in seconds) or a network preset with --network, or "
                        f"put a {PROJECT_FILE_NAME} here; the bare defaults train a 10x192 net for hours "
                        f"(about 20 h on a CPU)")


NOTHING_WRITTEN = " before the first step; nothing was written"
"""What Ctrl-C during `train`'s start-up leaves, before the trainer takes its run directory."""


def command_train(args: argparse.Namespace) -> int:
    from tideborn.trainer.signals import StopRequest

    # Before torch loads: a SIGTERM during start-up still stops cleanly, and a Ctrl-C ends it at once (nothing
    # written yet) until the trainer takes the run directory, after which it stops the run (trainer/signals.py).
    stop = StopRequest().install(ctrl_c_interrupts=True)
    try:
        from tideborn.rundir.lock import refuse_if_held
        from tideborn.trainer.preflight import preflight
        from tideborn.trainer.rank import dist_env

        require_chosen_settings(args)
        resolved = resolve(args)
        env = dist_env()
        # only what is cheap: the trainer opens its data once, decoding hcpe3 files into their caches (under
        # torchrun local rank 0 does, while the other ranks wait: `loop._build_data_caches_once`)
        run_dir = preflight(resolved.settings, args.resume, args.fresh, args.stop_at_step)
        if env.is_main:  # the rank that takes the run directory's lock; the others follow it
            refuse_if_held(run_dir)
        from tideborn.trainer.loop import run_training

        return run_training(resolved, resume=args.resume, fresh=args.fresh, stop_at_step=args.stop_at_step,
                            argv=[sys.executable, "-m", "tideborn.trainer", *sys.argv[1:]], stop=stop, env=env)
    except (Exception, KeyboardInterrupt) as exc:
        if stop.ctrl_c_interrupts and caused_by_ctrl_c(exc):
            raise Interrupted(NOTHING_WRITTEN) from exc
        raise
    finally:
        stop.uninstall()


def main(argv: list[str] | None = None, prog: str = "python -m tideborn.trainer") -> int:
    args = build_parser(prog).parse_args(argv)
    handler = {"summary": command_summary, "train": command_train, "config": command_config}[args.command]
    program = f"{prog} {args.command}"  # as argparse names it: `tideborn train`
    return run_command(handler, args, program)
