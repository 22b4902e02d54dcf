"""`tideborn usi MODEL`: a checkpoint or an ONNX model as a USI engine on stdin and stdout (docs/match.md, "In a
shogi GUI (USI)").

The model is loaded before the first command is read: a missing file, a file that is not a checkpoint or a model
with dlshogi's interface, or a bad argument is one line on stderr and exit status 2. The net is warmed up and timed
at `isready`. The end of input is `quit`: exit status 0.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from tideborn.cliparser import OneLineParser, non_negative_int, positive_int
from tideborn.errors import UserError, report_interrupted, report_user_error


def build_parser(prog: str = "tideborn usi") -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Run a network (a checkpoint or an ONNX model) as a USI engine "
                                                  "on stdin and stdout, for shogi GUIs and other engines' matches.")
    parser.add_argument("model", type=Path, metavar="MODEL",
                        help="a checkpoint (.pt) or an ONNX model with dlshogi's inputs and outputs (.onnx)")
    parser.add_argument("--playouts", type=non_negative_int, default=1,
                        help="0 or 1 (default): play the policy's best legal move; N > 1: a PUCT search of at "
                             "most N playouts a move (the Playouts option; `go nodes` and the clock may stop "
                             "it sooner)")
    parser.add_argument("--threads", type=positive_int,
                        help="torch's and onnxruntime's CPU threads for the network (default: their choice)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--weights", choices=("auto", "ema", "raw"), default="auto",
                        help="a checkpoint's ema or raw weights (default auto: ema where it has them)")
    parser.add_argument("--onnx-value", choices=("auto", "logit", "probability"), default="auto",
                        help="what an ONNX model's value output holds (default auto, as tideborn match)")
    return parser


def main(argv: list[str] | None = None, prog: str = "tideborn usi") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        from tideborn.usi.session import open_engine

        engine = open_engine(args.model, playouts=args.playouts, threads=args.threads, device=args.device,
                             weights=args.weights, onnx_value=args.onnx_value)
    except UserError as exc:
        return report_user_error(exc, prog)
    except KeyboardInterrupt:
        return report_interrupted(prog)
    if isinstance(sys.stdin, io.TextIOWrapper):
        sys.stdin.reconfigure(errors="replace")  # a GUI's stray bytes make an unknown command, not a crash
    try:
        return engine.run(sys.stdin)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0  # the GUI closed the pipe or the terminal user pressed Ctrl-C: nothing is left to finish
