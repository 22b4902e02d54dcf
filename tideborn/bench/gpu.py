"""GPU check: the smoke config on CUDA, then a training-throughput sweep of the fast-path switches.

`python -m tideborn.bench.gpu --out OUTDIR [--quick] [--peak-tflops N]` (scripts/gpu-check.sh
runs it). It prints and writes figures, never pass/fail: OUTDIR/results.json and OUTDIR/results.md.

The smoke part is a real `tideborn train` process with `runtime.device="cuda"`. The sweep times the
trainer's own step, `TrainingState.train_step` (model, optimizer, autocast, channels_last and compile as
`train` builds them), fed from four synthetic batches made on the device beforehand, so it measures the
step and not data generation. Each configuration is timed after warm-up, synchronised, in several
repetitions (median, min, max); model FLOPs utilisation is positions/s x 3 x forward FLOPs per position
(`summarize_model`) over the GPU's dense bf16 peak. The sweep keeps to a time budget: the trainer's
defaults at every model and batch size first, then each switch flipped at one batch size, then the rest;
what does not fit is listed as skipped.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

import tideborn
from tideborn.bench.gpu_report import render_markdown
from tideborn.config import load_settings
from tideborn.config.schema import RuntimeSettings
from tideborn.rundir import EVENTS_FILE
from tideborn.rundir.events import read_events
from tideborn.trainer.device import resolve_device
from tideborn.trainer.model import build_model
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.state import TrainingState
from tideborn.trainer.summary import summarize_model

SMOKE_CONFIG = Path(tideborn.__file__).resolve().parents[1] / "configs" / "smoke.toml"

PEAK_BF16_DENSE_FLOPS = (
    # (part of torch.cuda.get_device_name, dense bf16 tensor FLOP/s with fp32 accumulation, no sparsity).
    # First match wins, so the more specific names come first.
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
    ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12), ("A10", 125e12), ("L4", 121e12),
    ("RTX 4090", 165e12),
    # GeForce cards run bf16 with fp32 accumulation at half their fp16-accumulate rate: the RTX 4070 Ti's
    # often-quoted ~160 TFLOPS is fp16 with fp16 accumulation (60 SMs x 2.61 GHz x 1024); bf16 is half.
    ("RTX 4070 Ti SUPER", 88e12), ("RTX 4070 Ti", 80e12), ("RTX 3090", 71e12),
)

FULL_BATCH_SIZES = (256, 1024, 2048)
FULL_MODELS = ("resnet10x192", "resnet20x256")
CPU_MODELS = ("resnet2x32",)
CPU_BATCH_SIZES = (32,)
PREMADE_BATCHES = 4


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...] = ()
    """`--set` items on top of the trainer's defaults."""
    devices: tuple[str, ...] = ("cuda",)
    middle_batch_only: bool = False
    """Run at the middle batch size only (settings that change the step's cost little, checked once)."""


def variants() -> tuple[Variant, ...]:
    """The trainer's defaults, and each fast-path switch flipped from its default one at a time."""
    defaults = RuntimeSettings()

    def flip(switch: str) -> Variant:
        on = getattr(defaults, switch)
        return Variant(f"{'no ' if on else ''}{switch}", (f"runtime.{switch}={str(not on).lower()}",))

    return (
        Variant("default", devices=("cuda", "cpu")),
        Variant("fp32", ('runtime.precision="fp32"',)),
        Variant("fp32, no tf32", ('runtime.precision="fp32"', "runtime.tf32=false")),
        flip("tf32"), flip("channels_last"),
        flip("fused_optimizer"),
        flip("compile"),
        # What the production configs add to the defaults (configs/rtx4070ti.toml: clipping and the weight
        # average), and the alternatives a user may pick: these run on CUDA nowhere else before a real run.
        Variant("clip + ema", ("optim.grad_clip_norm=10.0", "optim.ema_decay=0.9999"), middle_batch_only=True),
        Variant("adamw", ('optim.optimizer="adamw"',), middle_batch_only=True),
        Variant("fp16", ('runtime.precision="fp16"',), middle_batch_only=True),
        Variant("bf16", ('runtime.precision="bf16"',), devices=("cpu",)),
    )


