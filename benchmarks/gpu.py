"""GPU check: the smoke config on CUDA, then a training-throughput sweep of the fast-path switches.

`python -m benchmarks.gpu --out OUTDIR [--quick] [--peak-tflops N]` (scripts/gpu-check.sh
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
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

import tideborn
from benchmarks import gpu_runs
from benchmarks.gpu_report import render_markdown
from benchmarks.gpu_runs import describe_run, smoke_run
from tideborn.config.load import load_settings
from tideborn.config.schema import RuntimeSettings
from tideborn.network.model import build_model
from tideborn.trainer.device import resolve_device
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.state import TrainingState
from tideborn.trainer.summary import summarize_model

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
        # CUDA graphs: the launch cost off the host, which a profile of the small net's step found as busy as the GPU
        Variant("compile reduce-overhead", ("runtime.compile=true", 'runtime.compile_mode="reduce-overhead"'),
                middle_batch_only=True),
        # What the production configs add to the defaults (configs/rtx4070ti.toml: clipping and the weight
        # average), and the alternatives a user may pick: these run on CUDA nowhere else before a real run.
        Variant("clip + ema", ("optim.grad_clip_norm=10.0", "optim.ema_decay=0.9999"), middle_batch_only=True),
        Variant("adamw", ('optim.optimizer="adamw"',), middle_batch_only=True),
        Variant("fp16", ('runtime.precision="fp16"',), middle_batch_only=True),
        Variant("deterministic", ("runtime.deterministic=true",), middle_batch_only=True),
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


# -- one sweep configuration --------------------------------------------------------------------------

class PremadeBatches:
    """Cycles through a few batches already on the device: the step is timed, not the data generator."""

    def __init__(self, batches: list):
        self.batches, self.position = batches, 0
        self.record_draws = False
        """The step's hook for `runtime.ddp_diagnostics` (a digest of the batches drawn): nothing to record here."""
        self.drawn: list = []

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


def profile_step(model: str, batch_size: int, out: Path) -> str:
    """The CUDA kernels of ten default steps of `model` at `batch_size` (torch.profiler), top 40 by CUDA time,
    written to OUTDIR/profile-MODEL-BATCH.txt: where the step's time goes; returns the file name."""
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as workdir:
        state = build_state(model, batch_size, Variant("default"), "cuda", Path(workdir))
        try:
            for _ in range(5):
                state.train_step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    state.train_step()
                torch.cuda.synchronize()
        finally:
            state.close()
            release_memory()
    path = out / f"profile-{model}-{batch_size}.txt"
    path.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70))
    return path.name


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
    # torch also warns, once, that the debug mode is a prototype: that notice is no synchronisation
    return [str(w.message).strip().splitlines()[0] for w in caught
            if "synchroniz" in str(w.message) and "debug mode is a prototype" not in str(w.message)]


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


def describe_row(row: dict) -> str:
    head = f"{row['model']:<13} batch {row['batch_size']:>5}  {row['variant']:<20}"
    if row["status"] != "ok":
        return f"{head} {row['status']}: {row.get('reason') or row.get('error') or ''}"
    mfu = f"  MFU {row['mfu']:.1%}" if row["mfu"] is not None else ""
    memory = f"  peak {row['peak_memory_bytes'] / 2**30:.2f} GiB" if row["peak_memory_bytes"] is not None else ""
    return (f"{head} {row['positions_per_second']:>11,.0f} pos/s (min {row['min']:,.0f}, max {row['max']:,.0f})"
            f"{memory}{mfu}  first step {row['first_step_seconds']:.1f} s"
            + (f"  {len(row['host_syncs_per_step'])} host sync(s) in a step" if row["host_syncs_per_step"] else ""))


RUNS = ("smoke", "teacher", "hcpe3", "resume", "match", "loader", "profile")
TEACHER_WORKERS = (8,)
"""Worker counts tried after the default when the teacher run waits for data 5% of its step time or more."""
MATCH_GAMES, MATCH_PLIES = 100, 64


