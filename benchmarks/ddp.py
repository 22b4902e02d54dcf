"""DDP on this machine (figures, never pass/fail): `python -m benchmarks.ddp`.

Runs the real trainer through torchrun with 1 and 2 CPU processes (gloo), alternating, several
repetitions, and reports positions/s (all ranks) with spread. Then times the gradient all-reduce alone:
2 processes all-reduce a float32 tensor the size of the network's gradients, as DDP does once per step,
and reports it against the 2-process step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tideborn.config.load import load_settings
from tideborn.network.model import build_model
from tideborn.rundir.events import read_events


def training_rep(processes: int, args: argparse.Namespace) -> float:
    """Median positions/s over the step events after the first (warm-up) window."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                   str(processes), "-m", "tideborn.trainer", "train", "--network", args.network,
                   "--set", f"runtime.out_dir={json.dumps(str(run_dir))}", "--set", f"runtime.max_steps={args.steps}",
                   "--set", f"optim.batch_size={args.batch_size}", "--set", "runtime.log_every=5",
                   "--set", 'runtime.device="cpu"', "--set", 'data.kind="synthetic"', "--set", 'runtime.progress="off"']
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads_per_process))
        subprocess.run(command, cwd=tmp, env=env, check=True, capture_output=True, timeout=600)
        rates = [e["positions_per_second"] for e in read_events(run_dir / "events.jsonl") if e["kind"] == "step"]
    return statistics.median(rates[1:])


def _allreduce_worker(rank: int, numel: int, repeats: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    tensor = torch.randn(numel)
    for _ in range(3):
        dist.all_reduce(tensor)
    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - started)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def allreduce_seconds(numel: int, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        port = 29500 + os.getpid() % 1000
        mp.spawn(_allreduce_worker, args=(numel, repeats, port, out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())


def _spread(values: list[float], unit: str = "") -> str:
    return (f"median {statistics.median(values):,.1f}{unit}  min {min(values):,.1f}{unit}  "
            f"max {max(values):,.1f}{unit}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ddp")
    parser.add_argument("--network", default="resnet5x64")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads-per-process", type=int, default=1,
                        help="CPU threads per process (1: on a small shared machine, more threads than free cores "
                             "make OpenMP's spinning barriers collapse, which would measure the contention instead)")
    args = parser.parse_args(argv)
    settings = load_settings(None, [], {"network": args.network}, environ={}).settings
    numel = sum(p.numel() for p in build_model(settings.model).parameters())
    print(f"bench_ddp: {args.network} ({numel:,} parameters), batch {args.batch_size} per rank, {args.steps} steps, "
          f"{args.reps} reps alternating, {args.threads_per_process} thread(s) per process, "
          f"torch {torch.__version__}, gloo")
    rates: dict[int, list[float]] = {1: [], 2: []}
    for rep in range(args.reps):
        for processes in (1, 2):
            rates[processes].append(training_rep(processes, args))
        print(f"  rep {rep + 1}: 1 process {rates[1][-1]:,.0f} pos/s, 2 processes {rates[2][-1]:,.0f} pos/s",
              flush=True)
    for processes in (1, 2):
        print(f"{processes} process(es)  positions/s {_spread(rates[processes])}")
    print(f"scaling 2 vs 1: {statistics.median(rates[2]) / statistics.median(rates[1]):.2f}x")
    times = [t * 1000 for t in allreduce_seconds(numel, 50)]
    step_ms = 2 * args.batch_size / statistics.median(rates[2]) * 1000
    print(f"all-reduce of {numel * 4 / 2**20:.1f} MiB of gradients (2 processes, gloo): {_spread(times, ' ms')}; "
          f"{statistics.median(times) / step_ms * 100:.1f}% of a {step_ms:.0f} ms 2-process step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
