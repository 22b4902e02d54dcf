"""tideborn's training step against dlshogi's, side by side (prints figures, never pass/fail):

    python -m benchmarks.train_dlshogi --dlshogi-build DLSHOGI_TREE --data FILE.hcpe

Both sides train the same network shape on the same hcpe positions, one thread each, alternating, `--pairs`
times per net and batch, each side in a process of its own as each trainer runs: process-wide settings, such as
the CPU trainer's allocator setting (`trainer.device.keep_freed_host_memory`), stay with their side;
`--dlshogi-keeps-memory` gives dlshogi's process the same setting. tideborn's side is the trainer's own
`TrainingState.train_step`, fed the loader's batches as `to_device_batch` makes them (uint8 planes widened, hand
planes broadcast); dlshogi's side is its `PolicyValueNetwork` from
`dlshogi/network/policy_value_network_resnet.py` and the step of its `train.py` (4caf57c) copied below, fed what
its `Hcpe3DataLoader` hands it: dense float planes and a dense one-hot policy target. Batches are decoded before
the clock starts on both sides, so the figures are the step alone; decode speed is `benchmarks.data`'s and
`benchmarks.hcpe3`'s business.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tideborn.config.load import load_settings
from tideborn.network.model import POLICY_CLASSES
from tideborn.trainer.device import keep_freed_host_memory, resolve_device
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.state import TrainingState

BATCHES = 8
"""Distinct premade batches each side cycles through."""


def _settings(data: Path, blocks: int, channels: int, batch_size: int):
    overrides = [f"data.train=[{str(data)!r}]".replace("'", '"'), "data.kind=\"hcpe\"", "data.workers=0",
                 "data.test=[]", f"optim.batch_size={batch_size}", "runtime.device=\"cpu\"", "runtime.threads=1",
                 f"model.blocks={blocks}", f"model.channels={channels}", "optim.optimizer=\"sgd\"",
                 f"runtime.out_dir={tempfile.gettempdir()!r}"]
    return load_settings(None, overrides, environ={}).settings


def _tideborn_side(data: Path, blocks: int, channels: int, batch_size: int):
    settings = _settings(data, blocks, channels, batch_size)
    state = TrainingState(settings, resolve_device(settings.runtime), DistEnv())
    state.restore(StartPoint())
    batches = [state.data.next_batch() for _ in range(BATCHES)]
    state.data.close()
    cursor = iter(range(10**12))
    state.data.next_batch = lambda: batches[next(cursor) % BATCHES]

    def step() -> None:
        result = state.train_step(0)
        result.losses.tolist(), float(result.grad_norm)  # the trainer reads these every step too

    return step


def _loader_batches(data: Path, blocks: int, channels: int, batch_size: int) -> list:
    """The batches `_tideborn_side` trains on (the same settings and seed), made by the loader alone, so that
    dlshogi's process gets none of tideborn's trainer settings."""
    from tideborn.trainer.state import teacher_batches

    loader = teacher_batches(_settings(data, blocks, channels, batch_size), torch.device("cpu"), 0, 1)
    try:
        return [loader.next_batch() for _ in range(BATCHES)]
    finally:
        loader.close()


def _dlshogi_side(tree: Path, blocks: int, channels: int, batches: list):
    sys.path.insert(0, str(tree))
    # Imported by name from the tree the user points at: dlshogi is no dependency of tideborn's.
    PolicyValueNetwork = importlib.import_module("dlshogi.network.policy_value_network_resnet").PolicyValueNetwork

    torch.manual_seed(0)
    model = PolicyValueNetwork(blocks, channels)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    bce = torch.nn.BCEWithLogitsLoss()
    val_lambda = 0.333
    dense = []
    for b in batches:
        t1 = torch.zeros(len(b.policy), POLICY_CLASSES)
        t1[torch.arange(len(b.policy)), b.policy] = 1.0
        dense.append((b.features1.contiguous(), b.features2.contiguous(), t1, b.value.view(-1, 1).clone(),
                      b.value.view(-1, 1).clone()))
    cursor = iter(range(10**12))

    def step() -> None:  # train.py's loop body, amp and critic off, no clipping, no SWA
        x1, x2, t1, t2, value = dense[next(cursor) % BATCHES]
        model.train()
        y1, y2 = model(x1, x2)
        model.zero_grad()
        loss1 = torch.sum(-t1 * F.log_softmax(y1, dim=1), 1).mean()
        loss2 = bce(y2, t2)
        loss3 = bce(y2, value)
        loss = loss1 + (1 - val_lambda) * loss2 + val_lambda * loss3
        loss.backward()
        optimizer.step()
        loss1.item(), loss2.item(), loss3.item(), loss.item()

    return step


def _rate(step, steps: int, batch_size: int) -> tuple[float, float, float]:
    """Positions per second over `steps` steps, the same per second of this process's CPU time (steadier on a
    shared machine), and the page faults per step they took."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return (steps * batch_size / seconds, steps * batch_size / cpu_seconds,
            (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps)


