"""hcpe3 throughput: tideborn's loader against dlshogi's C++ one on the same file (figures, never pass/fail).

    python -m benchmarks.hcpe3 pipeline [--file X.hcpe3 | --games DIR --copies N] [--dlshogi-build DIR]
    python -m benchmarks.hcpe3 open [--file X.hcpe3 | --games DIR --copies N] [--dlshogi-build DIR]
    python -m benchmarks.hcpe3 decode [--file X.hcpe3 | --games DIR --copies N] --dlshogi-build DIR
    python -m benchmarks.hcpe3 check X.hcpe3 [--dlshogi-build DIR [--average]]
    python -m benchmarks.hcpe3 make OUT.hcpe3 [--games DIR ...] [--copies N] [--book-plies N]

`pipeline` times, alternating, several repetitions in one run, on a copy of the file in a scratch folder:
tideborn's first open (every game replayed into the positions cache) and a second one (the cache mapped);
one worker's batch decode alone (the figure to multiply by workers); `TeacherBatches`, the trainer's
loader, into ready CPU tensors with each worker count; and, given `--dlshogi-build`, dlshogi's
`load_hcpe3` (the whole file replayed into memory) and its `hcpe3_decode_with_value` batches, in a child
process per OpenMP thread limit (`OMP_THREAD_LIMIT`: its decode asks for 2 threads whatever
OMP_NUM_THREADS says). Without `--file` it writes the games under `--games` (default `samples/games`) as
hcpe3 with made-up search statistics (`bench_hcpe3_file`).

`open` times the first open alone, alternating: tideborn's replay of a fresh copy into its positions cache
(one process), and dlshogi's `load_hcpe3` in a child process limited to one OpenMP thread; per repetition
the ratio of their positions/s (steadier than either on a busy machine), by the wall clock and by CPU time
(each process's own: steadier still where other jobs share the cores, but without the waits for the disk),
and the cache's bytes per position.

`decode` times decode per core on the training path, hcpe3 and hcpe (the same positions written as hcpe records),
side by side: tideborn's one worker's batch decode (`BatchDecoder`, uint8 planes and targets) against dlshogi's
`hcpe3_decode_with_value` and `hcpe_decode_with_value` (float planes and targets), each in a fresh child process
limited to one thread (`OMP_NUM_THREADS=1`, and `OMP_THREAD_LIMIT=1` for dlshogi), alternating with the order
flipped each repetition; per kind the medians with their spread and the ratio of medians.

`check` compares, position by position, tideborn's reading of a file with a plain cshogi replay under
dlshogi's rules and, given the build, with dlshogi's loader; `--average` also compares duplicate averaging
(`data.use_average`) with dlshogi's `use_average`. It counts each kind of difference and names the first
few by game and move; exit status 1 when there is one.

dlshogi's module is not a dependency: build it from its public source, outside this repository, for the
Python and numpy that run tideborn:

    git clone https://github.com/TadaoYamaoka/DeepLearningShogi /tmp/dlshogi && cd /tmp/dlshogi
    python -m venv /tmp/dlvenv    # the same Python version as tideborn's
    /tmp/dlvenv/bin/pip install cython setuptools "numpy==$(python -c 'import numpy; print(numpy.__version__)')"
    /tmp/dlvenv/bin/python setup.py build_ext --inplace   # dlshogi/cppshogi*.so: C++17, -O3, AVX2, OpenMP

and pass `--dlshogi-build /tmp/dlshogi` (the tree, or any folder holding a `cppshogi*.so`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.hcpe3_check import check_average, cross_check
from benchmarks.hcpe3_dlshogi import (
    DlshogiData,
    dlshogi_figures,
    dlshogi_hcpe_figures,
    dump_dlshogi_average,
    load_cppshogi,
)
from benchmarks.hcpe3_file import reference_moves, write_hcpe3_from_games
from tideborn.cliparser import OneLineParser, positive_int
from tideborn.errors import UserError, report_user_error

CHECKOUT = Path(__file__).resolve().parents[1]
DEFAULT_GAMES = CHECKOUT / "samples" / "games"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment for a `-m benchmarks.hcpe3` child, with the checkout on its path: the benchmarks are
    no installed package, and the child may start in another folder."""
    path = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **(extra or {}), "PYTHONPATH": path}


