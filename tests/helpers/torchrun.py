"""torchrun for the tests: two processes on this machine, each with one CPU thread; `--standalone` picks a free
port, so runs in parallel test processes do not meet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers.common import RUN_TIMEOUT_SECONDS, child_env, settings_args
from tideborn.network.checkpoint import load_checkpoint

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


SMALL = ("optim.batch_size=16", "runtime.log_every=1", "runtime.progress=\"plain\"")


def torchrun_args(run_dir: Path, *sets: str) -> list[str]:
    return [*TORCHRUN, "-m", "tideborn.trainer", "train", *settings_args(run_dir, *SMALL, *sets)]


def torchrun(run_dir: Path, *sets: str, cwd: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*torchrun_args(run_dir, *sets), *extra], cwd=cwd, env=child_env(), capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)


def parameters(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The trainable weights (BatchNorm running statistics stay per rank by design and are left out)."""
    state = load_checkpoint(checkpoint)["model"]
    return {name: value for name, value in state.items() if "running_" not in name and "num_batches" not in name}
