"""`data.use_average` at scale: peak memory and time of building the merged set (figures, never pass/fail).

    python -m benchmarks.average make-hcpe3 OUT.hcpe3 --from FILE.hcpe3 --copies N
    python -m benchmarks.average make-distinct OUT.hcpe --positions N [--seed S]
    python -m benchmarks.average measure FILE... [--code NAME=DIR ...] [--repeats N]

`make-hcpe3` repeats the games of an hcpe3 file (`benchmarks.hcpe3 make`) N times: many inputs, few
distinct positions. `make-distinct` writes hcpe records of random legal playouts from the start position:
nearly every position distinct. `measure` runs, per repetition and code tree (alternating), with every
derived file removed first: a fresh child process that opens the files (the hcpe3 positions caches built:
the first open, timed), then another that opens them again (caches present) and builds the merged set (the
cache written: timed); for each, the peak RSS of the child and of any process it started (the largest process
of the tree: `RUSAGE_CHILDREN` of a wrapper that starts nothing else; the merge runs in one process).
`--code NAME=DIR` runs the same with `DIR` (a copy of another commit's `tideborn/` package's parent, e.g. from `git
archive`) first on the path, so before and after are measured side by side in one run; only `open_source` and
`averaged_source` are used, which both have.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tideborn.cliparser import OneLineParser, positive_int
from tideborn.errors import UserError, report_user_error

THIS_TREE = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from pathlib import Path
from tideborn.config.schema import DataSettings
from tideborn.data.sets.average import averaged_source
from tideborn.data.sets.sources import open_source

mode, paths = sys.argv[1], [Path(p) for p in sys.argv[2:]]
started = time.perf_counter()
source = open_source(paths)
opened = time.perf_counter()
if mode == "open":
    print(json.dumps({"seconds": opened - started}))
    raise SystemExit(0)
settings = DataSettings(train=tuple(map(str, paths)), use_average=True)
averaged = averaged_source(source, settings)
print(json.dumps({"seconds": time.perf_counter() - opened, **averaged.note["average"]}))
"""


WRAPPER = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(done.returncode)\n")
"""Runs one measurement: its RUSAGE_CHILDREN peak is that of the measured process and what it started alone."""


def _derived(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(".")]


def measure(files: list[Path], codes: dict[str, Path | None], repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tideborn-average-") as scratch:
        folder = Path(scratch)
        inputs = []
        for path in files:
            inputs.append(folder / path.name)
            shutil.copyfile(path, inputs[-1])
        for repeat in range(repeats):
            for name, code in codes.items():
                for derived in _derived(folder):  # a first open and a first merge each time
                    derived.unlink()
                # run from the scratch folder: `python -c` puts the working directory first on the path
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(code or THIS_TREE))
                load = os.getloadavg()[0]
                measured = {}
                for mode in ("open", "average"):
                    done = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-c", CHILD, mode,
                                           *map(str, inputs)], env=env, capture_output=True, text=True,
                                          stdin=subprocess.DEVNULL, cwd=folder)
                    if done.returncode != 0:
                        print(f"{name} {mode}: failed ({done.returncode}): {done.stderr.strip()[-400:]}", flush=True)
                        break
                    peak = int(done.stderr.strip().splitlines()[-1].split()[1])
                    measured[mode] = {**json.loads(done.stdout.strip().splitlines()[-1]), "peak_mb": peak / 1024}
                if len(measured) < 2:
                    continue
                opened, merged = measured["open"], measured["average"]
                print(f"repeat {repeat} {name}: inputs {merged['inputs']:,}, merged positions {merged['positions']:,}; "
                      f"first open {opened['seconds']:.1f} s (peak RSS {opened['peak_mb']:,.0f} MB), merged set "
                      f"{merged['seconds']:.1f} s ({merged['seconds'] / max(opened['seconds'], 1e-9):.2f}x the first "
                      f"open; peak RSS {merged['peak_mb']:,.0f} MB, caches present); load {load:.1f}", flush=True)


def make_hcpe3(out: Path, source: Path, copies: int) -> None:
    data = source.read_bytes()
    with open(out, "wb") as handle:
        for _ in range(copies):
            handle.write(data)


def make_distinct(out: Path, positions: int, seed: int) -> None:
    import cshogi

    rng = np.random.default_rng(seed)
    board = cshogi.Board()
    records = np.zeros(positions, cshogi.HuffmanCodedPosAndEval)
    n = 0
    while n < positions:
        board.reset()
        for _ in range(int(rng.integers(40, 160))):
            moves = list(board.legal_moves)
            if not moves or n >= positions:
                break
            move = moves[int(rng.integers(len(moves)))]
            board.to_hcp(records["hcp"][n])
            records["eval"][n] = int(rng.integers(-2000, 2000))
            records["bestMove16"][n] = np.int16(np.uint16(cshogi.move16(move)).view(np.int16))
            records["gameResult"][n] = int(rng.integers(0, 3))
            n += 1
            board.push(move)
    records.tofile(out)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.average", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make-hcpe3")
    make.add_argument("out", type=Path)
    make.add_argument("--from", dest="source", type=Path, required=True)
    make.add_argument("--copies", type=positive_int, required=True)
    distinct = commands.add_parser("make-distinct")
    distinct.add_argument("out", type=Path)
    distinct.add_argument("--positions", type=positive_int, required=True)
    distinct.add_argument("--seed", type=int, default=0)
    run = commands.add_parser("measure")
    run.add_argument("files", type=Path, nargs="+")
    run.add_argument("--code", action="append", default=[], help="NAME=DIR: also run with DIR first on the path")
    run.add_argument("--repeats", type=positive_int, default=1)
    args = parser.parse_args(argv)
    try:
        if args.command == "make-hcpe3":
            make_hcpe3(args.out, args.source, args.copies)
        elif args.command == "make-distinct":
            make_distinct(args.out, args.positions, args.seed)
        else:
            codes: dict[str, Path | None] = {}
            for spec in args.code:
                name, _, directory = spec.partition("=")
                if not directory or not Path(directory, "tideborn").is_dir():
                    raise UserError(f"--code {spec}: give NAME=DIR, DIR holding a tideborn/ package")
                codes[name] = Path(directory).resolve()
            codes["this"] = None
            for path in args.files:
                if not path.is_file():
                    raise UserError(f"{path}: no such file")
            measure(args.files, codes, args.repeats)
    except UserError as exc:
        return report_user_error(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
