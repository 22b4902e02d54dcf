"""Benchmarks that print figures (never pass/fail): `python -m benchmarks.train train-overhead`.

train-overhead runs the real trainer (events on, default checkpoint cadence) and a minimal hand-written
PyTorch loop on the same model, batch and synthetic data, alternating, several repetitions in one
process, and prints positions/s for both with their spread and the ratio of medians. It also times
writing one `step` event.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tideborn.config.load import load_settings
from tideborn.network.model import build_model
from tideborn.network.optim import build_optimizer, build_scheduler
from tideborn.rundir.events import EventWriter, read_events
from tideborn.rundir.kinds import Step
from tideborn.trainer.loop import Trainer, prepare
from tideborn.trainer.synthetic import SyntheticBatches


def _settings(args: argparse.Namespace, out_dir: Path):
    overrides = [
        f"runtime.out_dir={str(out_dir)!r}", f"runtime.max_steps={args.steps}", "runtime.progress=\"off\"",
        f"optim.batch_size={args.batch_size}", f"runtime.device={args.device!r}", "data.kind=\"synthetic\"",
    ]
    return load_settings(None, overrides, {"network": args.network}, environ={})


def trainer_rep(args: argparse.Namespace) -> tuple[float, float]:
    """Positions/s of the trainer's loop (checkpoint time excluded), and that run's checkpoint seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        prepared = prepare(_settings(args, out), argv=["bench"])
        assert prepared is not None
        trainer = Trainer(prepared)
        code = trainer.run()
        if code != 0:
            raise RuntimeError(f"trainer exited with {code}")
        events = read_events(out / "events.jsonl")
    first = next(e for e in events if e["kind"] == "run_started")["time"]
    last = next(e for e in events if e["kind"] in ("run_finished", "run_stopped"))["time"]
    saves = sum(e["seconds"] for e in events if e["kind"] == "checkpoint_saved")
    loop_seconds = last - first - saves
    return args.steps * args.batch_size / loop_seconds, saves


def handwritten_rep(args: argparse.Namespace) -> float:
    """The loop a user would write by hand: same model, optimizer, schedule, data and losses; nothing else."""
    settings = _settings(args, Path(tempfile.gettempdir()) / "unused").settings
    device = torch.device(args.device)
    torch.manual_seed(settings.runtime.seed)
    model = build_model(settings.model).to(device)
    optimizer = build_optimizer(model, settings.optim)
    scheduler = build_scheduler(optimizer, settings.optim, settings.runtime.max_steps)
    data = SyntheticBatches(settings.runtime.seed, settings.optim.batch_size, device)
    model.train()
    started = time.perf_counter()
    for _ in range(args.steps):
        batch = data.next_batch()
        policy_logits, value_logit = model(batch.features1, batch.features2)
        loss = F.cross_entropy(policy_logits, batch.policy) + \
            F.binary_cross_entropy_with_logits(value_logit, batch.value)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    loss.item()
    return args.steps * args.batch_size / (time.perf_counter() - started)


def event_write_microseconds(count: int = 20_000) -> float:
    record = {"step": 123456, "loss": 7.123456, "policy_loss": 6.5, "value_loss": 0.62, "grad_norm": 1.5,
              "lr": 0.1, "positions_per_second": 12345.6, "data_wait_seconds": 0.01,
              "compute_seconds": 2.0, "steps": 10}
    with tempfile.TemporaryDirectory() as tmp, EventWriter(Path(tmp) / "events.jsonl") as writer:
        started = time.perf_counter()
        for _ in range(count):
            writer.emit(Step, **record)
        return (time.perf_counter() - started) / count * 1e6


def _spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):>10,.1f}  min {min(values):>10,.1f}  "
            f"max {max(values):>10,.1f}")


def train_overhead(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"train-overhead: network {args.network}, batch {args.batch_size}, {args.steps} steps per rep, "
          f"{args.reps} reps each, alternating, device {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    trainer_rep(args), handwritten_rep(args)  # warm-up: allocator, kernels, first-import costs
    trainer, handwritten, saves = [], [], []
    for rep in range(args.reps):
        pos, save = trainer_rep(args)
        trainer.append(pos)
        saves.append(save)
        handwritten.append(handwritten_rep(args))
        print(f"  rep {rep + 1}: trainer {trainer[-1]:,.1f} pos/s, hand-written {handwritten[-1]:,.1f} pos/s",
              flush=True)
    ratio = statistics.median(trainer) / statistics.median(handwritten)
    ratios = [t / h for t, h in zip(trainer, handwritten)]
    save_seconds = statistics.median(saves)
    print(f"trainer       positions/s {_spread(trainer)}")
    print(f"hand-written  positions/s {_spread(handwritten)}")
    print(f"ratio (trainer / hand-written, medians) {ratio:.3f}; per-rep ratios "
          f"{min(ratios):.3f} .. {max(ratios):.3f}")
    step_seconds = args.batch_size / statistics.median(trainer)
    print(f"checkpoint save {save_seconds * 1000:.1f} ms (median); at the default cadence of one per 1000 "
          f"steps that is {save_seconds / (1000 * step_seconds) * 100:.2f}% of step time")
    micros = [event_write_microseconds() for _ in range(5)]
    print(f"event write (one `step` event, encode + os.write) microseconds {_spread(micros)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train")
    sub = parser.add_subparsers(dest="command", required=True)
    overhead = sub.add_parser("train-overhead", help="trainer vs a hand-written loop, positions/s")
    overhead.add_argument("--network", default="resnet5x64")
    overhead.add_argument("--batch-size", type=int, default=128)
    overhead.add_argument("--steps", type=int, default=40)
    overhead.add_argument("--reps", type=int, default=5)
    overhead.add_argument("--device", default="cpu")
    overhead.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    return train_overhead(args)


if __name__ == "__main__":
    sys.exit(main())
