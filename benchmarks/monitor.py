"""Benchmark of the monitor following a live run (figures, never pass/fail): `python -m benchmarks.monitor`.

`tideborn-tui` runs as a real process in a pseudo-terminal of 200x50 (its output is read and thrown away, as
a terminal would show it), on a run of N step events (default 2,000,000) that a writer process keeps
appending to at 20 step events a second, as a live trainer would. Reported per launch: time from launch to
the first curve on the screen, the monitor's CPU use while following (no keys pressed), key-to-screen
latency (the chart key `g` pressed every ~0.7 s; the time until the chart it asks for is on the screen),
peak memory, and the load average. `--compare OLD_CHECKOUT` alternates launches of another checkout's
monitor (`git worktree add` or `git archive | tar -x`) with this one's: old, new, old, new...

The monitor is driven from outside (keys in, bytes out), so this module needs neither textual nor torch.
"""

from __future__ import annotations

import argparse
import codecs
import fcntl
import json
import math
import os
import pty
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tideborn.rundir.files import boot_id, process_start_ticks, this_host

REPO_ROOT = Path(__file__).resolve().parents[1]
COLUMNS, ROWS = 200, 50
STEP_LINE = ('{{"v":1,"time":{time:.3f},"kind":"step","step":{step},"loss":{loss:.6f},"policy_loss":{policy:.6f},'
             '"value_loss":{value:.6f},"grad_norm":1.2345,"lr":0.0123456,"positions_per_second":41234.5,'
             '"data_wait_seconds":0.0012,"compute_seconds":0.2468,"steps":1}}\n')
CHART_TITLES = ("losses", "accuracy", "learning rate", "grad norm", "throughput", "data wait")
"""What `g` shows in turn after the grid (tideborn.tui.widgets.loss_plot.GROUPS): "1/6 losses", ..."""
ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_0-9=>])")
BRAILLE = re.compile("[\u2801-\u28ff]")


def step_line(step: int, when: float) -> str:
    policy = 6.0 * math.exp(-step / 400_000) + 1.5 + 0.05 * math.sin(step * 0.01)
    value = 0.6 - 0.1 * (1 - math.exp(-step / 600_000))
    return STEP_LINE.format(time=when, step=step, loss=policy + value, policy=policy, value=value)


def eval_line(step: int, when: float) -> str:
    return json.dumps({"v": 1, "time": when, "kind": "eval", "step": step, "policy_loss": 2.0, "value_loss": 0.55,
                       "policy_accuracy": 0.2 + step * 1e-8, "value_accuracy": 0.6, "positions": 4096}) + "\n"


