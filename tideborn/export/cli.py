"""`tideborn export`: a checkpoint's network as an ONNX model, checked against PyTorch (docs/export.md).

Arguments are parsed before torch loads. Bad input (no such file, not a checkpoint, a checkpoint that
would need pickle, no EMA weights for `--weights ema`) is one line on stderr and exit status 2; a model
that fails the parity check is one line and exit status 1, and is not left at `--out`. `--out` must be a
regular file or nothing (not a directory, a device node, a FIFO); a full disk is one line naming the file,
exit status 2; Ctrl-C is one line, exit status 130; none of them leaves a temp file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tideborn.cliparser import OneLineParser
from tideborn.errors import UserError, report_interrupted, report_user_error
from tideborn.export.interface import DEFAULT_VALUE, VALUE_CHOICES, WEIGHT_CHOICES
from tideborn.outputs import check_output_before_work

PARITY_FAILED_EXIT = 1


def build_parser(prog: str = "tideborn export") -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Export a checkpoint's network to ONNX for the engine, "
                                                  "then check it against PyTorch with onnxruntime.")
    parser.add_argument("--checkpoint", required=True, type=Path, metavar="PATH",
                        help="a step checkpoint, e.g. runs/ckpt/smoke/step-000000020.pt")
    parser.add_argument("--out", required=True, type=Path, metavar="PATH",
                        help="the ONNX file to write (replaced only by a model that passes the check)")
    parser.add_argument("--weights", choices=WEIGHT_CHOICES,
                        help="ema or raw weights (default: ema when the checkpoint has them, else raw)")
    parser.add_argument("--value", choices=VALUE_CHOICES, default=DEFAULT_VALUE,
                        help=f"the value output: the network's logit or its sigmoid (default: {DEFAULT_VALUE})")
    parser.add_argument("--json", action="store_true", help="print the export report as JSON on stdout")
    return parser


def export(args: argparse.Namespace, prog: str) -> int:
    if args.out.resolve() == args.checkpoint.resolve():
        raise UserError(f"--out {args.out} is the checkpoint itself; name a new file, e.g. model.onnx")
    check_output_before_work(args.out, "--out")  # before torch loads and the checkpoint is read
    from tideborn.export.onnx_export import choose_weights, export_onnx
    from tideborn.export.parity import ParityError
    from tideborn.network.checkpoint import CheckpointError, load_checkpoint

    try:
        payload = load_checkpoint(args.checkpoint)
    except CheckpointError as exc:
        raise UserError(str(exc)) from None
    weights = choose_weights(payload, args.weights or "auto")
    if not args.json:
        if args.weights:
            why = f"--weights {args.weights}"
        elif weights == "ema":
            why = "the checkpoint has them; --weights raw for the raw ones"
        else:
            why = "the checkpoint has no EMA weights"
        print(f"exporting step {payload['step']}'s {weights} weights ({why}), value as a {args.value}", flush=True)
    try:
        report = export_onnx(payload, args.out, weights, args.value)
    except ParityError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return PARITY_FAILED_EXIT
    if args.json:
        json.dump({"step": report.step, **report.event_fields()}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(f"wrote {report.path} ({report.bytes / 1e6:.1f} MB, opset {report.opset}) in {report.seconds:.1f} s; "
              f"parity with onnxruntime over {report.parity_positions} positions at batch sizes "
              f"{' and '.join(map(str, report.parity_batch_sizes))}: max |diff| policy "
              f"{report.policy_max_abs_diff:.2g}, value {report.value_max_abs_diff:.2g}")
    return 0


def main(argv: list[str] | None = None, prog: str = "tideborn export") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        return export(args, prog)
    except UserError as exc:
        return report_user_error(exc, prog)
    except KeyboardInterrupt:
        return report_interrupted(prog)
    except BrokenPipeError:
        return 0
