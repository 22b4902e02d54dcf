"""The scale benchmark: tideborn (and dlshogi) on corpora of 10^6, 10^7, ... positions (figures, never pass/fail).

    python -m benchmarks.scale [--sizes 1000000,10000000] [--formats hcpe,hcpe3] [--dlshogi-build DIR]

Per size and format it writes a synthetic-but-valid corpus from the shipped games (`scale_corpus`: real
games repeated, made-up search statistics) in a scratch folder, then, each in a fresh process whose whole
process tree is sampled with psutil for its peak resident memory (the sum of the tree's RSS, so pages
shared by forked workers count in every process that maps them):

- first open: `open_source` on the corpus with no derived file (hcpe3: every game replayed into the
  positions cache);
- later open: the same again (hcpe3: the cache checked and mapped);
- merged set (hcpe3): `data.use_average`'s merged positions built from the opened corpus (the averaged
  cache written), timed from the open's end, and its process tree's peak RSS;
- training: a real `tideborn train` process (`--network`, `--batch-size`, `--steps`, one `step` event a
  step): launch to the end of its first step (the first `step` event's time: the open, torch's start and
  the step), and the median positions/s of the steps after the first few;
- cache bytes per position: every file the open left beside the corpus, over the positions read.

`--repeats N` measures each N times, tideborn and dlshogi alternating, and prints times and positions/s as
the median (min..max), memory as the largest. The first opens are compared per repetition both by wall clock
and per CPU second of the opening process (each side's own CPU time around the open, without the process's
start-up).

With `--dlshogi-build DIR` (a dlshogi source tree with `cppshogi` built, as `python -m benchmarks.hcpe3
--help` says; its `dlshogi/train.py` and the torch of this Python), the same for dlshogi on hcpe3 corpora:
first open is `load_hcpe3` in a child with one OpenMP thread (dlshogi has no later open: it loads at every
start); training is its `train.py` on the CPU (`--gpu -1`, the same network and batch size, `--eval_interval
E`), stopped after the steps asked for. dlshogi logs every E steps, so its launch to first step is the first
log line's arrival less E-1 median step times, and its positions/s includes one test batch forward every E
steps. dlshogi's train.py reads its training files with `load_hcpe3` only, so hcpe rows have no dlshogi part.

10^8 positions only when asked (`--sizes`); a size whose corpus and cache would not fit in the scratch
folder's free space (with a margin) is skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from benchmarks import average
from benchmarks.scale_corpus import Seed, make_seed, write_hcpe3_corpus, write_hcpe_corpus
from tideborn.cliparser import OneLineParser, positive_int
from tideborn.errors import UserError, report_interrupted, report_user_error

THIS_TREE = Path(__file__).resolve().parents[1]
CACHE_BYTES_PER_POSITION = 60
"""hcpe3 positions cache at most (about 40-46 measured), for the disk check."""
DISK_MARGIN_BYTES = 1 << 30
WARMUP_STEPS = 3

OPEN_CHILD = r"""
import json, sys, time
from pathlib import Path
from tideborn.data.sets.sources import open_source
started, cpu_started = time.perf_counter(), time.process_time()
source = open_source([Path(sys.argv[1])], processes=1)
print(json.dumps({"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
                  "positions": len(source)}))