def write_run(run_dir: Path, steps: int) -> float:
    """A run of `steps` step events (an eval and a checkpoint every 10,000); returns its size in MB."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time() - steps * 0.2
    head = {"v": 1, "time": start, "kind": "run_started", "step": 0, "device": "cpu, fp32", "max_steps": steps * 4,
            "batch_size": 4096, "pid": 1, "host": "bench-host", "resumed_from": None,
            "settings": {"runtime": {"device": "cpu"}}}
    # A fixture of the benchmark's own, in a temporary directory: written plainly, not as a run file
    with open(run_dir / "events.jsonl", "w", encoding="utf-8") as handle:
        handle.write(json.dumps(head) + "\n")
        chunk = []
        for step in range(1, steps + 1):
            chunk.append(step_line(step, start + step * 0.2))
            if step % 10_000 == 0:
                chunk.append(eval_line(step, start + step * 0.2))
                chunk.append(json.dumps({"v": 1, "time": start + step * 0.2, "kind": "checkpoint_saved",
                                         "step": step, "path": f"step-{step:09d}.pt", "bytes": 1, "seconds": 0.1})
                             + "\n")
            if len(chunk) >= 50_000:
                handle.write("".join(chunk))
                chunk.clear()
        handle.write("".join(chunk))
    with open(run_dir / "train.log", "w", encoding="utf-8") as handle:
        handle.write("benchmark run\n")
    return (run_dir / "events.jsonl").stat().st_size / 1e6


def last_step(events: Path) -> int:
    with open(events, "rb") as handle:
        handle.seek(max(handle.seek(0, os.SEEK_END) - 64 * 1024, 0))
        steps = [int(m) for m in re.findall(rb'"kind":"step","step":(\d+)', handle.read())]
    return max(steps) if steps else 0


def writer(run_dir: Path, rate: float) -> None:
    """The live trainer: a `run_started` of its own (a resume), then `rate` step events a second (an eval
    every 1,000 steps, a line of train.log every 50), one write each, until SIGTERM."""
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    events, log = run_dir / "events.jsonl", run_dir / "train.log"
    step = last_step(events) + 1
    pid = os.getpid()
    started = {"v": 1, "time": time.time(), "kind": "run_started", "step": step - 1, "device": "cpu, fp32",
               "max_steps": step * 4, "batch_size": 4096, "pid": pid, "host": this_host(),
               "start_ticks": process_start_ticks(pid), "boot_id": boot_id(), "resumed_from": f"step-{step - 1:09d}.pt",
               "settings": {"runtime": {"device": "cpu"}}}
    with open(events, "a", encoding="utf-8") as out, open(log, "a", encoding="utf-8") as log_out:
        out.write(json.dumps(started) + "\n")
        out.flush()
        while not stopped.wait(1.0 / rate):
            now = time.time()
            out.write(step_line(step, now) + (eval_line(step, now) if step % 1000 == 0 else ""))
            out.flush()
            if step % 50 == 0:
                log_out.write(f"step {step} loss {2.1:.4f}\n")
                log_out.flush()
            step += 1


class Terminal:
    """A pseudo-terminal of COLUMNS x ROWS around one process: keys written, output drained and searched."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.launched = time.monotonic()
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                                        start_new_session=True, close_fds=True)
        os.close(slave)
        self.master = master
        self.lock = threading.Condition()
        self.text = ""
        """Output since `mark()`, escapes removed (only what is searched is kept)."""
        self.first_curve: float | None = None
        self.bytes = 0
        self.closed = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode  # a character split between reads
        while True:
            try:
                ready, _w, _x = select.select([self.master], [], [], 0.5)
                if not ready:
                    if self.process.poll() is not None:
                        break
                    continue
                chunk = os.read(self.master, 1 << 16)
            except OSError:  # EIO: the process and its terminal are gone
                break
            if not chunk:
                break
            now = time.monotonic()
            plain = ESCAPES.sub("", decode(chunk))
            with self.lock:
                self.bytes += len(chunk)
                if self.first_curve is None and BRAILLE.search(plain):
                    self.first_curve = now - self.launched
                self.text = (self.text + plain)[-200_000:]
                self.lock.notify_all()
        with self.lock:
            self.closed = True
            self.lock.notify_all()

    def mark(self) -> None:
        with self.lock:
            self.text = ""

    def wait_for(self, pattern: str, timeout: float) -> float | None:
        """Seconds until `pattern` appears in the output since `mark()`; None if it did not."""
        began = time.monotonic()
        deadline = began + timeout
        with self.lock:
            while not re.search(pattern, self.text):
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return None
                self.lock.wait(left)
        return time.monotonic() - began

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(5)
        os.close(self.master)


@dataclass
class Launch:
    label: str
    first_curve_seconds: float | None = None
    cpu_percent: float = 0.0
    output_kb_per_second: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    missed_keys: int = 0
    rss_mb: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)


def settle(terminal: Terminal, timeout: float) -> None:
    """Until the full history is read (its progress note gone from the header for 3 s), then 2 s more for the
    frames it asks for: what is measured is following, not loading."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        terminal.mark()
        time.sleep(3.0)
        with terminal.lock:
            if "reading the full history" not in terminal.text:
                break
    time.sleep(2.0)


def measure(label: str, source: Path, run_dir: Path, args: argparse.Namespace) -> Launch:
    """One launch of `source`'s monitor on `run_dir` while a writer appends: the figures of `Launch`."""
    result = Launch(label, load=(os.getloadavg()[0], 0.0))
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", "PYTHONPATH": str(source),
           "LINES": str(ROWS), "COLUMNS": str(COLUMNS)}
    env.pop("NO_COLOR", None)
    feeder = subprocess.Popen([sys.executable, "-m", "benchmarks.monitor", "--writer", str(run_dir),
                               str(args.rate)], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    terminal = Terminal([sys.executable, "-m", "tideborn.tui.app", str(run_dir), "--no-nvml"], env, source)
    try:
        monitor = psutil.Process(terminal.process.pid)
        terminal.mark()
        if terminal.wait_for("RUNNING", args.settle_timeout) is None:
            raise RuntimeError(f"{label}: the monitor did not show RUNNING; last output:\n{terminal.text[-2000:]}")
        result.first_curve_seconds = terminal.first_curve
        settle(terminal, args.settle_timeout)
        before, began, out_before = monitor.cpu_times(), time.monotonic(), terminal.bytes
        time.sleep(args.follow_seconds)
        after, ended = monitor.cpu_times(), time.monotonic()
        result.cpu_percent = 100 * ((after.user - before.user) + (after.system - before.system)) / (ended - began)
        result.output_kb_per_second = (terminal.bytes - out_before) / 1024 / (ended - began)
        for press in range(args.keys):
            number = press % (len(CHART_TITLES) + 1)  # the grid after the sixth chart
            pattern = (rf"{number + 1}/6 {re.escape(CHART_TITLES[number])}" if number < len(CHART_TITLES)
                       else re.escape(CHART_TITLES[0]) + r" .*" + re.escape(CHART_TITLES[1]))
            terminal.mark()
            terminal.press(b"g")
            latency = terminal.wait_for(pattern, 5.0)
            if latency is None:
                result.missed_keys += 1
            else:
                result.latencies_ms.append(latency * 1000)
            time.sleep(0.5 + (press % 5) * 0.1)  # not in step with the monitor's own once-a-second work
        result.rss_mb = monitor.memory_info().rss / 2**20
    finally:
        terminal.close()
        feeder.send_signal(signal.SIGTERM)
        feeder.wait(10)
    result.load = (result.load[0], os.getloadavg()[0])
    return result


def spread(values: list[float], unit: str, digits: int = 1) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(int(len(ordered) * 0.9), len(ordered) - 1)]
    return (f"{statistics.median(ordered):.{digits}f}{unit} (p90 {p90:.{digits}f}, {ordered[0]:.{digits}f} to "
            f"{ordered[-1]:.{digits}f})")


