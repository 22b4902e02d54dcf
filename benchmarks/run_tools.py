"""Run-tool figures (never pass/fail): `python -m benchmarks.run_tools`.

1. `train_run status` on a run directory with many `step` events and a large train.log: wall time and
   peak memory of the real command in a fresh process, several repetitions.
2. `train_run watch` latency: a writer appends events, each stamped with its write time, while a real
   `watch` process follows the directory; the delay from write to the line arriving on watch's stdout.
No torch is imported here or in the measured processes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tideborn.rundir.events import EventWriter, encode_event
from tideborn.rundir.kinds import RunStarted, Step

TOOL = [sys.executable, "-m", "tideborn.tools.train_run"]


def make_run_dir(run_dir: Path, steps: int, log_bytes: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    now = time.time() - steps * 0.01
    with open(run_dir / "events.jsonl", "wb") as out:
        out.write(encode_event("run_started", {"step": 0, "max_steps": steps * 2, "pid": 1, "host": "elsewhere",
                                               "settings": {}, "world_size": 1}, now))
        chunk = []
        for step in range(1, steps + 1):
            chunk.append(encode_event("step", {"step": step, "loss": 3.0 + 1 / step, "policy_loss": 2.5,
                                               "value_loss": 0.5, "lr": 0.1, "grad_norm": 1.0,
                                               "positions_per_second": 8000.0, "data_wait_seconds": 0.01,
                                               "compute_seconds": 1.0, "steps": 10}, now + step * 0.01))
            if len(chunk) == 10_000:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))
    line = b"step 123456/1000000 | loss 3.1234 (policy 2.5000, value 0.5000) | lr 1.00e-01 | 8,000 pos/s\n"
    block = line * (8 * 1024 * 1024 // len(line))
    with open(run_dir / "train.log", "wb") as out:
        written = 0
        while written < log_bytes:
            out.write(block)
            written += len(block)


def status_rep(run_dir: Path) -> tuple[float, float]:
    """(seconds, peak MiB) of one `status --json` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    result = subprocess.run([*TOOL, "status", "--out-dir", str(run_dir), "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode not in (0, 1):
        raise RuntimeError(result.stderr)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before) / 1024  # ru_maxrss is in KiB on Linux; the max over children so far


def watch_latencies(run_dir: Path, count: int, interval: float) -> list[float]:
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = EventWriter(run_dir / "events.jsonl")
    writer.emit(RunStarted, step=0, max_steps=10**9, pid=os.getpid(), host="bench", settings={}, world_size=1)
    watch = subprocess.Popen([*TOOL, "watch", "--out-dir", str(run_dir), "--follow-only", "--forever"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    selector = selectors.DefaultSelector()
    selector.register(watch.stdout, selectors.EVENT_READ)
    latencies: list[float] = []
    buffer = b""
    try:
        time.sleep(1.5)  # let watch start and reach the end of the file
        for step in range(1, count + 1):
            sent = time.time()
            writer.emit(Step, step=step, loss=1.0, sent=sent)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if selector.select(timeout=0.5):
                    buffer += os.read(watch.stdout.fileno(), 65536)
                    lines = buffer.split(b"\n")
                    buffer = lines.pop()
                    for line in lines:
                        event = json.loads(line)
                        if event.get("kind") == "step" and event.get("step") == step:
                            latencies.append(time.time() - event["sent"])
                    if len(latencies) == step:
                        break
            time.sleep(interval)
    finally:
        watch.kill()
        watch.wait()
        writer.close()
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_tools")
    parser.add_argument("--steps", type=int, default=2_000_000, help="step events in the big run directory")
    parser.add_argument("--log-gb", type=float, default=2.0, help="size of its train.log")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--events", type=int, default=300, help="events timed through watch")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big"
        started = time.perf_counter()
        make_run_dir(big, args.steps, int(args.log_gb * 2**30))
        size = (big / "events.jsonl").stat().st_size
        print(f"run directory: {args.steps:,} step events ({size / 2**20:,.0f} MiB), train.log "
              f"{(big / 'train.log').stat().st_size / 2**30:.1f} GiB (made in {time.perf_counter() - started:.0f} s)")
        reps = [status_rep(big) for _ in range(args.reps)]
        seconds = [r[0] for r in reps]
        print(f"status --json: median {statistics.median(seconds):.3f} s, min {min(seconds):.3f}, "
              f"max {max(seconds):.3f} ({args.reps} runs); peak memory of the status processes {reps[-1][1]:.0f} MiB")
        latencies = sorted(1000 * x for x in watch_latencies(Path(tmp) / "live", args.events, 0.02))
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(f"watch latency, write to printed line: median {statistics.median(latencies):.0f} ms, p99 {p99:.0f} ms, "
              f"max {latencies[-1]:.0f} ms ({len(latencies)} of {args.events} events seen)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