@dataclass
class Plan:
    device: str
    models: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    reps: int
    warmup_steps: int
    rep_seconds: float
    budget_seconds: float
    variants: tuple[str, ...] = ()
    """Variant names to run beside `default` whatever the device (empty: those that apply to it)."""
    started: float = field(default_factory=time.perf_counter)

    def left(self) -> float:
        return self.budget_seconds - (time.perf_counter() - self.started)


def peak_flops(device_name: str) -> tuple[float | None, str]:
    for part, flops in PEAK_BF16_DENSE_FLOPS:
        if part.lower() in device_name.lower():
            return flops, f"table entry {part!r}"
    return None, "not in the table: pass --peak-tflops"


def device_info(device: str, peak_tflops: float | None) -> dict:
    info: dict = {"device": device, "torch": str(torch.__version__), "python": platform.python_version()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}", memory_bytes=props.total_memory,
                    cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        peak, source = peak_flops(props.name)
    else:
        info.update(name=platform.processor() or platform.machine(), threads=torch.get_num_threads())
        peak, source = None, "no peak for a CPU: pass --peak-tflops"
    if peak_tflops:
        peak, source = peak_tflops * 1e12, "--peak-tflops"
    info.update(peak_bf16_flops=peak, peak_source=source)
    return info


# -- the smoke runs -----------------------------------------------------------------------------------

TEACHER_POSITIONS = 14_000
"""Positions of seeded random games for the teacher-data run (530 KB of hcpe)."""
TEACHER_SETS = ('data.kind="hcpe"', "data.test=[]", "data.workers=2", "optim.batch_size=256",
                "runtime.max_steps=60", "runtime.log_every=10", "runtime.checkpoint_every=30", "runtime.threads=0")
"""On top of configs/smoke.toml: the real teacher path (decoding workers, pinned memory, copies that
overlap the step on CUDA) for 60 steps of the small net."""


def smoke_run(device: str, out: Path, timeout_seconds: float) -> dict:
    """`tideborn train --config configs/smoke.toml` on `device`, as a separate process; its figures."""
    return training_run("smoke", device, out, (), timeout_seconds)


def teacher_run(device: str, out: Path, timeout_seconds: float) -> dict:
    """The smoke config on teacher-format data (random-play hcpe records) with decoding workers; skipped,
    and said so, where cshogi is not installed (stock PyTorch images lack it)."""
    import importlib.util

    if importlib.util.find_spec("cshogi") is None:
        return {"skipped": "cshogi is not installed here (carry its wheel to run the teacher-data path)"}
    from tideborn.bench.data import random_game_records  # imports cshogi

    with tempfile.TemporaryDirectory(prefix="tideborn-teacher-data-") as scratch:
        data = Path(scratch) / "random-play.hcpe"
        generated = random_game_records(TEACHER_POSITIONS, seed=0)
        generated.tofile(data)
        records = len(generated)
        result = training_run("teacher", device, out,
                              (*TEACHER_SETS, f"data.train=[{json.dumps(str(data))}]"), timeout_seconds)
    result["records"] = records
    return result


def training_run(name: str, device: str, out: Path, overrides: tuple[str, ...], timeout_seconds: float) -> dict:
    """A real `tideborn train` process in a temporary run directory. OUTDIR keeps only its log and event
    stream (NAME-train.log, NAME-events.jsonl): few, flat files, as a borrowed machine hands back."""
    with tempfile.TemporaryDirectory(prefix=f"tideborn-{name}-") as scratch:
        return _training_run(name, device, out, Path(scratch) / "run", overrides, timeout_seconds)


