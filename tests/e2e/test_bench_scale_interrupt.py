"""Ctrl-C in the scale benchmark while a measuring child runs: one line, exit 130, the child (in a session of its
own, which the terminal's SIGINT does not reach) ended with it, and the scratch folder removed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.helpers.common import REPO_ROOT, child_env


def test_ctrl_c_during_a_measurement_ends_the_child_and_leaves_nothing(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    bench = subprocess.Popen([sys.executable, "-m", "benchmarks.scale", "--sizes", "500000", "--formats", "hcpe3",
                              "--seed-copies", "1", "--scratch", str(scratch)], cwd=REPO_ROOT, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not children:  # the first open's child: the corpus is written, a measurement runs
            assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
            children = psutil.Process(bench.pid).children(recursive=True)
            time.sleep(0.02)
        bench.send_signal(signal.SIGINT)
        out, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130, (out, err)
    assert err.splitlines() == ["bench_scale: interrupted (Ctrl-C); nothing half-written is left"], err
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:  # a survivor fails the test; it is not left running either way
        child.kill()
    assert not alive, [child.cmdline()[:3] for child in alive]
    assert list(scratch.iterdir()) == []