def dlshogi_in_child(build: Path, path: Path, threads: int, batch_size: int, batches: int, seed: int) -> dict:
    """`dlshogi_figures` in a fresh process limited to `threads` OpenMP threads (the limit is read when
    libgomp starts, and dlshogi's decode asks for 2 threads whatever OMP_NUM_THREADS says)."""
    command = [sys.executable, "-m", "benchmarks.hcpe3", "dlshogi", str(path), "--dlshogi-build", str(build),
               "--batch-size", str(batch_size), "--batches", str(batches), "--seed", str(seed)]
    return _child(command, {"OMP_THREAD_LIMIT": str(threads)}, f"dlshogi's loader on {path}")


def tideborn_decode_in_child(path: Path, batch_size: int, batches: int, seed: int) -> dict:
    """`tideborn_decode_positions_per_second` in a fresh process on one thread."""
    command = [sys.executable, "-m", "benchmarks.hcpe3", "tideborn-decode", str(path), "--batch-size",
               str(batch_size), "--batches", str(batches), "--seed", str(seed)]
    return _child(command, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, f"tideborn's decode of {path}")


def _child(command: list[str], env: dict[str, str], what: str) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(env), timeout=3600)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise UserError(f"{what} failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values: list[float], unit: str = "pos/s", digits: int = 0) -> str:
    return (f"{statistics.median(values):11,.{digits}f} {unit}  "
            f"({min(values):,.{digits}f}..{max(values):,.{digits}f})")


def benchmark_file(args: argparse.Namespace, scratch: Path) -> Path:
    if args.file is not None:
        if not args.file.is_file():
            raise UserError(f"--file {args.file}: no such file")
        return args.file
    path = scratch / "games.hcpe3"
    summary = write_hcpe3_from_games(args.games or [DEFAULT_GAMES], path, copies=args.copies, seed=0)
    if summary.games == 0:
        raise UserError(f"no readable games with a result under {', '.join(map(str, args.games or [DEFAULT_GAMES]))}")
    return path


def tideborn_open_seconds(source: Path, scratch: Path) -> tuple[float, float, int]:
    """(cold, warm, positions): opening a fresh copy of `source` (no positions cache yet: every game
    replayed with cshogi and the cache written beside it), then opening it again (the cache mapped)."""
    cold, _, warm, positions = tideborn_open_times(source, scratch)
    return cold, warm, positions


def tideborn_open_times(source: Path, scratch: Path) -> tuple[float, float, float, int]:
    """`tideborn_open_seconds` and, second, the CPU seconds of the cold open (this process's: the open runs
    on one thread; the waits for the disk, fsync above all, are not in it)."""
    from tideborn.data.cache.hcpe3 import Hcpe3File

    folder = Path(tempfile.mkdtemp(dir=scratch))
    copy = folder / source.name
    shutil.copyfile(source, copy)
    started, cpu_started = time.perf_counter(), time.process_time()
    positions = len(Hcpe3File(copy).positions(progress=_quiet))
    cold, cold_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    started = time.perf_counter()
    len(Hcpe3File(copy).positions())
    warm = time.perf_counter() - started
    shutil.rmtree(folder)
    return cold, cold_cpu, warm, positions


def tideborn_decode_positions_per_second(path: Path, batch_size: int, batches: int, seed: int) -> float:
    """Positions/s of one worker's share alone: the batch decode a loader worker runs (`BatchDecoder` on the
    file's cached positions, in the trainer's shuffled order: uint8 planes, values, sparse distributions),
    without the hand-over to the training process or the widening to float. What to multiply by workers."""
    return tideborn_decode_figures(path, batch_size, batches, seed)["positions_per_second"]


def tideborn_decode_figures(path: Path, batch_size: int, batches: int, seed: int) -> dict:
    """`tideborn_decode_positions_per_second`, and the same per second of this process's CPU time (per core,
    whatever else the machine runs)."""
    from tideborn.config.schema import DataSettings, LossSettings
    from tideborn.data.sets.sources import BatchDecoder, open_source
    from tideborn.data.training.dataset import ShardedOrder

    data, loss = DataSettings(), LossSettings()
    source = open_source([path])
    order = ShardedOrder(len(source), seed, batch_size)
    decoder = BatchDecoder(data.eval_scale, loss.value_lambda, data.bad_records, data.policy_temperature)
    cursor = (0, 0)
    decoder.decode(source, order.batch_indices(*cursor))  # first touch of the map and the scratch planes
    started, cpu_started = time.perf_counter(), time.process_time()
    positions = 0
    for _ in range(batches):
        cursor = order.following(*cursor)
        positions += len(decoder.decode(source, order.batch_indices(*cursor)))
    return {"positions_per_second": positions / (time.perf_counter() - started),
            "positions_per_cpu_second": positions / (time.process_time() - cpu_started)}


def tideborn_positions_per_second(path: Path, workers: int, batch_size: int, batches: int, seed: int) -> float:
    """Steady-state positions/s of `TeacherBatches` (the trainer's loader) on `path` into ready CPU tensors:
    input planes widened to float, value targets, sparse policy distributions."""
    import torch

    from tideborn.config.load import load_settings
    from tideborn.trainer.state import teacher_batches

    settings = load_settings(None, [f"data.train={json.dumps([str(path)])}", f"data.workers={workers}",
                                    f"optim.batch_size={batch_size}", f"runtime.seed={seed}",
                                    "data.prefetch_batches=4"], environ={}).settings
    with teacher_batches(settings, torch.device("cpu")) as data:
        data.next_batch()  # worker start-up (and opening the file) is not throughput
        started = time.perf_counter()
        positions = sum(len(data.next_batch()) for _ in range(batches))
        return positions / (time.perf_counter() - started)


def command_pipeline(args: argparse.Namespace) -> int:
    worker_counts = args.workers
    thread_counts = args.dlshogi_threads if args.dlshogi_build else []
    if args.dlshogi_build is not None:
        load_cppshogi(args.dlshogi_build)  # refuse a bad build before any timing
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        path = benchmark_file(args, scratch)
        moves = reference_moves(path)
        games = len({m.game for m in moves})
        cold, warm, counts = [], [], set()
        results: dict[str, list[float]] = {"tideborn, one worker's decode alone": []}
        results.update({f"tideborn, {w} worker{'s' if w != 1 else ''}": [] for w in worker_counts})
        load_seconds: dict[int, list[float]] = {t: [] for t in thread_counts}
        dlshogi_rates: dict[int, list[float]] = {t: [] for t in thread_counts}
        dlshogi_positions = set()
        # The benchmark reads a copy in the scratch folder, so that no cache is left beside the user's file.
        working = scratch / "timed" / f"{path.stem}.hcpe3"  # the extension tells the loader the format
        working.parent.mkdir()
        shutil.copyfile(path, working)
        positions = len(_open_positions(working))
        batches = min(args.batches, max(1, positions // args.batch_size - 1))
        print(f"{path.name}: {path.stat().st_size:,} bytes, {games:,} games, {len(moves):,} moves, "
              f"{positions:,} tideborn positions; batches of {args.batch_size}, {batches} timed batches per run, "
              f"{args.repeats} repetitions alternating; cpus {os.cpu_count()}, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        for repeat in range(args.repeats):
            c, w, n = tideborn_open_seconds(path, scratch)
            cold.append(c)
            warm.append(w)
            counts.add(n)
            results["tideborn, one worker's decode alone"].append(
                tideborn_decode_positions_per_second(working, args.batch_size, batches, seed=repeat))
            for workers in worker_counts:
                results[f"tideborn, {workers} worker{'s' if workers != 1 else ''}"].append(
                    tideborn_positions_per_second(working, workers, args.batch_size, batches, seed=repeat))
            for threads in thread_counts:
                figures = dlshogi_in_child(args.dlshogi_build, working, threads, args.batch_size, batches, repeat)
                load_seconds[threads].append(figures["load_seconds"])
                dlshogi_rates[threads].append(figures["positions_per_second"])
                dlshogi_positions.add(figures["positions"])
        print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'tideborn, cold open (replay, cache)':40s} {_spread(cold, 's', 3)}  "
          f"{positions / statistics.median(cold):,.0f} pos/s")
    print(f"{'tideborn, warm open (cache mapped)':40s} {_spread(warm, 's', 3)}")
    for name, values in results.items():
        print(f"{name:40s} {_spread(values)}  {1000 * args.batch_size / statistics.median(values):6.1f} ms/batch")
    for threads in thread_counts:
        dl_positions = next(iter(dlshogi_positions))
        print(f"{'dlshogi load_hcpe3 (replay into RAM)':40s} {_spread(load_seconds[threads], 's', 3)}  "
              f"{dl_positions / statistics.median(load_seconds[threads]):,.0f} pos/s ({threads} thread limit)")
        rates = dlshogi_rates[threads]
        name = f"dlshogi decode, {threads} OpenMP thread{'s' if threads != 1 else ''}"
        print(f"{name:40s} {_spread(rates)}  {1000 * args.batch_size / statistics.median(rates):6.1f} ms/batch")
    if thread_counts:
        # Both measured within each repetition, so their ratio is steadier than either figure on a busy machine.
        ours = results["tideborn, one worker's decode alone"]
        ratios = [a / b for a, b in zip(ours, dlshogi_rates[thread_counts[0]])]
        print(f"tideborn's one worker / dlshogi at {thread_counts[0]} thread{'s' if thread_counts[0] != 1 else ''}, "
              f"per repetition: {statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})")
    if dlshogi_positions:
        print(f"positions: tideborn {positions:,}, dlshogi {', '.join(f'{n:,}' for n in sorted(dlshogi_positions))} "
              f"(dlshogi skips moves without candidates; `check` compares them)")
    return 0


def command_open(args: argparse.Namespace) -> int:
    if args.dlshogi_build is not None:
        load_cppshogi(args.dlshogi_build)  # refuse a bad build before any timing
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        path = benchmark_file(args, scratch)
        print(f"{path.name}: {path.stat().st_size:,} bytes; {args.repeats} repetitions alternating; cpus "
              f"{os.cpu_count()}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        ours, theirs, warm, ratios = [], [], [], []
        ours_cpu, theirs_cpu, cpu_ratios = [], [], []
        positions = dl_positions = cache_bytes = 0
        for repeat in range(args.repeats):
            cold_seconds, cold_cpu_seconds, warm_seconds, positions = tideborn_open_times(path, scratch)
            ours.append(positions / cold_seconds)
            ours_cpu.append(positions / cold_cpu_seconds)
            warm.append(warm_seconds)
            if args.dlshogi_build is not None:
                figures = dlshogi_in_child(args.dlshogi_build, path, 1, 64, 1, repeat)
                dl_positions = figures["positions"]
                theirs.append(dl_positions / figures["load_seconds"])
                theirs_cpu.append(dl_positions / figures["load_cpu_seconds"])
                ratios.append(ours[-1] / theirs[-1])
                cpu_ratios.append(ours_cpu[-1] / theirs_cpu[-1])
        copy = scratch / "sized" / path.name
        copy.parent.mkdir()
        shutil.copyfile(path, copy)
        _open_positions(copy)
        from tideborn.data.cache.hcpe3 import cache_path

        cache_bytes = cache_path(copy).stat().st_size
        print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'tideborn, first open (replay, cache)':40s} {_spread(ours)}  ({positions:,} positions)")
    print(f"{'tideborn, later open (cache checked)':40s} {_spread(warm, 's', 3)}")
    print(f"{'tideborn, cache bytes per position':40s} {cache_bytes / max(positions, 1):11.1f}")
    if theirs:
        print(f"{'dlshogi load_hcpe3, 1 thread':40s} {_spread(theirs)}  ({dl_positions:,} positions)")
        print(f"tideborn / dlshogi per repetition: {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}..{max(ratios):.2f})")
    # CPU time: steadier than the wall clock on a shared machine (a process waiting for a core is not
    # charged), but blind to the waits for the disk (tideborn's cache write and its fsync; dlshogi writes none)
    print(f"{'tideborn, first open, per CPU second':40s} {_spread(ours_cpu)}")
    if theirs_cpu:
        print(f"{'dlshogi load_hcpe3, per CPU second':40s} {_spread(theirs_cpu)}")
        print(f"tideborn / dlshogi per repetition, CPU time: {statistics.median(cpu_ratios):.2f} "
              f"({min(cpu_ratios):.2f}..{max(cpu_ratios):.2f})")
    return 0


def _open_positions(path: Path):
    from tideborn.data.cache.hcpe3 import Hcpe3File

    return Hcpe3File(path).positions(progress=_quiet)


def _quiet(done: int, size: int) -> None:
    """A progress callback that says nothing: without one, the first open announces its decoding."""


def command_check(args: argparse.Namespace) -> int:
    if not args.file.is_file():
        raise UserError(f"{args.file}: no such file")
    moves = reference_moves(args.file)
    print(f"{args.file}: {len({m.game for m in moves}):,} games, {len(moves):,} moves, "
          f"{sum(len(m.candidates) > 0 for m in moves):,} with candidates, "
          f"{sum(m.repetition is not None for m in moves):,} into a repetition, "
          f"{sum(m.dlshogi_keeps for m in moves):,} positions by dlshogi's rules (plain cshogi replay)")
    dlshogi = None
    if args.dlshogi_build is not None:
        dlshogi = DlshogiData(load_cppshogi(args.dlshogi_build), args.file, 512)
    lines, agree = cross_check(args.file, moves, dlshogi)
    print("\n".join(lines))
    if args.average:
        if args.dlshogi_build is None:
            raise UserError("--average compares with dlshogi's averaging: give --dlshogi-build too")
        with tempfile.TemporaryDirectory() as scratch:
            dump = Path(scratch) / "average.npz"
            command = [sys.executable, "-m", "benchmarks.hcpe3", "dlshogi", str(args.file),
                       "--dlshogi-build", str(args.dlshogi_build), "--dump-average", str(dump)]
            done = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=3600)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                raise UserError(f"dlshogi's averaging of {args.file} failed: {last}")
            lines, same = check_average(args.file, moves, dict(np.load(dump)))
        print("\n".join(lines))
        agree = agree and same
    return 0 if agree else 1


def command_decode(args: argparse.Namespace) -> int:
    load_cppshogi(args.dlshogi_build)  # refuse a bad build before any timing
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        source = benchmark_file(args, scratch)
        files = {"hcpe3": scratch / "timed" / "games.hcpe3", "hcpe": scratch / "timed" / "games.hcpe"}
        files["hcpe3"].parent.mkdir()
        shutil.copyfile(source, files["hcpe3"])
        from tideborn.data.sets.sources import open_source

        opened = open_source([files["hcpe3"]])  # the positions cache is built here, untimed
        every = np.arange(len(opened))
        np.concatenate([records for records, _ in opened.record_groups(every)]).tofile(files["hcpe"])
        opened.close()
        print(f"{len(every):,} positions, as hcpe3 ({files['hcpe3'].stat().st_size:,} bytes) and hcpe; batches of "
              f"{args.batch_size}, {args.batches} timed per run, {args.repeats} repetitions, one thread a side; "
              f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        rates = {kind: {"tideborn": [], "dlshogi": []} for kind in files}
        cpu_rates = {kind: {"tideborn": [], "dlshogi": []} for kind in files}
        for repeat in range(args.repeats):
            for kind, path in files.items():
                sides = ["tideborn", "dlshogi"] if repeat % 2 == 0 else ["dlshogi", "tideborn"]
                for side in sides:
                    if side == "tideborn":
                        figures = tideborn_decode_in_child(path, args.batch_size, args.batches, repeat)
                    else:
                        figures = dlshogi_in_child(args.dlshogi_build, path, 1, args.batch_size, args.batches, repeat)
                    rates[kind][side].append(figures["positions_per_second"])
                    cpu_rates[kind][side].append(figures["positions_per_cpu_second"])
                print(f"repeat {repeat} {kind}: tideborn {rates[kind]['tideborn'][-1]:,.0f}, dlshogi "
                      f"{rates[kind]['dlshogi'][-1]:,.0f} positions/s; per CPU second "
                      f"{cpu_rates[kind]['tideborn'][-1]:,.0f}, {cpu_rates[kind]['dlshogi'][-1]:,.0f} "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    for clock, table in (("wall clock", rates), ("CPU time", cpu_rates)):
        for kind, by_side in table.items():
            ours, theirs = by_side["tideborn"], by_side["dlshogi"]
            ratios = [a / b for a, b in zip(ours, theirs)]
            print(f"{kind}, {clock}: tideborn {_spread(ours)}  dlshogi {_spread(theirs)}  ratio of medians "
                  f"{statistics.median(ours) / statistics.median(theirs):.3f}, per repetition "
                  f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})")
    return 0


def command_dlshogi(args: argparse.Namespace) -> int:
    if args.dump_average is not None:
        dump_dlshogi_average(args.dlshogi_build, args.file, args.dump_average)
        return 0
    figures = dlshogi_hcpe_figures if args.file.suffix == ".hcpe" else dlshogi_figures
    print(json.dumps(figures(args.dlshogi_build, args.file, args.batch_size, args.batches, args.seed)))
    return 0


def command_tideborn_decode(args: argparse.Namespace) -> int:
    print(json.dumps(tideborn_decode_figures(args.file, args.batch_size, args.batches, args.seed)))
    return 0


def command_make(args: argparse.Namespace) -> int:
    def warn(line: str) -> None:
        print(f"skipped: {line}", file=sys.stderr)

    summary = write_hcpe3_from_games(args.games or [DEFAULT_GAMES], args.output, copies=args.copies, seed=args.seed,
                                     book_plies=args.book_plies, warn=warn)
    print(f"{args.output}: {summary.games:,} games, {summary.moves:,} moves, {summary.with_candidates:,} with "
          f"candidates, {summary.bytes:,} bytes")
    return 0


def _counts(text: str, least: int) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = [least - 1]
    if any(v < least for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= {least}, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.hcpe3", description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    pipeline = sub.add_parser("pipeline", help="positions/s of tideborn's hcpe3 loader (and dlshogi's)")
    pipeline.add_argument("--file", type=Path, help="hcpe3 file to read (default: --games written as hcpe3)")
    pipeline.add_argument("--games", type=Path, action="append", help="game records for the default file "
                          "(repeatable; default samples/games)")
    pipeline.add_argument("--copies", type=positive_int, default=1,
                          help="write the games this many times (a larger file)")
    pipeline.add_argument("--dlshogi-build", type=Path, help="dlshogi source tree with cppshogi built (see --help)")
    pipeline.add_argument("--dlshogi-threads", type=lambda t: _counts(t, 1), default=[1, 2],
                          help="OpenMP thread limits for dlshogi's decode, comma-separated (default 1,2)")
    pipeline.add_argument("--batch-size", type=positive_int, default=1024)
    pipeline.add_argument("--batches", type=positive_int, default=8, help="timed batches per run")
    pipeline.add_argument("--repeats", type=positive_int, default=3)
    pipeline.add_argument("--workers", type=lambda t: _counts(t, 0), default=[0, 1, 2],
                          help="tideborn worker counts, comma-separated (default 0,1,2)")

    first_open = sub.add_parser("open", help="first open of an hcpe3 file: tideborn's replay against dlshogi's load")
    first_open.add_argument("--file", type=Path, help="hcpe3 file to read (default: --games written as hcpe3)")
    first_open.add_argument("--games", type=Path, action="append", help="game records for the default file "
                            "(repeatable; default samples/games)")
    first_open.add_argument("--copies", type=positive_int, default=1, help="write the games this many times")
    first_open.add_argument("--dlshogi-build", type=Path, help="dlshogi source tree with cppshogi built (see --help)")
    first_open.add_argument("--repeats", type=positive_int, default=4)

    decode = sub.add_parser("decode", help="decode per core, hcpe3 and hcpe: tideborn's worker against dlshogi's")
    decode.add_argument("--file", type=Path, help="hcpe3 file to read (default: --games written as hcpe3)")
    decode.add_argument("--games", type=Path, action="append", help="game records for the default file "
                        "(repeatable; default samples/games)")
    decode.add_argument("--copies", type=positive_int, default=1, help="write the games this many times")
    decode.add_argument("--dlshogi-build", type=Path, required=True,
                        help="dlshogi source tree with cppshogi built (see --help)")
    decode.add_argument("--batch-size", type=positive_int, default=1024)
    decode.add_argument("--batches", type=positive_int, default=20, help="timed batches per run")
    decode.add_argument("--repeats", type=positive_int, default=4)

    check = sub.add_parser("check", help="compare tideborn's reading of a file with dlshogi's and a plain replay")
    check.add_argument("file", type=Path)
    check.add_argument("--dlshogi-build", type=Path)
    check.add_argument("--average", action="store_true", help="also compare duplicate averaging (data.use_average "
                       "against dlshogi's use_average; needs --dlshogi-build)")

    make = sub.add_parser("make", help="write game records as hcpe3 with made-up search statistics")
    make.add_argument("output", type=Path)
    make.add_argument("--games", type=Path, action="append")
    make.add_argument("--copies", type=positive_int, default=1)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--book-plies", type=int, default=8, help="first moves of a game written without candidates")

    dlshogi = sub.add_parser("dlshogi", help="dlshogi's loader alone, in this process (one JSON line)")
    dlshogi.add_argument("file", type=Path)
    dlshogi.add_argument("--dlshogi-build", type=Path, required=True)
    dlshogi.add_argument("--batch-size", type=positive_int, default=1024)
    dlshogi.add_argument("--batches", type=positive_int, default=8)
    dlshogi.add_argument("--seed", type=int, default=0)
    dlshogi.add_argument("--dump-average", type=Path, metavar="OUT.npz",
                         help="load with use_average and save every entry's targets instead (for `check`)")

    ours = sub.add_parser("tideborn-decode", help="tideborn's decode alone, in this process (one JSON line)")
    ours.add_argument("file", type=Path)
    ours.add_argument("--batch-size", type=positive_int, default=1024)
    ours.add_argument("--batches", type=positive_int, default=8)
    ours.add_argument("--seed", type=int, default=0)

    args = parser.parse_args(argv)
    commands = {"pipeline": command_pipeline, "open": command_open, "decode": command_decode, "check": command_check,
                "make": command_make, "dlshogi": command_dlshogi, "tideborn-decode": command_tideborn_decode}
    try:
        return commands[args.command](args)
    except UserError as exc:
        return report_user_error(exc, "bench_hcpe3")


if __name__ == "__main__":
    sys.exit(main())