def _training_run(name: str, device: str, out: Path, run_dir: Path, overrides: tuple[str, ...],
                  timeout_seconds: float) -> dict:
    command = [sys.executable, "-m", "tideborn.cli", "train", "--config", str(SMOKE_CONFIG), "--fresh",
               "--set", f'runtime.device="{device}"', "--set", f"runtime.out_dir={json.dumps(str(run_dir))}",
               "--set", 'runtime.progress="plain"']
    for item in overrides:
        command += ["--set", item]
    env = {k: v for k, v in os.environ.items() if k not in ("TIDEBORN_PROJECT_FILE", "WORLD_SIZE", "RANK")}
    # The same tideborn as this process, installed or not (the run starts in OUTDIR, not the checkout).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SMOKE_CONFIG.parents[1]), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    log_path, events_path = out / f"{name}-train.log", out / f"{name}-events.jsonl"
    result: dict = {"command": command, "log": str(log_path)}
    with open(log_path, "wb") as log:
        try:
            code = subprocess.run(command, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout_seconds).returncode
        except subprocess.TimeoutExpired:
            code = None
            result["error"] = f"killed after {timeout_seconds:.0f} s"
    result.update(exit_code=code, seconds=time.perf_counter() - started)
    events = []
    if (run_dir / EVENTS_FILE).exists():
        shutil.copyfile(run_dir / EVENTS_FILE, events_path)
        result["events"] = str(events_path)
        events = read_events(run_dir / EVENTS_FILE)
    steps = [e for e in events if e["kind"] == "step"]
    started_event = next((e for e in events if e["kind"] == "run_started"), {})
    terminal = [e["kind"] for e in events if e["kind"] in ("run_finished", "run_stopped", "run_failed")]
    later = steps[1:] or steps  # the first window holds start-up (worker start, cuDNN's search)
    wait = sum(e["data_wait_seconds"] for e in later)
    busy = wait + sum(e["compute_seconds"] for e in later)
    result.update(device_used=started_event.get("device"), terminal=terminal[-1] if terminal else None,
                  steps=steps[-1]["step"] if steps else 0,
                  first_loss=steps[0]["loss"] if steps else None, final_loss=steps[-1]["loss"] if steps else None,
                  positions_per_second=steps[-1]["positions_per_second"] if steps else None,
                  data_wait_fraction=wait / busy if busy > 0 else None,
                  gpu_event=next((e for e in events if e["kind"] == "gpu"), None))  # NVML's figures, if any
    return result


# -- one sweep configuration --------------------------------------------------------------------------

class PremadeBatches:
    """Cycles through a few batches already on the device: the step is timed, not the data generator."""

    def __init__(self, batches: list):
        self.batches, self.position = batches, 0

    def next_batch(self):
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch

    def close(self) -> None:
        self.batches = []


def build_state(model: str, batch_size: int, variant: Variant, device: str, workdir: Path) -> TrainingState:
    overrides = [f'runtime.device="{device}"', f"optim.batch_size={batch_size}", 'data.kind="synthetic"',
                 'runtime.progress="off"', *variant.overrides]
    settings = load_settings(None, overrides, {"network": model}, environ={}, cwd=workdir).settings
    state = TrainingState(settings, resolve_device(settings.runtime), DistEnv())
    state.restore(StartPoint())
    premade = [state.data.next_batch() for _ in range(PREMADE_BATCHES)]
    state.data.close()
    state.data = PremadeBatches(premade)
    return state


def measure(plan: Plan, model: str, batch_size: int, variant: Variant, flops_per_position: int,
            peak: float | None, workdir: Path) -> dict:
    cuda = plan.device == "cuda"

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize()

    last_loss: torch.Tensor | None = None

    def timed(steps: int) -> float:
        nonlocal last_loss
        synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            last_loss = state.train_step().losses[0]
        synchronize()
        return time.perf_counter() - started

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    state = build_state(model, batch_size, variant, plan.device, workdir)
    try:
        first_step_seconds = timed(1)  # includes torch.compile and cuDNN's algorithm search
        timed(plan.warmup_steps)
        syncs = host_syncs_in_one_step(state) if cuda else None
        per_step = timed(1)
        steps = max(1, min(200, round(plan.rep_seconds / max(per_step, 1e-6))))
        rates = [steps * batch_size / timed(steps) for _ in range(plan.reps)]
        loss = float(last_loss)
    finally:
        state.close()
    median = statistics.median(rates)
    return {
        "status": "ok", "positions_per_second": median, "min": min(rates), "max": max(rates), "reps": rates,
        "steps_per_rep": steps, "step_ms": batch_size / median * 1e3, "first_step_seconds": first_step_seconds,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "mfu": median * 3 * flops_per_position / peak if peak else None, "final_loss": loss,
        "host_syncs_per_step": syncs,
    }