def real_runs(args: argparse.Namespace, plan: Plan, results: dict, save) -> None:
    """The whole-process runs of `gpu_runs`, in order, each saved as soon as it ends. Each gets a share of what
    is left of the budget, so that the sweep keeps its part."""
    chosen = args.runs or (RUNS if args.device == "cuda" else ("smoke", "teacher"))

    def timeout() -> float:
        # A quarter of what is left, so that the sweep keeps its part; no fixed cap, which a busy machine's runs
        # outgrew (the CPU form's runs beside CPU hogs took over 180 s with a budget of 1,500).
        return max(30.0, plan.left() / 4)

    with tempfile.TemporaryDirectory(prefix="tideborn-gpu-check-") as scratch:
        kept = Path(scratch) / "teacher-run"
        if "smoke" in chosen:
            results["smoke"] = smoke_run(args.device, args.out, timeout_seconds=timeout())
            print(describe_run("smoke run", results["smoke"]), flush=True)
            save()
        if "teacher" in chosen:
            default = gpu_runs.default_workers()
            counts = (default, *(w for w in TEACHER_WORKERS if w > default)) if args.device == "cuda" else (default,)
            runs = gpu_runs.teacher_workers_runs(args.device, args.out, counts, timeout(), keep_run_dir=kept)
            results["teacher"], results["teacher_workers"] = runs[0], runs
            if args.device == "cuda":  # plain copies against pinned staging, at the default workers
                results["teacher_unpinned"] = gpu_runs.teacher_run(
                    args.device, args.out, timeout(), default, name=f"teacher-w{default}-unpinned",
                    extra_sets=("runtime.pin_memory=false",))
                print(describe_run("teacher-data run, pin_memory off", results["teacher_unpinned"]), flush=True)
            save()
        if "hcpe3" in chosen:
            results["hcpe3"] = gpu_runs.hcpe3_run(args.device, args.out, timeout())
            print(describe_run("hcpe3 run", results["hcpe3"]), flush=True)
            save()
        if "resume" in chosen:
            results["resume"] = gpu_runs.resume_check(args.device, args.out, timeout())
            print(f"resume check: exact {results['resume']['exact']}, within the device's run-to-run difference "
                  f"{results['resume']['within_device_noise']}", flush=True)
            save()
        if "match" in chosen:
            checkpoints = sorted(kept.glob("step-*.pt"))[-2:]
            if len(checkpoints) < 2:
                results["match"] = {"skipped": "the teacher run left no two checkpoints to play"}
            else:
                devices = ("cuda", "cpu") if args.device == "cuda" else ("cpu",)
                results["match"] = gpu_runs.match_speed((checkpoints[1], checkpoints[0]), args.out, devices,
                                                        MATCH_GAMES, MATCH_PLIES, timeout())
                if args.device == "cuda":
                    results["match_wide"] = gpu_runs.match_speed((checkpoints[1], checkpoints[0]), args.out, devices,
                                                                 MATCH_GAMES * 4, MATCH_PLIES, timeout())
                    results["match_profile"] = gpu_runs.profile_match((checkpoints[1], checkpoints[0]), args.out,
                                                                      "cuda", MATCH_GAMES, MATCH_PLIES)
            print(f"match: {results['match']}", flush=True)
            save()
        if "loader" in chosen:
            counts = (gpu_runs.default_workers(), 8) if args.device == "cuda" else (gpu_runs.default_workers(),)
            results["loader"] = gpu_runs.loader_speed(args.device, counts)
            save()
        if "profile" in chosen and args.device == "cuda":
            results["step_profile"] = profile_step("resnet10x192", 1024, args.out)
            save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--runs", nargs="+", choices=RUNS, metavar="RUN",
                        help=f"real training and match processes before the sweep, of {', '.join(RUNS)} "
                             f"(default: all on cuda; smoke and teacher on cpu)")
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
    results: dict = {"tool": "benchmarks.gpu", "tideborn": tideborn.__version__, "quick": args.quick,
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
            real_runs(args, plan, results, save)
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
