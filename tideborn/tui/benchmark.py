"""Benchmark of tideborn-tui on a long run (figures, never pass/fail): `python -m tideborn.tui.benchmark`.

Writes a run directory with N step events (default two million, about 700 MB), then starts the TUI in
a fresh process (headless, 200x50: everything is laid out and rendered, nothing is written to a
terminal) and reports: time from launch to the first screen with a curve (the tail of the run), to
the full curve (the whole history, read by a worker), the redraw time of the plot over all points,
peak memory (max RSS), and the TUI process's CPU use while a writer appends 20 step events/s.
No torch.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STEP_LINE = ('{{"v":1,"time":{time:.3f},"kind":"step","step":{step},"loss":{loss:.6f},"policy_loss":{policy:.6f},'
             '"value_loss":{value:.6f},"grad_norm":1.2345,"lr":0.0123456,"positions_per_second":41234.5,'
             '"data_wait_seconds":0.0012,"compute_seconds":0.2468,"steps":1}}\n')


def step_line(step: int, when: float) -> str:
    policy = 6.0 * math.exp(-step / 400_000) + 1.5 + 0.05 * math.sin(step * 0.01)
    value = 0.6 - 0.1 * (1 - math.exp(-step / 600_000))
    return STEP_LINE.format(time=when, step=step, loss=policy + value, policy=policy, value=value)


def write_run(run_dir: Path, steps: int) -> float:
    """A finished-looking run of `steps` step events (checkpoints every 10,000); returns its size in MB."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time() - steps * 0.2
    head = {"v": 1, "time": start, "kind": "run_started", "step": 0, "device": "cpu, fp32", "max_steps": steps * 2,
            "batch_size": 4096, "pid": 1, "host": "bench-host", "resumed_from": None,
            "settings": {"runtime": {"device": "cpu"}}}
    with open(run_dir / "events.jsonl", "w", encoding="utf-8") as handle:
        handle.write(json.dumps(head) + "\n")
        chunk = []
        for step in range(1, steps + 1):
            chunk.append(step_line(step, start + step * 0.2))
            if step % 10_000 == 0:
                chunk.append(json.dumps({"v": 1, "time": start + step * 0.2, "kind": "checkpoint_saved",
                                         "step": step, "path": f"step-{step:09d}.pt", "bytes": 1, "seconds": 0.1})
                             + "\n")
            if len(chunk) >= 50_000:
                handle.write("".join(chunk))
                chunk.clear()
        handle.write("".join(chunk))
    (run_dir / "train.log").write_text("benchmark run\n")
    return (run_dir / "events.jsonl").stat().st_size / 1e6