def host_syncs_in_one_step(state: TrainingState) -> list[str]:
    """The operations that made the host wait for the GPU during one step (CUDA's sync debug mode);
    the step should have none, the logging that reads losses back happens outside it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            state.train_step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message).strip().splitlines()[0] for w in caught if "synchroniz" in str(w.message)]


def release_memory() -> None:
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the sweep ----------------------------------------------------------------------------------------

def schedule(plan: Plan) -> list[tuple[str, int, Variant]]:
    """Defaults everywhere first, then each switch at the middle batch size, then the rest."""
    if plan.variants:
        chosen = [v for v in variants() if v.name == "default" or v.name in plan.variants]
    else:
        chosen = [v for v in variants() if plan.device in v.devices]
    default, flips = chosen[0], chosen[1:]
    middle = plan.batch_sizes[len(plan.batch_sizes) // 2]
    order = [(m, b, default) for m in plan.models for b in plan.batch_sizes]
    order += [(m, middle, v) for m in plan.models for v in flips]
    order += [(m, b, v) for m in plan.models for b in plan.batch_sizes if b != middle for v in flips
              if not v.middle_batch_only]
    return order


def compiles(variant: Variant) -> bool:
    if "runtime.compile=true" in variant.overrides:
        return True
    return RuntimeSettings().compile and "runtime.compile=false" not in variant.overrides


def estimate_seconds(variant: Variant, seen: dict[bool, float]) -> float:
    """The slowest configuration of its kind so far (compiled or not) with a margin, or a first guess."""
    compiled = compiles(variant)
    return seen.get(compiled, 90.0 if compiled else 15.0)


def sweep(plan: Plan, results: dict, save) -> None:
    models = {}
    for name in plan.models:
        settings = load_settings(None, [], {"network": name}, environ={}).settings
        summary = summarize_model(build_model(settings.model))
        models[name] = {"blocks": settings.model.blocks, "channels": settings.model.channels,
                        "parameters": summary.total_parameters, "flops_per_position": summary.flops_per_position}
    results["models"] = models
    peak = results["device"]["peak_bf16_flops"]
    seen: dict[bool, float] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for model, batch_size, variant in schedule(plan):
            row = {"model": model, "batch_size": batch_size, "variant": variant.name,
                   "overrides": list(variant.overrides)}
            needed = estimate_seconds(variant, seen)
            started = time.perf_counter()
            if plan.left() < needed:
                row.update(status="skipped", reason=f"time budget: {plan.left():.0f} s left, ~{needed:.0f} s needed")
            else:
                try:
                    row.update(measure(plan, model, batch_size, variant, models[model]["flops_per_position"],
                                       peak, Path(workdir)))
                except torch.OutOfMemoryError:
                    row.update(status="oom")
                except Exception as exc:  # one failing configuration (no compiler for torch.compile, say) is recorded
                    text = str(exc).strip()
                    row.update(status="error", error=f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}",
                               traceback=traceback.format_exc(limit=8))
                finally:
                    release_memory()
                seen[compiles(variant)] = max(seen.get(compiles(variant), 0.0), (time.perf_counter() - started) * 1.2)
            results["sweep"].append(row)
            print(describe_row(row), flush=True)
            save()


def describe_run(label: str, run: dict) -> str:
    if run.get("skipped"):
        return f"{label}: skipped: {run['skipped']}"
    wait = f", data wait {run['data_wait_fraction']:.1%}" if run.get("data_wait_fraction") is not None else ""
    return (f"{label}: exit {run['exit_code']}, {run['terminal']}, {run['steps']} steps, last loss "
            f"{run['final_loss']}{wait}, {run['seconds']:.1f} s")


def describe_row(row: dict) -> str:
    head = f"{row['model']:<13} batch {row['batch_size']:>5}  {row['variant']:<20}"
    if row["status"] != "ok":
        return f"{head} {row['status']}: {row.get('reason') or row.get('error') or ''}"
    mfu = f"  MFU {row['mfu']:.1%}" if row["mfu"] is not None else ""
    memory = f"  peak {row['peak_memory_bytes'] / 2**30:.2f} GiB" if row["peak_memory_bytes"] is not None else ""
    return (f"{head} {row['positions_per_second']:>11,.0f} pos/s (min {row['min']:,.0f}, max {row['max']:,.0f})"
            f"{memory}{mfu}  first step {row['first_step_seconds']:.1f} s"
            + (f"  {len(row['host_syncs_per_step'])} host sync(s) in a step" if row["host_syncs_per_step"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tideborn.bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for results.json and results.md")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="one batch size, fewer and shorter repetitions")
    parser.add_argument("--models", nargs="+", help="networks to sweep (default: resnet10x192 resnet20x256; "
                                                    "on cpu resnet2x32)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, help="default: 256 1024 2048 (--quick: 1024)")
    parser.add_argument("--variants", nargs="+", default=[], metavar="NAME",
                        help=f"only these variants beside default, even where they change nothing: "
                             f"{', '.join(repr(v.name) for v in variants()[1:])}")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, overriding the table")
    parser.add_argument("--budget-seconds", type=float, default=400.0,
                        help="start no configuration that would end past this, smoke run included (default 400)")
    parser.add_argument("--skip-smoke", action="store_true", help="only the sweep")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: error: CUDA is not available (no GPU, or a CPU build of torch); "
              "--device cpu runs the small CPU version", file=sys.stderr)
        return 2
    cpu = args.device == "cpu"
    plan = Plan(args.device, tuple(args.models or (CPU_MODELS if cpu else FULL_MODELS)),
                tuple(args.batch_sizes or (CPU_BATCH_SIZES if cpu else (1024,) if args.quick else FULL_BATCH_SIZES)),
                reps=3 if args.quick else 5, warmup_steps=2 if args.quick else 3,
                rep_seconds=0.15 if args.quick else 0.3, budget_seconds=args.budget_seconds,
                variants=tuple(args.variants))
    unknown = sorted(set(plan.variants) - {v.name for v in variants()})
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"tool": "tideborn.bench.gpu", "tideborn": tideborn.__version__, "quick": args.quick,
                     "started_at": time.time(), "device": device_info(args.device, args.peak_tflops),
                     "smoke": None, "teacher": None, "models": {}, "sweep": [], "finished": False}

    def save() -> None:
        results["seconds"] = time.perf_counter() - plan.started
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "results.md").write_text(render_markdown(results))

    print(f"bench_gpu: {results['device']['name']} ({args.device}), torch {torch.__version__}, "
          f"budget {plan.budget_seconds:.0f} s, results in {args.out}", flush=True)
    try:
        if not args.skip_smoke:
            results["smoke"] = smoke_run(args.device, args.out, timeout_seconds=min(180.0, plan.left() / 3))
            print(describe_run("smoke run", results["smoke"]), flush=True)
            save()
            results["teacher"] = teacher_run(args.device, args.out, timeout_seconds=min(180.0, plan.left() / 3))
            print(describe_run("teacher-data run", results["teacher"]), flush=True)
            save()
        sweep(plan, results, save)
        results["finished"] = True
    except KeyboardInterrupt:
        results["interrupted"] = True
        print("bench_gpu: interrupted; partial results written", file=sys.stderr)
    finally:
        save()
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'} in {results['seconds']:.0f} s")
    return 0 if results["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
