"""Decode per core from an hcpe3 file's positions cache, this code against another tree's, side by side
(figures, never pass/fail).

    python -m benchmarks.hcpe3_decode FILE.hcpe3 --code NAME=DIR [--repeats N] [--batches N]

Each code tree gets its own copy of the file (their caches may be of different versions, which would rebuild
each other's) and opens it once (the cache built, untimed). Then, per repetition and tree, alternating, a
fresh child process limited to one thread decodes `--batches` batches of 1,024 positions in a shuffled order
with the trainer's `BatchDecoder` (features, values, policy targets: what a data loader worker does), timed
after a first warm-up batch; and the cache's bytes per position. Only `open_source` and `BatchDecoder`,
which both have, are used.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tideborn.cliparser import OneLineParser, positive_int
from tideborn.errors import UserError, report_user_error

THIS_TREE = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
from pathlib import Path
from tideborn.data.sets.sources import BatchDecoder, open_source
from tideborn.data.cache.hcpe3 import cache_path
path, batches, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
source = open_source([path])
if mode == "open":
    print(json.dumps({"bytes_per_position": cache_path(path).stat().st_size / len(source)}))
    raise SystemExit(0)
decoder = BatchDecoder(756.0, 0.5, temperature=1.0)
order = np.random.default_rng(0).permutation(len(source))
decoder.decode(source, np.sort(order[:1024]))
started = time.perf_counter()
done = 0
for k in range(1, batches + 1):
    batch = order[(k * 1024) % (len(order) - 1024):][:1024]
    decoder.decode(source, batch)
    done += len(batch)
print(json.dumps({"positions_per_second": done / (time.perf_counter() - started)}))
"""


def run_child(code: Path | None, path: Path, batches: int, mode: str) -> dict:
    # run from the file's folder: `python -c` puts the working directory first on the path, before PYTHONPATH
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(code or THIS_TREE))
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(batches), mode], env=env, cwd=path.parent,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise UserError(f"{path}: the child failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.hcpe3_decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--code", action="append", default=[], help="NAME=DIR: also decode with DIR first on the path")
    parser.add_argument("--repeats", type=positive_int, default=4)
    parser.add_argument("--batches", type=positive_int, default=40)
    args = parser.parse_args(argv)
    try:
        codes: dict[str, Path | None] = {}
        for spec in args.code:
            name, _, directory = spec.partition("=")
            if not directory or not Path(directory, "tideborn").is_dir():
                raise UserError(f"--code {spec}: give NAME=DIR, DIR holding a tideborn/ package")
            codes[name] = Path(directory).resolve()
        codes["this"] = None
        if not args.file.is_file():
            raise UserError(f"{args.file}: no such file")
        with tempfile.TemporaryDirectory(prefix="tideborn-decode-") as scratch:
            copies, figures = {}, {name: [] for name in codes}
            for name, code in codes.items():
                (Path(scratch) / name).mkdir()
                copies[name] = Path(scratch) / name / args.file.name
                copies[name].write_bytes(args.file.read_bytes())
                size = run_child(code, copies[name], args.batches, "open")["bytes_per_position"]
                print(f"{name}: positions cache {size:.1f} bytes a position", flush=True)
            for repeat in range(args.repeats):
                for name, code in codes.items():
                    load = os.getloadavg()[0]
                    rate = run_child(code, copies[name], args.batches, "decode")["positions_per_second"]
                    figures[name].append(rate)
                    print(f"repeat {repeat} {name}: {rate:,.0f} positions/s (load {load:.1f})", flush=True)
            for name, rates in figures.items():
                print(f"{name}: median {statistics.median(rates):,.0f} positions/s ({min(rates):,.0f}.."
                      f"{max(rates):,.0f})")
            if len(codes) == 2:
                a, b = figures.values()
                ratios = [y / x for x, y in zip(a, b)]
                print(f"{list(codes)[1]} / {list(codes)[0]} per repetition: median {statistics.median(ratios):.3f} "
                      f"({min(ratios):.3f}..{max(ratios):.3f})")
    except UserError as exc:
        return report_user_error(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