def child(run_dir: Path, launched_at: float, follow_seconds: float, result_path: Path) -> None:
    """Runs in the measured process: the TUI on `run_dir`, headless at 200x50."""
    import psutil

    from tideborn.tui.app import create_app
    from tideborn.tui.options import TuiOptions

    figures: dict = {"imported_at": time.time() - launched_at}
    app = create_app(TuiOptions(run_dir=run_dir, use_nvml=False))

    async def pilot_script(pilot) -> None:
        from tideborn.tui.screens.dashboard import DashboardScreen

        while not isinstance(pilot.app.screen, DashboardScreen):
            await pilot.pause(0.005)
        screen = pilot.app.screen
        while not screen.plot.drawn_points:
            await pilot.pause(0.005)
        figures["first_screen_seconds"] = time.time() - launched_at
        figures["first_screen_points"] = screen.plot.drawn_points
        while not (screen.ready.is_set() and screen.plot.drawn_points == screen.history.points()):
            await pilot.pause(0.005)
        figures["full_curve_seconds"] = time.time() - launched_at
        figures["full_curve_points"] = screen.history.points()
        figures["history_bytes"] = screen.history.nbytes
        redraws, cpu = [], []
        for _ in range(21):
            used = time.process_time()
            screen.plot.render()
            cpu.append(time.process_time() - used)
            redraws.append(screen.plot.last_draw_seconds)
        figures["redraw_ms_median"] = sorted(redraws)[len(redraws) // 2] * 1000
        # CPU time as well: on a shared machine the wall time of a redraw also counts the waits for a core
        figures["redraw_cpu_ms_median"] = sorted(cpu)[len(cpu) // 2] * 1000
        figures["plot_size"] = list(screen.plot.content_size)
        chart_name = getattr(screen.plot, "chart_name", None)  # the metrics view: "grid" or "2/6 accuracy"
        figures["plot_layout"] = chart_name() if chart_name else "one plot"
        figures["max_rss_mb_loaded"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        (result_path.with_suffix(".ready")).write_text("1")
        process = psutil.Process()
        before_cpu, before = process.cpu_times(), time.monotonic()
        points, draws = screen.history.points(), screen.plot.draws
        await pilot.pause(follow_seconds)
        after_cpu, after = process.cpu_times(), time.monotonic()
        used = (after_cpu.user - before_cpu.user) + (after_cpu.system - before_cpu.system)
        figures["follow_cpu_percent"] = 100 * used / (after - before)
        figures["follow_points_added"] = screen.history.points() - points
        figures["follow_plot_draws_per_second"] = (screen.plot.draws - draws) / (after - before)
        figures["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result_path.write_text(json.dumps(figures))
        pilot.app.exit()

    app.run(headless=True, size=(200, 50), auto_pilot=pilot_script)


def append_steps(path: Path, first_step: int, rate: float, stop: threading.Event) -> int:
    """A trainer's appends: `rate` step events a second, one write each, until `stop`."""
    written = 0
    with open(path, "a", encoding="utf-8") as handle:
        while not stop.wait(1.0 / rate):
            handle.write(step_line(first_step + written, time.time()))
            handle.flush()
            written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tideborn.tui.benchmark", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2_000_000, help="step events in the run (default 2,000,000)")
    parser.add_argument("--follow-seconds", type=float, default=30.0, help="how long to follow the appends")
    parser.add_argument("--rate", type=float, default=20.0, help="step events a second while following")
    parser.add_argument("--run-dir", type=Path, help="reuse (or keep) the run directory here")
    parser.add_argument("--child", nargs=4, metavar=("RUN_DIR", "LAUNCHED_AT", "SECONDS", "RESULT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child[0]), float(args.child[1]), float(args.child[2]), Path(args.child[3]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        events = run_dir / "events.jsonl"
        if not events.exists():
            began = time.perf_counter()
            size = write_run(run_dir, args.steps)
            print(f"wrote {args.steps:,} step events ({size:,.0f} MB) in {time.perf_counter() - began:.1f} s")
        with open(events, "rb") as handle:  # warm the page cache: the figures are about the TUI, not the disk
            while handle.read(64 * 1024 * 1024):
                pass
        result = Path(tmp) / "result.json"
        launched_at = time.time()
        process = subprocess.Popen([sys.executable, "-m", "tideborn.tui.benchmark", "--child", str(run_dir),
                                    repr(launched_at), str(args.follow_seconds), str(result)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        stop = threading.Event()
        while not result.with_suffix(".ready").exists():
            if process.poll() is not None:
                print(process.stderr.read().decode(errors="replace"), file=sys.stderr)
                return 1
            time.sleep(0.05)
        last_step = args.steps + 1
        writer = threading.Thread(target=append_steps, args=(events, last_step, args.rate, stop), daemon=True)
        writer.start()
        try:
            _out, err = process.communicate(timeout=args.follow_seconds + 600)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        stop.set()
        writer.join()
        if process.returncode != 0 or not result.exists():
            print(err.decode(errors="replace"), file=sys.stderr)
            return 1
        figures = json.loads(result.read_text())
    print(f"steps in the run:           {args.steps:,}")
    print(f"python + textual imported:  {figures['imported_at']:.2f} s after launch")
    print(f"first screen with a curve:  {figures['first_screen_seconds']:.2f} s ({figures['first_screen_points']:,} "
          "recent points)")
    print(f"full curve:                 {figures['full_curve_seconds']:.2f} s ({figures['full_curve_points']:,} points,"
          f" {figures['history_bytes'] / 1e6:.0f} MB of arrays)")
    print(f"plot redraw, all points:    {figures['redraw_ms_median']:.1f} ms median ("
          f"{figures['redraw_cpu_ms_median']:.1f} ms of CPU) at {figures['plot_size'][0]}x{figures['plot_size'][1]} "
          f"cells (200x50 terminal; {figures['plot_layout']})")
    print(f"peak memory (max RSS):      {figures['max_rss_mb']:.0f} MB ({figures['max_rss_mb_loaded']:.0f} MB once "
          "loaded)")
    print(f"CPU while following:        {figures['follow_cpu_percent']:.1f}% of one core over "
          f"{args.follow_seconds:g} s, {args.rate:g} events/s ({figures['follow_points_added']} points arrived, "
          f"{figures['follow_plot_draws_per_second']:.1f} plot redraws/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
