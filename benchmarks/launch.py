"""Launch to first step of `tideborn train` on an hcpe3 corpus, its caches warm: this checkout, or two side by side.

    python -m benchmarks.launch [--positions 1e7] [--repeats 10] [--compare OLD_CHECKOUT]

Writes a corpus of about `--positions` positions (`scale_corpus`: the shipped games repeated, made-up search
statistics), builds its positions cache with one run of each checkout (not counted), then starts real
`tideborn train` processes of `--steps` steps (the scale benchmark's settings: `scale.train_figures`), this
checkout's and, with `--compare`, OLD_CHECKOUT's in turn (this Python, its working directory and `PYTHONPATH`
there; a checkout set up as its README says). Per launch: from `Popen` to the first `step` event's time, the
whole process's wall time, and its process tree's peak RSS; printed as the median (min..max), memory the largest.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.scale import THIS_TREE, _cell, _mb, _sizes, train_figures
from benchmarks.scale_corpus import make_seed, write_hcpe3_corpus
from tideborn.cliparser import OneLineParser, positive_int
from tideborn.errors import UserError, report_interrupted, report_user_error


def run_benchmark(args: argparse.Namespace) -> int:
    checkouts = {"this": THIS_TREE}
    if args.compare is not None:
        if not (args.compare / "tideborn" / "__init__.py").is_file():
            raise UserError(f"--compare {args.compare}: no tideborn checkout there")
        checkouts["compared"] = args.compare.resolve()
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch_name:
        scratch = Path(scratch_name)
        corpus = scratch / "corpus.hcpe3"
        positions = write_hcpe3_corpus(make_seed(), corpus, args.positions)
        for checkout in checkouts.values():  # the first open builds the caches (each checkout its own, should
            train_figures(corpus, args, scratch, checkout)  # their keys differ): every launch after finds them
        runs: dict[str, list[dict]] = {label: [] for label in checkouts}
        for _ in range(args.repeats):  # in turn, so that both see the same spells of load
            for label, checkout in checkouts.items():
                runs[label].append(train_figures(corpus, args, scratch, checkout))
    print(f"{positions:,} hcpe3 positions, network {args.network}, batch {args.batch_size}, {args.steps} step(s), "
          f"data.workers {args.workers}, {args.threads} thread(s); {args.repeats} launches each")
    for label, figures in runs.items():
        print(f"{label:>8}: launch to first step {_cell([f['launch_to_first_step'] for f in figures], 2, ' s')}; "
              f"whole process {_cell([f['train_seconds'] for f in figures], 2, ' s')}; "
              f"peak RSS {_mb(max(f['train_rss'] for f in figures))}  ({checkouts[label]})")
    if args.compare is not None:
        ratios = [a["launch_to_first_step"] / b["launch_to_first_step"]
                  for a, b in zip(runs["this"], runs["compared"])]
        print(f"this / compared, launch to first step, launch by launch: {_cell(ratios, 3)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.launch", description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=lambda text: _sizes(text)[0], default=10**7,
                        help="positions in the corpus (default 1e7)")
    parser.add_argument("--repeats", type=positive_int, default=10, help="launches of each checkout (default 10)")
    parser.add_argument("--compare", type=Path, help="another checkout, launched in turn with this one")
    parser.add_argument("--network", default="resnet2x32", help="network preset (default resnet2x32)")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--steps", type=positive_int, default=1, help="training steps a launch (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="data.workers (default 1)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument("--scratch", type=Path, help="folder for the corpus (default: the temporary folder)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to each process")
    args = parser.parse_args(argv)
    try:
        return run_benchmark(args)
    except UserError as exc:
        return report_user_error(exc, "bench_launch")
    except KeyboardInterrupt:  # a benchmark writes only its scratch folder, removed on the way out
        return report_interrupted("bench_launch")


if __name__ == "__main__":
    sys.exit(main())
