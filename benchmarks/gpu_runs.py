"""The GPU check's real runs: whole `tideborn train` and `tideborn match` processes on the device.

Beside the step sweep of `benchmarks.gpu`, these answer what only a real run shows: the smoke config
trains; the teacher-data path keeps the production net fed (the share of step time spent waiting for data,
at the default and at more decoding workers); an hcpe3 run trains; a run stopped and resumed continues
the computation of one that never stopped (compared with the device's own run-to-run difference); and
`match` plays faster on the device than on the CPU. Each writes `NAME-train.log` and `NAME-events.jsonl`
into OUTDIR and returns its figures as a dict for results.json.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tideborn
from tideborn.rundir.events import read_events
from tideborn.rundir.layout import EVENTS_FILE

REPO_ROOT = Path(tideborn.__file__).resolve().parents[1]
SMOKE_CONFIG = REPO_ROOT / "configs" / "smoke.toml"
SAMPLE_GAMES = REPO_ROOT / "samples" / "games"

TEACHER_POSITIONS = 14_000
"""Positions of seeded random games for the teacher-data run (530 KB of hcpe)."""
CPU_TEACHER_SETS = ('data.kind="hcpe"', "data.test=[]", "optim.batch_size=64",
                    "runtime.max_steps=60", "runtime.log_every=10", "runtime.checkpoint_every=30", "runtime.threads=0")
"""On the CPU, on top of configs/smoke.toml: the real teacher path (decoding workers) for 60 steps of the small
net at the smoke config's batch, which is all a CPU can take in a check (the step's cost grows with the batch;
the path through the workers is the same at any batch)."""
CUDA_TEACHER_SETS = ('data.kind="hcpe"', "data.test=[]", 'run.network="resnet10x192"', "optim.batch_size=1024",
                     "runtime.max_steps=120", "runtime.log_every=10", "runtime.checkpoint_every=60",
                     "runtime.threads=0", "runtime.gpu_event_seconds=1")
"""On CUDA: the production net and batch of configs/rtx4070ti.toml (10x192, 1024) for 120 steps, so that the
share of time waiting for data is the one a real run would see; a `gpu` event every second, so that NVML is
read while the GPU trains (the default 10 s outlasts these runs: their only event was read at step 0)."""


def teacher_sets(device: str) -> tuple[str, ...]:
    return CUDA_TEACHER_SETS if device == "cuda" else CPU_TEACHER_SETS


def teacher_data_missing() -> str | None:
    """Why the teacher-data path cannot run here (None when it can): cshogi or numba (the decoder's compiled loop)
    not installed, or a wheel built for another numpy."""
    for name in ("cshogi", "numba"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed here (carry its wheel to run the teacher-data path)"
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"{name} does not import here: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
    return None


def smoke_run(device: str, out: Path, timeout_seconds: float) -> dict:
    """`tideborn train --config configs/smoke.toml` on `device`, as a separate process; its figures."""
    return training_run("smoke", device, out, (), timeout_seconds)


def teacher_run(device: str, out: Path, timeout_seconds: float, workers: int | None = None, name: str = "teacher",
                keep_run_dir: Path | None = None, extra_sets: tuple[str, ...] = ()) -> dict:
    """The teacher-format data path (random-play hcpe records) with `workers` decoding processes (None: the
    default of `data.workers`); skipped, and said so, where cshogi is not installed (stock PyTorch images
    lack it). `keep_run_dir` keeps the run directory (its checkpoints) there."""
    if missing := teacher_data_missing():
        return {"skipped": missing}
    from benchmarks.data import random_game_records  # imports cshogi

    with tempfile.TemporaryDirectory(prefix="tideborn-teacher-data-") as scratch:
        data = Path(scratch) / "random-play.hcpe"
        generated = random_game_records(TEACHER_POSITIONS, seed=0)
        generated.tofile(data)
        sets = [*teacher_sets(device), f"data.train=[{json.dumps(str(data))}]"]
        if workers is not None:
            sets.append(f"data.workers={workers}")
        sets += extra_sets
        result = training_run(name, device, out, tuple(sets), timeout_seconds, keep_run_dir)
    result.update(records=len(generated), workers=workers if workers is not None else default_workers())
    return result


def default_workers() -> int:
    from tideborn.config.schema import DataSettings

    return DataSettings().workers


def teacher_workers_runs(device: str, out: Path, worker_counts: tuple[int, ...], timeout_seconds: float,
                         keep_run_dir: Path | None = None) -> list[dict]:
    """The teacher run at each worker count, the default first (kept in `keep_run_dir`); it stops adding
    workers once the data wait is under 5% of step time."""
    runs = []
    for index, workers in enumerate(worker_counts):
        run = teacher_run(device, out, timeout_seconds, workers, name=f"teacher-w{workers}",
                          keep_run_dir=keep_run_dir if index == 0 else None)
        runs.append(run)
        print(describe_run(f"teacher-data run, {workers} worker(s)", run), flush=True)
        wait = run.get("data_wait_fraction")
        if run.get("skipped") or wait is None or wait < 0.05:
            break
    return runs


def hcpe3_run(device: str, out: Path, timeout_seconds: float, copies: int = 4) -> dict:
    """hcpe3 self-play-format data (the shipped sample games, written as hcpe3 with made-up visit counts,
    `copies` times) through the trainer at the teacher run's net and batch: the first open builds the
    positions cache inside the run."""
    if missing := teacher_data_missing():
        return {"skipped": missing}
    from benchmarks.hcpe3_file import write_hcpe3_from_games  # imports cshogi

    with tempfile.TemporaryDirectory(prefix="tideborn-hcpe3-data-") as scratch:
        data = Path(scratch) / "selfplay.hcpe3"
        summary = write_hcpe3_from_games([SAMPLE_GAMES], data, copies=copies)
        sets = [s for s in teacher_sets(device) if not s.startswith("data.kind")]
        sets += ['data.kind="auto"', f"data.train=[{json.dumps(str(data))}]"]
        result = training_run("hcpe3", device, out, tuple(sets), timeout_seconds)
    result.update(games=summary.games, moves=summary.moves, with_candidates=summary.with_candidates)
    return result


RESUME_SETS = ("runtime.log_every=1", "runtime.checkpoint_every=10", "runtime.keep_checkpoints=5",
               "runtime.deterministic=true")
"""Deterministic kernels: with cuDNN's autotuning two CUDA processes can pick different kernels and differ
from the second step on, which says nothing about resume; deterministic runs must agree bit for bit."""
CPU_RESUME_SETS = ("optim.batch_size=16",)
"""On the CPU, a quarter of the smoke batch: what resume must carry over (weights, optimizer, schedule, RNG
states, data cursor) is the same at any batch, and the four runs' steps are most of their time after start-up."""


def resume_check(device: str, out: Path, timeout_seconds: float, steps: int = 40) -> dict:
    """Three smoke runs of `steps` steps with `runtime.deterministic`: two that never stop (do two runs agree at
    all?) and one stopped at half way (`--stop-at-step`) and resumed (`train` picks up the newest checkpoint).
    Their losses step by step and final weights are compared: exact is bit for bit; `within_device_noise`
    means the resumed run is as close to the straight one as two straight runs are to each other (within
    10x)."""
    half = steps // 2
    sets = (*RESUME_SETS, *(CPU_RESUME_SETS if device == "cpu" else ()), f"runtime.max_steps={steps}")
    with tempfile.TemporaryDirectory(prefix="tideborn-resume-") as scratch:
        runs = {}
        for name in ("straight-a", "straight-b"):
            runs[name] = training_run(f"resume-{name}", device, out, sets, timeout_seconds,
                                      keep_run_dir=Path(scratch) / name)
        resumed_dir = Path(scratch) / "resumed"
        runs["first-half"] = training_run("resume-first-half", device, out, sets, timeout_seconds,
                                          keep_run_dir=resumed_dir, extra_args=("--stop-at-step", str(half)))
        runs["resumed"] = training_run("resume-second-half", device, out, sets, timeout_seconds,
                                       keep_run_dir=resumed_dir, fresh=False)
        a, b, resumed = (losses_by_step(Path(scratch) / n) for n in ("straight-a", "straight-b", "resumed"))
        weights = {name: final_weights(Path(scratch) / name, steps) for name in ("straight-a", "straight-b", "resumed")}
    result = {
        "steps": steps, "resumed_at": half,
        "runs": {name: {k: run.get(k) for k in ("exit_code", "terminal", "steps", "seconds", "error")}
                 for name, run in runs.items()},
        "straight_vs_straight": compare(a, b, weights["straight-a"], weights["straight-b"]),
        "resumed_vs_straight": compare(a, resumed, weights["straight-a"], weights["resumed"]),
    }
    same = result["resumed_vs_straight"]
    noise = result["straight_vs_straight"]
    result["exact"] = bool(same["steps_compared"] == steps and same["identical"])
    result["within_device_noise"] = bool(
        same["steps_compared"] == steps
        and same["max_loss_difference"] <= max(noise["max_loss_difference"], 0.0) * 10 + 1e-9)
    return result


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """Every logged step's loss over all the attempts in `run_dir` (a resumed run appends to the stream)."""
    if not (run_dir / EVENTS_FILE).exists():
        return {}
    return {e["step"]: float(e["loss"]) for e in read_events(run_dir / EVENTS_FILE) if e["kind"] == "step"}


def final_weights(run_dir: Path, step: int):
    import torch

    path = run_dir / f"step-{step:09d}.pt"
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def compare(first: dict[int, float], second: dict[int, float], weights_a, weights_b) -> dict:

    steps = sorted(set(first) & set(second))
    differences = [abs(first[s] - second[s]) for s in steps
                   if not (math.isnan(first[s]) and math.isnan(second[s]))]
    weight_difference = None
    if weights_a is not None and weights_b is not None:
        weight_difference = max((float((weights_a[k].double() - weights_b[k].double()).abs().max())
                                 for k in weights_a if weights_a[k].is_floating_point()), default=0.0)
    identical = bool(steps) and all(first[s] == second[s] for s in steps) and weight_difference == 0.0
    return {"steps_compared": len(steps), "max_loss_difference": max(differences, default=0.0),
            "max_weight_difference": weight_difference, "identical": identical}


def match_speed(checkpoints: tuple[Path, Path], out: Path, devices: tuple[str, ...], games: int,
                max_moves: int, timeout_seconds: float) -> dict:
    """`tideborn match A B --json` on each device with the same games, openings and plies: games per second
    of play (the networks' load excluded, as `match` reports it)."""
    if missing := teacher_data_missing():
        return {"skipped": missing}
    result: dict = {"games": games, "max_moves": max_moves, "checkpoints": [str(p) for p in checkpoints]}
    for device in devices:
        command = [sys.executable, "-m", "tideborn.cli", "match", *map(str, checkpoints), "--games", str(games),
                   "--parallel", str(games), "--max-moves", str(max_moves), "--device", device, "--json"]
        log_path = out / f"match-{device}-{games}.log"
        try:
            done = subprocess.run(command, cwd=out, env=child_env(), capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            result[device] = {"error": f"killed after {timeout_seconds:.0f} s"}
            continue
        log_path.write_text(done.stderr + done.stdout)
        if done.returncode != 0:
            result[device] = {"error": f"exit status {done.returncode}: {done.stderr.strip()[-300:]}"}
            continue
        report = json.loads(done.stdout)
        result[device] = {k: report[k] for k in ("games_per_second", "seconds", "moves", "threads", "device")}
    rates = [result.get(d, {}).get("games_per_second") for d in devices]
    if len(devices) == 2 and all(rates) and rates[1]:
        result["ratio"] = rates[0] / rates[1]
    return result


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TIDEBORN_PROJECT_FILE", "WORLD_SIZE", "RANK")}
    # The same tideborn as this process, installed or not (the run starts in OUTDIR, not the checkout).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def training_run(name: str, device: str, out: Path, overrides: tuple[str, ...], timeout_seconds: float,
                 keep_run_dir: Path | None = None, fresh: bool = True, extra_args: tuple[str, ...] = ()) -> dict:
    """A real `tideborn train` process in a temporary run directory (or `keep_run_dir`). OUTDIR keeps only its
    log and event stream (NAME-train.log, NAME-events.jsonl): few, flat files, as a borrowed machine hands
    back."""
    if keep_run_dir is not None:
        return _training_run(name, device, out, keep_run_dir, overrides, timeout_seconds, fresh, extra_args)
    with tempfile.TemporaryDirectory(prefix=f"tideborn-{name}-") as scratch:
        return _training_run(name, device, out, Path(scratch) / "run", overrides, timeout_seconds, fresh,
                             extra_args)


def _training_run(name: str, device: str, out: Path, run_dir: Path, overrides: tuple[str, ...],
                  timeout_seconds: float, fresh: bool, extra_args: tuple[str, ...]) -> dict:
    command = [sys.executable, "-m", "tideborn.cli", "train", "--config", str(SMOKE_CONFIG),
               "--set", f'runtime.device="{device}"', "--set", f"runtime.out_dir={json.dumps(str(run_dir))}",
               "--set", 'runtime.progress="plain"']
    if fresh:
        command.append("--fresh")
    command += extra_args
    for item in overrides:
        command += ["--set", item]
    started = time.perf_counter()
    log_path, events_path = out / f"{name}-train.log", out / f"{name}-events.jsonl"
    result: dict = {"command": command, "log": str(log_path)}
    with open(log_path, "wb") as log:
        try:
            code = subprocess.run(command, cwd=out, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
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
    # A resumed run appends to the stream: its own attempt starts at its last run_started.
    starts = [i for i, e in enumerate(events) if e["kind"] == "run_started"]
    events = events[starts[-1]:] if starts else events
    steps = [e for e in events if e["kind"] == "step"]
    started_event = events[0] if starts else {}
    terminal = [e["kind"] for e in events if e["kind"] in ("run_finished", "run_stopped", "run_failed")]
    later = steps[1:] or steps  # the first window holds start-up (worker start, cuDNN's search)
    wait = sum(e["data_wait_seconds"] for e in later)
    busy = wait + sum(e["compute_seconds"] for e in later)
    rates = [e["positions_per_second"] for e in later]
    result.update(device_used=started_event.get("device"), terminal=terminal[-1] if terminal else None,
                  steps=steps[-1]["step"] if steps else 0,
                  first_loss=steps[0]["loss"] if steps else None, final_loss=steps[-1]["loss"] if steps else None,
                  positions_per_second=steps[-1]["positions_per_second"] if steps else None,
                  positions_per_second_median=sorted(rates)[len(rates) // 2] if rates else None,
                  data_wait_fraction=wait / busy if busy > 0 else None,
                  gpu_events=sum(e["kind"] == "gpu" for e in events),
                  # NVML's figures, if any: the last event (the first is read before the first step)
                  gpu_event=next((e for e in reversed(events) if e["kind"] == "gpu"), None))
    return result


def describe_run(label: str, run: dict) -> str:
    if run.get("skipped"):
        return f"{label}: skipped: {run['skipped']}"
    wait = f", data wait {run['data_wait_fraction']:.1%}" if run.get("data_wait_fraction") is not None else ""
    rate = (f", {run['positions_per_second_median']:,.0f} pos/s" if run.get("positions_per_second_median")
            else "")
    return (f"{label}: exit {run['exit_code']}, {run['terminal']}, {run['steps']} steps, last loss "
            f"{run['final_loss']}{rate}{wait}, {run['seconds']:.1f} s")


LOADER_BATCHES = 200
CPU_LOADER_BATCHES = 50
"""On the CPU a quarter of them: one combination runs there (no settings compared), for a rough figure and the
path itself, and decoding 1024 positions a batch is nearly all of its cost."""


def loader_speed(device: str, worker_counts: tuple[int, ...], batches: int | None = None,
                 batch_size: int = 1024) -> list[dict]:
    """The teacher loader alone (`TeacherBatches.next_batch`, no training) on the teacher run's records: batches
    per second at each worker count, with and without pinned memory on CUDA, and with the planes packed eight to
    a byte (the CUDA default) or not. Beside the teacher run's data wait, it tells a loader too slow for the step
    from one slowed by what runs beside it. `batches` are timed after ten of warm-up (default: LOADER_BATCHES, on
    the CPU CPU_LOADER_BATCHES)."""
    if missing := teacher_data_missing():
        return [{"skipped": missing}]
    import torch

    from benchmarks.data import random_game_records
    from tideborn.config.load import load_settings
    from tideborn.trainer.state import teacher_batches

    if batches is None:
        batches = LOADER_BATCHES if device == "cuda" else CPU_LOADER_BATCHES
    rows = []
    with tempfile.TemporaryDirectory(prefix="tideborn-loader-") as scratch:
        data = Path(scratch) / "random-play.hcpe"
        random_game_records(TEACHER_POSITIONS, seed=0).tofile(data)
        combinations = [(w, pinned, packed) for w in worker_counts for pinned in (True, False)
                        for packed in (True, False)] if device == "cuda" else [(w, False, False) for w in worker_counts]
        for workers, pinned, packed in combinations:
            sets = ['data.kind="hcpe"', "data.test=[]", f"data.train=[{json.dumps(str(data))}]",
                    f"data.workers={workers}", f"optim.batch_size={batch_size}", f'runtime.device="{device}"',
                    f"runtime.pin_memory={str(pinned).lower()}"]
            settings = load_settings(None, sets, {}, environ={}, cwd=Path(scratch)).settings
            loader = teacher_batches(settings, torch.device(device), pack_planes=packed)
            try:
                for _ in range(10):  # workers started, queues full
                    loader.next_batch()
                if device == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                for _ in range(batches):
                    batch = loader.next_batch()
                if device == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                del batch
            finally:
                loader.close()
            rows.append({"workers": workers, "pin_memory": pinned, "packed": packed, "batches": batches,
                         "batches_per_second": batches / seconds,
                         "positions_per_second": batches * batch_size / seconds})
            print(f"loader: {workers} worker(s), pin_memory {pinned}, packed {packed}: "
                  f"{batches / seconds:,.1f} batches/s", flush=True)
    return rows


def profile_match(checkpoints: tuple[Path, Path], out: Path, device: str, games: int, max_moves: int) -> str:
    """Where a match's time goes on `device` (cProfile of `run_match` in this process), top 30 by own time,
    written to OUTDIR/match-DEVICE-profile.txt; returns the file name."""
    import cProfile
    import io
    import pstats

    from tideborn.match.run import run_match

    profile = cProfile.Profile()
    profile.enable()
    run_match(checkpoints[0], checkpoints[1], games=games, parallel=games, max_moves=max_moves, device=device)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    path = out / f"match-{device}-profile.txt"
    path.write_text(text.getvalue())
    return path.name
