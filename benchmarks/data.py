"""Data-pipeline benchmarks that print figures (never pass/fail).

    python -m benchmarks.data pipeline [--file X.hcpe] [--workers 0,1,2]
    python -m benchmarks.data wait --config configs/smoke-teacher.toml

`pipeline` times positions/s into ready tensors: `TeacherBatches` with each worker count against the
naive loop a user would write (per record: `board.set_hcp`, `make_input_features`, `make_move_label` into
preallocated arrays), alternating, several repetitions in one process, and prints the median with the
min..max spread and the ms per batch. Without `--file` it plays seeded random games for its positions.

`wait` trains the configured network for some steps with a minimal loop (no events or checkpoints) and
prints the share of step time spent waiting in `next_batch()`: what the `step` event's data-wait shows.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cshogi
import numpy as np
import torch
import torch.nn.functional as F
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_input_features, make_move_label

from tideborn.cliparser import OneLineParser
from tideborn.config.load import load_settings
from tideborn.data.formats.records import RECORD_DTYPES
from tideborn.errors import UserError, report_user_error
from tideborn.network.model import build_model
from tideborn.trainer.losses import policy_loss
from tideborn.trainer.state import teacher_batches


def random_game_records(count: int, seed: int = 0) -> np.ndarray:
    """hcpe records of `count` positions from seeded random games, each with the move played."""
    rng = random.Random(seed)
    records = np.zeros(count, dtype=RECORD_DTYPES["hcpe"])
    board, n = cshogi.Board(), 0
    while n < count:
        board.reset()
        for _ in range(rng.randint(20, 160)):
            moves = list(board.legal_moves)
            if not moves or n >= count:
                break
            move = rng.choice(moves)
            board.to_hcp(records["hcp"][n])
            records["bestMove16"][n] = np.uint16(cshogi.move16(move)).view(np.int16)
            records["gameResult"][n] = rng.choice((cshogi.BLACK_WIN, cshogi.WHITE_WIN))
            n += 1
            board.push(move)
    return records


def naive_positions_per_second(path: Path, batch_size: int, batches: int) -> float:
    """The loop from the issue: per record set_hcp, make_input_features, make_move_label, then tensors."""
    records = np.memmap(path, dtype=RECORD_DTYPES["hcpe"], mode="r")
    board = cshogi.Board()
    features1 = np.zeros((batch_size, FEATURES1_NUM, 9, 9), dtype=np.float32)
    features2 = np.zeros((batch_size, FEATURES2_NUM, 9, 9), dtype=np.float32)
    labels = np.zeros(batch_size, dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(records))
    started = time.perf_counter()
    for b in range(batches):
        chunk = records[np.sort(order[b * batch_size:(b + 1) * batch_size])]
        for i, hcpe in enumerate(chunk):
            board.set_hcp(hcpe["hcp"])
            make_input_features(board, features1[i], features2[i])
            labels[i] = make_move_label(board.move_from_move16(int(hcpe["bestMove16"]) & 0xFFFF), board.turn)
        ready = (torch.from_numpy(features1), torch.from_numpy(features2), torch.from_numpy(labels))
        del ready
    return batches * batch_size / (time.perf_counter() - started)


def pipeline_positions_per_second(path: Path, workers: int, batch_size: int, batches: int,
                                  device: torch.device, seed: int) -> float:
    settings = load_settings(None, [f"data.train={[str(path)]!r}".replace("'", '"'), f"data.workers={workers}",
                                    f"optim.batch_size={batch_size}", f"runtime.seed={seed}",
                                    "data.prefetch_batches=4"], environ={}).settings
    with teacher_batches(settings, device) as data:
        data.next_batch()  # worker start-up is not throughput
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        positions = 0
        for _ in range(batches):
            positions += len(data.next_batch())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return positions / (time.perf_counter() - started)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):9,.0f} pos/s  ({min(values):,.0f}..{max(values):,.0f})"


def command_pipeline(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    worker_counts = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        path = args.file
        if path is None:
            path = Path(scratch) / "random.hcpe"
            random_game_records(args.positions).tofile(path)
        records = path.stat().st_size // RECORD_DTYPES["hcpe"].itemsize
        batches = min(args.batches, max(1, records // args.batch_size - 1))
        print(f"{records:,} positions in {path}; batches of {args.batch_size}, {batches} timed batches per run, "
              f"{args.repeats} repetitions alternating; device {device}; torch threads {torch.get_num_threads()}")
        results: dict[str, list[float]] = {"naive loop": []}
        results.update({f"pipeline, {w} worker{'s' if w != 1 else ''}": [] for w in worker_counts})
        for repeat in range(args.repeats):
            results["naive loop"].append(naive_positions_per_second(path, args.batch_size, batches))
            for w in worker_counts:
                results[f"pipeline, {w} worker{'s' if w != 1 else ''}"].append(
                    pipeline_positions_per_second(path, w, args.batch_size, batches, device, seed=repeat))
    naive = statistics.median(results["naive loop"])
    for name, values in results.items():
        ms = 1000 * args.batch_size / statistics.median(values)
        print(f"{name:22s} {_spread(values)}  {ms:6.1f} ms/batch  x{statistics.median(values) / naive:.2f} naive")
    return 0


def command_wait(args: argparse.Namespace) -> int:
    resolved = load_settings(args.config, args.overrides)
    settings = resolved.settings
    device = torch.device(args.device)
    if settings.runtime.threads:
        torch.set_num_threads(settings.runtime.threads)  # as the trainer does
    torch.manual_seed(settings.runtime.seed)
    model = build_model(settings.model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.optim.lr, momentum=settings.optim.momentum)
    waits, totals = [], []
    with teacher_batches(settings, device) as data:
        for step in range(args.warmup + args.steps):
            started = time.perf_counter()
            batch = data.next_batch()
            waited = time.perf_counter() - started
            policy_logits, value_logit = model(batch.features1, batch.features2)
            loss = policy_loss(policy_logits, batch) + \
                F.binary_cross_entropy_with_logits(value_logit.float(), batch.value)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step >= args.warmup:
                waits.append(waited)
                totals.append(time.perf_counter() - started)
    share = sum(waits) / sum(totals)
    print(f"{args.steps} steps of {settings.optim.micro_batch_size} on {device}, {torch.get_num_threads()} threads "
          f"({settings.model.blocks}x{settings.model.channels}, data.workers={settings.data.workers}): "
          f"{1000 * statistics.median(totals):.1f} ms/step median, data wait {1000 * statistics.median(waits):.2f} ms "
          f"median, {100 * share:.1f}% of step time")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    pipeline = sub.add_parser("pipeline", help="positions/s of the pipeline against the naive loop")
    pipeline.add_argument("--file", type=Path, help="hcpe file to read (default: random games, --positions)")
    pipeline.add_argument("--positions", type=int, default=20000)
    pipeline.add_argument("--batch-size", type=int, default=1024)
    pipeline.add_argument("--batches", type=int, default=8, help="timed batches per run")
    pipeline.add_argument("--repeats", type=int, default=3)
    pipeline.add_argument("--workers", default="0,1,2", help="worker counts to time, comma-separated")
    pipeline.add_argument("--device", default="cpu", help="where the tensors must end up (cpu, cuda)")
    wait = sub.add_parser("wait", help="share of step time spent waiting for data in a minimal loop")
    wait.add_argument("--config", required=True)
    wait.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    wait.add_argument("--steps", type=int, default=100)
    wait.add_argument("--warmup", type=int, default=5)
    wait.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    try:
        return {"pipeline": command_pipeline, "wait": command_wait}[args.command](args)
    except UserError as exc:
        return report_user_error(exc, "bench_data")


if __name__ == "__main__":
    sys.exit(main())