"""



@dataclass
class Sampled:
    returncode: int
    seconds: float
    peak_rss: int
    lines: list[tuple[float, str]] = field(default_factory=list)
    """(time.time() at arrival, line) of the output, stdout and stderr together."""


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between the listing and the read: it holds nothing now
    return total


def run_sampled(command: list[str], env: dict | None = None, timeout: float = 3600.0, interval: float = 0.05,
                stop_when: typing.Callable[[list[tuple[float, str]]], bool] | None = None,
                cwd: Path = THIS_TREE) -> Sampled:
    """Run `command` in a session of its own, sampling its process tree's RSS; `stop_when(lines)` true
    ends it (SIGTERM to its group, then SIGKILL), as does `timeout` (then UserError)."""
    started = time.time()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True, cwd=cwd)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    process, peak, stopped = psutil.Process(child.pid), 0, False
    try:
        while child.poll() is None:
            try:
                peak = max(peak, tree_rss(process))
            except psutil.NoSuchProcess:
                break
            if not stopped and (time.time() - started > timeout or (stop_when is not None and stop_when(lines))):
                stopped = True
                os.killpg(child.pid, signal.SIGTERM)
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                if time.time() - started > timeout:
                    child.wait()
                    raise UserError(f"{' '.join(command[:4])} ...: no result within {timeout:.0f} s")
            time.sleep(interval)
    except BaseException:
        # Ctrl-C (or any error) here: the child is in a session of its own, so the terminal's SIGINT never
        # reached it; it must not go on measuring in a scratch folder about to be removed.
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    child.wait()
    reader.join(5)
    return Sampled(child.returncode, time.time() - started, peak, lines)



def _failed(what: str, run: Sampled) -> UserError:
    last = next((line for _, line in reversed(run.lines) if line.strip()), f"exit status {run.returncode}")
    return UserError(f"{what} failed: {last}")


def open_figures(path: Path) -> dict:
    """First and later open in fresh processes: seconds, positions, peak RSS, cache bytes per position."""
    figures = {}
    for name in ("first", "later"):
        run = run_sampled([sys.executable, "-c", OPEN_CHILD, str(path)])
        if run.returncode != 0:
            raise _failed(f"opening {path.name}", run)
        result = json.loads(run.lines[-1][1])
        figures[f"{name}_open_seconds"], figures[f"{name}_open_rss"] = result["seconds"], run.peak_rss
        figures[f"{name}_open_cpu_seconds"] = result["cpu_seconds"]
        figures["positions"] = result["positions"]
    derived = sum(p.stat().st_size for p in path.parent.iterdir() if p != path and p.is_file())
    figures["cache_bytes_per_position"] = derived / max(figures["positions"], 1)
    return figures


def average_figures(path: Path, args: argparse.Namespace) -> dict:
    """`data.use_average`'s merged set built in a fresh process from the opened corpus: seconds, peak RSS."""
    run = run_sampled([sys.executable, "-c", average.CHILD, "average", str(path)], timeout=args.timeout)
    if run.returncode != 0:
        raise _failed(f"the merged set of {path.name}", run)
    result = json.loads(run.lines[-1][1])
    return {"average_seconds": result["seconds"], "average_rss": run.peak_rss}


def train_figures(path: Path, args: argparse.Namespace, scratch: Path, checkout: Path = THIS_TREE) -> dict:
    """A real `tideborn train` process on `path`: launch to first step, positions/s, peak RSS, the whole process's
    seconds. `checkout`: the source tree whose `tideborn` it runs (its working directory and `PYTHONPATH`)."""
    out = scratch / "run"
    sets = [f"data.train={json.dumps([str(path)])}", f"runtime.out_dir={json.dumps(str(out))}",
            f"runtime.max_steps={args.steps}", "runtime.log_every=1", f"runtime.checkpoint_every={args.steps}",
            f"runtime.eval_every={args.steps}", f"optim.batch_size={args.batch_size}",
            f"data.workers={args.workers}", f"runtime.threads={args.threads}", 'runtime.progress="off"',
            'runtime.device="cpu"']
    command = [sys.executable, "-m", "tideborn", "train", "--network", args.network]
    for item in sets:
        command += ["--set", item]
    env = None if checkout == THIS_TREE else {**os.environ, "PYTHONPATH": str(checkout)}
    launched = time.time()
    run = run_sampled(command, env=env, timeout=args.timeout, cwd=checkout)
    if run.returncode != 0:
        raise _failed(f"tideborn train on {path.name}", run)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines() if line.strip()]
    steps = [e for e in events if e.get("kind") == "step"]
    shutil.rmtree(out)
    rates = [e["positions_per_second"] for e in steps[WARMUP_STEPS:]] or [steps[-1]["positions_per_second"]]
    return {"launch_to_first_step": steps[0]["time"] - launched, "positions_per_second": statistics.median(rates),
            "train_rss": run.peak_rss, "train_seconds": run.seconds}


DLSHOGI_TRAIN = r"""
import runpy, sys, torch
if not torch.cuda.is_available():
    # dlshogi's loaders pin their batch tensors for the copy to a GPU; a CPU-only torch refuses pinned
    # memory, and on the CPU pinning changes nothing else, so the flag is dropped there.
    _empty = torch.empty
    def empty(*args, pin_memory=False, **kwargs):
        return _empty(*args, **kwargs)
    torch.empty = empty
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_module("dlshogi.train", run_name="__main__")
"""
"""dlshogi's train.py as written, run where only a CPU torch is installed."""

DLSHOGI_STEP = re.compile(r"steps = (\d+), train loss")