def _serve(side: str, tree: Path, data: Path, blocks: int, channels: int, batch_size: int, keep_memory: bool,
           conn) -> None:
    """One side in its own process: build, warm up, then time `steps` steps each time the parent asks."""
    torch.set_num_threads(1)
    if side == "tideborn":
        step = _tideborn_side(data, blocks, channels, batch_size)
    else:
        if keep_memory:
            keep_freed_host_memory()
        step = _dlshogi_side(tree, blocks, channels, _loader_batches(data, blocks, channels, batch_size))
    step()
    conn.send("ready")
    while (steps := conn.recv()) is not None:
        conn.send(_rate(step, steps, batch_size))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_dlshogi")
    parser.add_argument("--dlshogi-build", type=Path, required=True, help="a DeepLearningShogi source tree")
    parser.add_argument("--data", type=Path, required=True, help="an hcpe file (at least 8 batches of records)")
    parser.add_argument("--nets", default="2x32:256,2x32:1024,10x192:256", help="BLOCKSxCHANNELS:BATCH, ...")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="about how long each timed run lasts")
    parser.add_argument("--dlshogi-keeps-memory", action="store_true",
                        help="give dlshogi's process tideborn's allocator setting too (the step's kernels alone)")
    args = parser.parse_args(argv)
    if not (args.dlshogi_build / "dlshogi" / "network" / "policy_value_network_resnet.py").is_file():
        print(f"--dlshogi-build {args.dlshogi_build}: no dlshogi/network/policy_value_network_resnet.py there",
              file=sys.stderr)
        return 2
    print(f"tideborn step vs dlshogi step: torch {torch.__version__}, 1 thread each, a process each, "
          f"{args.pairs} pairs, alternating (the order flips each pair), data {args.data.name}, dlshogi's allocator "
          f"{'as tideborn sets it' if args.dlshogi_keeps_memory else 'as glibc sets it'}, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter per side: nothing process-wide shared
    for spec in args.nets.split(","):
        shape, batch = spec.split(":")
        blocks, channels = (int(v) for v in shape.split("x"))
        batch_size = int(batch)
        sides, conns = {}, {}
        for name in ("tideborn", "dlshogi"):
            conns[name], child = context.Pipe()
            sides[name] = context.Process(target=_serve, args=(name, args.dlshogi_build, args.data, blocks, channels,
                                                                batch_size, args.dlshogi_keeps_memory, child))
            sides[name].start()
        try:
            for conn in conns.values():
                conn.recv()
            conns["tideborn"].send(1)
            one_step = batch_size / conns["tideborn"].recv()[0]
            steps = max(3, round(args.seconds / one_step))
            rates: dict[str, list[float]] = {"tideborn": [], "dlshogi": []}
            cpu_rates: dict[str, list[float]] = {"tideborn": [], "dlshogi": []}
            faults: dict[str, list[float]] = {"tideborn": [], "dlshogi": []}
            for pair in range(args.pairs):
                order = ["tideborn", "dlshogi"]
                for name in order if pair % 2 == 0 else reversed(order):
                    conns[name].send(steps)
                    rate, cpu_rate, step_faults = conns[name].recv()
                    rates[name].append(rate)
                    cpu_rates[name].append(cpu_rate)
                    faults[name].append(step_faults)
        finally:
            for name, conn in conns.items():
                conn.send(None)
                sides[name].join()
        print(f"{shape} b{batch_size} ({steps} steps per run), load average {os.getloadavg()[0]:.1f}:")
        for clock, table in (("wall clock", rates), ("CPU time", cpu_rates)):
            for name, values in table.items():
                print(f"  {name:9} positions/s ({clock}) median {statistics.median(values):>9,.0f}  "
                      f"min {min(values):>9,.0f}  max {max(values):>9,.0f}  "
                      f"page faults per step {statistics.median(faults[name]):>8,.0f}")
            ratios = [a / b for a, b in zip(table["tideborn"], table["dlshogi"])]
            print(f"  {clock}: ratio of medians "
                  f"{statistics.median(table['tideborn']) / statistics.median(table['dlshogi']):.3f}  "
                  f"per pair {min(ratios):.3f} .. {max(ratios):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