def report(launches: list[Launch]) -> None:
    for launch in launches:
        first = f"{launch.first_curve_seconds:.2f} s" if launch.first_curve_seconds is not None else "-"
        print(f"{launch.label:>4}: CPU following {launch.cpu_percent:4.1f}% of a core "
              f"({launch.output_kb_per_second:.1f} KiB/s to the terminal); key to screen "
              f"{spread(launch.latencies_ms, ' ms', 0)}{f', {launch.missed_keys} missed' if launch.missed_keys else ''}"
              f"; first curve {first}; RSS {launch.rss_mb:.0f} MB; load {launch.load[0]:.2f} -> {launch.load[1]:.2f}")
    labels = sorted({launch.label for launch in launches})
    if len(launches) > len(labels):
        for label in labels:
            mine = [launch for launch in launches if launch.label == label]
            cpu = [launch.cpu_percent for launch in mine]
            keys = [ms for launch in mine for ms in launch.latencies_ms]
            print(f"{label:>4} over {len(mine)} launches: CPU {min(cpu):.1f} to {max(cpu):.1f}% of a core; key to "
                  f"screen {spread(keys, ' ms', 0)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.monitor", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2_000_000, help="step events in the run (default 2,000,000)")
    parser.add_argument("--follow-seconds", type=float, default=30.0, help="how long CPU use is measured (30)")
    parser.add_argument("--settle-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=int, default=28, help="chart keys pressed per launch (28)")
    parser.add_argument("--rate", type=float, default=20.0, help="step events a second while following (20)")
    parser.add_argument("--repeat", type=int, default=1, help="launches of each checkout (1)")
    parser.add_argument("--compare", type=Path, metavar="OLD_CHECKOUT",
                        help="alternate with this checkout's monitor (old, new, old, new...)")
    parser.add_argument("--run-dir", type=Path, help="reuse (or keep) the run directory here")
    parser.add_argument("--writer", nargs=2, metavar=("RUN_DIR", "RATE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        writer(Path(args.writer[0]), float(args.writer[1]))
        return 0
    if args.compare is not None and not (args.compare / "tideborn" / "tui" / "app.py").is_file():
        print(f"{parser.prog}: error: --compare {args.compare}: not a tideborn checkout (no tideborn/tui/app.py)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        if not (run_dir / "events.jsonl").exists():
            began = time.perf_counter()
            size = write_run(run_dir, args.steps)
            print(f"wrote {args.steps:,} step events ({size:,.0f} MB) in {time.perf_counter() - began:.1f} s")
        sources = [("old", args.compare), ("new", REPO_ROOT)] if args.compare else [("new", REPO_ROOT)]
        launches = []
        for _round in range(args.repeat):
            for label, source in sources:
                # the page cache warm: the figures are the monitor's, not the disk's
                with open(run_dir / "events.jsonl", "rb") as handle:
                    while handle.read(64 * 1024 * 1024):
                        pass
                launches.append(measure(label, source, run_dir, args))
                report(launches[-1:])
    print(f"\n{COLUMNS}x{ROWS}, {args.rate:g} step events/s, CPU over {args.follow_seconds:g} s, "
          f"{args.keys} presses of g per launch")
    report(launches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