def dlshogi_figures(path: Path, seed: Seed, args: argparse.Namespace, scratch: Path) -> dict:
    """dlshogi on the hcpe3 corpus `path`: `load_hcpe3` alone (one OpenMP thread), then its train.py."""
    build = args.dlshogi_build
    env = {**os.environ, "OMP_THREAD_LIMIT": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    load = run_sampled([sys.executable, "-m", "benchmarks.hcpe3", "dlshogi", str(path), "--dlshogi-build",
                        str(build), "--batch-size", "64", "--batches", "1"], env=env, timeout=args.timeout)
    if load.returncode != 0:
        raise _failed(f"dlshogi's load_hcpe3 on {path.name}", load)
    loaded = json.loads(load.lines[-1][1])
    test = scratch / "test.hcpe"
    write_hcpe_corpus(seed, test, args.batch_size)
    interval = args.dlshogi_eval_interval
    wanted = args.steps // interval + 1

    def enough(lines: list[tuple[float, str]]) -> bool:
        return sum(1 for _, line in lines if DLSHOGI_STEP.search(line)) >= wanted

    train_env = {**env, "PYTHONPATH": os.pathsep.join([str(build), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    command = [sys.executable, "-c", DLSHOGI_TRAIN, str(path), str(test), "--network", args.network,
               "--batchsize", str(args.batch_size), "--testbatchsize", str(args.batch_size), "--gpu", "-1",
               "--eval_interval", str(interval), "--epoch", "1",
               "--checkpoint", str(scratch / "dlshogi-{epoch:03}.pth"), "--model", str(scratch / "dlshogi.model")]
    launched = time.time()
    run = run_sampled(command, env=train_env, timeout=args.timeout, stop_when=enough)
    logged = [(t, int(m.group(1))) for t, line in run.lines if (m := DLSHOGI_STEP.search(line))]
    if len(logged) < 2:
        raise _failed(f"dlshogi's train.py on {path.name}", run)
    step_seconds = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(logged[1:], logged[2:])] or \
        [(logged[1][0] - logged[0][0]) / (logged[1][1] - logged[0][1])]
    per_step = statistics.median(step_seconds)
    return {"first_open_seconds": loaded["load_seconds"], "first_open_cpu_seconds": loaded["load_cpu_seconds"],
            "first_open_rss": load.peak_rss,
            "positions": loaded["positions"],
            "launch_to_first_step": logged[0][0] - launched - (logged[0][1] - 1) * per_step,
            "positions_per_second": args.batch_size / per_step, "train_rss": run.peak_rss}


def needed_bytes(size: int, kind: str, seed: Seed) -> int:
    per_position = 38 if kind == "hcpe" else seed.hcpe3_bytes_per_move + CACHE_BYTES_PER_POSITION
    return int(size * per_position) + DISK_MARGIN_BYTES


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def _cell(values: list[float], digits: int, unit: str = "") -> str:
    """The median, and the min..max over the repetitions when there are several."""
    median = f"{statistics.median(values):,.{digits}f}{unit}"
    if len(values) < 2:
        return median
    return f"{median} ({min(values):,.{digits}f}..{max(values):,.{digits}f})"


def print_row(size: int, kind: str, who: str, runs: list[dict]) -> None:
    """One row: times and positions/s as median (min..max) over the repetitions, memory as the largest."""
    def values(key: str) -> list[float]:
        return [run[key] for run in runs if key in run]

    later = _cell(values("later_open_seconds"), 2, " s") if values("later_open_seconds") else "-"
    cache = f"{max(values('cache_bytes_per_position')):.1f}" if values("cache_bytes_per_position") else "-"
    open_rss = max(values("first_open_rss") + values("later_open_rss"))
    merged = (f"{_cell(values('average_seconds'), 2, ' s')}, {_mb(max(values('average_rss')))}"
              if values("average_seconds") else "-")
    print(f"{size:>12,} {kind:6s} {who:9s} {runs[0]['positions']:>12,} | "
          f"{_cell(values('first_open_seconds'), 2, ' s')} | {later} | "
          f"{_cell(values('launch_to_first_step'), 1, ' s')} | {_mb(open_rss)} | {_mb(max(values('train_rss')))} | "
          f"{cache} | {merged} | {_cell(values('positions_per_second'), 0)}",
          flush=True)


HEADER = (f"{'size':>12s} {'format':6s} {'who':9s} {'positions':>12s} | first open | later open | launch to first "
          f"step | open peak RSS | train peak RSS | cache B/position | merged set (time, peak RSS) | "
          f"positions/s training")


def run_benchmark(args: argparse.Namespace) -> int:
    if args.dlshogi_build is not None:
        from benchmarks.hcpe3_dlshogi import load_cppshogi

        load_cppshogi(args.dlshogi_build)  # refuse a bad build before any work
        if not (args.dlshogi_build / "dlshogi" / "train.py").is_file():
            raise UserError(f"--dlshogi-build {args.dlshogi_build}: no dlshogi/train.py there (a source tree is "
                            f"needed for its training)")
    if args.scratch is not None and not args.scratch.is_dir():
        raise UserError(f"--scratch {args.scratch}: no such folder")
    seed = make_seed(copies=args.seed_copies)
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch_name:
        scratch = Path(scratch_name)
        free = shutil.disk_usage(scratch).free
        print(f"seed: {len(seed.game_moves):,} games, {len(seed.hcpe):,} moves ({seed.hcpe3_bytes_per_move:.1f} "
              f"hcpe3 bytes a move); network {args.network}, batch {args.batch_size}, {args.steps} steps, "
              f"data.workers {args.workers}, {args.threads} thread(s); cpus {os.cpu_count()}, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {free / 1e9:,.1f} GB free in {scratch.parent}",
              flush=True)
        print(HEADER, flush=True)
        for size in args.sizes:
            for kind in args.formats:
                need = needed_bytes(size, kind, seed)
                free = shutil.disk_usage(scratch).free
                if need > free:
                    print(f"{size:>12,} {kind:6s} skipped: needs about {need / 1e9:,.1f} GB, {free / 1e9:,.1f} GB "
                          f"free", flush=True)
                    continue
                folder = scratch / f"{kind}-{size}"
                folder.mkdir()
                path = folder / f"corpus.{kind}"
                started = time.perf_counter()
                (write_hcpe3_corpus if kind == "hcpe3" else write_hcpe_corpus)(seed, path, size)
                written = time.perf_counter() - started
                ours: list[dict] = []
                theirs: list[dict] = []
                for _ in range(args.repeats):  # alternating, so that both see the same spells of load
                    _remove_derived(path)
                    figures = open_figures(path)
                    if kind == "hcpe3":
                        figures.update(average_figures(path, args))
                    figures.update(train_figures(path, args, scratch))
                    ours.append(figures)
                    if args.dlshogi_build is not None and kind == "hcpe3":
                        _remove_derived(path)  # dlshogi reads the corpus alone
                        theirs.append(dlshogi_figures(path, seed, args, scratch))
                print_row(size, kind, "tideborn", ours)
                if theirs:
                    print_row(size, kind, "dlshogi", theirs)
                    # within each repetition both saw much the same load: steadier than either figure
                    opens = [(b["first_open_seconds"] / b["positions"]) / (a["first_open_seconds"] / a["positions"])
                             for a, b in zip(ours, theirs)]
                    opens_cpu = [(b["first_open_cpu_seconds"] / b["positions"])
                                 / (a["first_open_cpu_seconds"] / a["positions"]) for a, b in zip(ours, theirs)]
                    rates = [a["positions_per_second"] / b["positions_per_second"] for a, b in zip(ours, theirs)]
                    print(f"{'':12s} tideborn / dlshogi per repetition: first open rate {_cell(opens, 2)} (per CPU "
                          f"second {_cell(opens_cpu, 2)}), positions/s training {_cell(rates, 2)}", flush=True)
                print(f"{'':12s} ({path.stat().st_size / 1e6:,.0f} MB written in {written:.1f} s; load average "
                      f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})", flush=True)
                shutil.rmtree(folder)
    return 0


def _remove_derived(path: Path) -> None:
    """Every file beside the corpus (its cache): the next open is a first open again."""
    for other in path.parent.iterdir():
        if other != path:
            other.unlink()


def _sizes(text: str) -> list[int]:
    try:
        values = [int(float(part)) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated position counts (1000000 or 1e6), got {text!r}")
    return values


def _formats(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or any(v not in ("hcpe", "hcpe3") for v in values):
        raise argparse.ArgumentTypeError(f"expected hcpe, hcpe3 or both, comma-separated, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_sizes, default=[10**6, 10**7],
                        help="positions per corpus, comma-separated (default 1e6,1e7)")
    parser.add_argument("--formats", type=_formats, default=["hcpe", "hcpe3"])
    parser.add_argument("--network", default="resnet2x32", help="preset for both trainers (default resnet2x32)")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--steps", type=positive_int, default=30, help="training steps timed (default 30)")
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="repetitions of each measurement, tideborn and dlshogi alternating (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="tideborn's data.workers (default 1)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads of each trainer (default 1)")
    parser.add_argument("--seed-copies", type=positive_int, default=4,
                        help="copies of the shipped games, each with other statistics, in the seed (default 4)")
    parser.add_argument("--scratch", type=Path, help="folder for the corpora (default: the temporary folder)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to each process")
    parser.add_argument("--dlshogi-build", type=Path, help="dlshogi source tree with cppshogi built")
    parser.add_argument("--dlshogi-eval-interval", type=positive_int, default=5,
                        help="dlshogi's --eval_interval: it logs a step line every this many steps (default 5)")
    args = parser.parse_args(argv)
    try:
        return run_benchmark(args)
    except UserError as exc:
        return report_user_error(exc, "bench_scale")
    except KeyboardInterrupt:  # a benchmark writes only its scratch folder, removed on the way out
        return report_interrupted("bench_scale")


if __name__ == "__main__":
    sys.exit(main())
