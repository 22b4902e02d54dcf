"""The metrics window: the steps since the last `step` event, summed on the device as they are made and read
back once, as that event's record (docs/events.md).

Sums stay on the device so that a step costs no host sync; the read averages them over the window's steps
and over the ranks (a collective: every rank reads at the same steps).
"""

from __future__ import annotations

import math
import time
import typing
from dataclasses import dataclass

import torch

from tideborn.trainer.distributed import AllReduceCounter, any_rank, mean_over_ranks
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.state import StepResult


@dataclass(frozen=True)
class WindowRead:
    record: dict
    """The `step` event's fields."""
    means: list[float]
    """Loss, policy loss, value loss and grad norm, averaged over the window's steps and the ranks."""
    seconds: float
    """How long the window's steps took, data waits included."""


class MetricsWindow:
    def __init__(self, device: torch.device, env: DistEnv, batch_size: int,
                 value_lambda: typing.Callable[[int], float] | None = None,
                 allreduce_counter: AllReduceCounter | None = None,
                 clock: typing.Callable[[], float] = time.perf_counter):
        """`value_lambda(step)`: the value mix the step event reports while it decays; `allreduce_counter`:
        runtime.ddp_diagnostics, whose count the step event carries."""
        self.device, self.env, self.batch_size = device, env, batch_size
        self.value_lambda, self.allreduce_counter, self.clock = value_lambda, allreduce_counter, clock
        self.sums = torch.zeros(4, device=device)  # loss, policy, value, grad norm
        self.norms: list[torch.Tensor] = []  # each step's grad norm, read back with the sums
        self.digests: list[str] = []  # runtime.ddp_diagnostics: each step's global batch digest
        self.steps = 0
        self.wait_seconds = 0.0
        self.lr = 0.0
        self.started = clock()

    def add(self, result: StepResult) -> None:
        self.sums += torch.cat([result.losses, result.grad_norm.reshape(1).float()])
        self.norms.append(result.grad_norm.reshape(()).float())
        self.steps += 1
        self.wait_seconds += result.data_wait_seconds
        self.lr = result.lr
        if result.batch_digest is not None:
            self.digests.append(result.batch_digest)

    def means(self) -> list[float]:
        return mean_over_ranks(self.sums / self.steps, self.env).tolist()

    def finite_on_every_rank(self) -> bool:
        """Whether the window's losses are finite on every rank (a collective; an empty window is finite)."""
        broken_here = self.steps > 0 and not bool(torch.isfinite(self.sums[:3]).all())
        return not any_rank(broken_here, self.env, self.device)

    def read(self, step: int) -> WindowRead:
        """The window as the `step` event for `step`, its last. `reset` opens the next window."""
        means = self.means()
        norms = torch.stack(self.norms).tolist()  # the same on every rank: taken after the all-reduce
        elapsed = self.clock() - self.started
        record = {
            "step": step, "loss": means[0], "policy_loss": means[1], "value_loss": means[2],
            "grad_norm": means[3], "grad_norm_max": max(norms, key=_nan_first),
            "grad_norms": [float(f"{norm:.4g}") for norm in norms], "lr": self.lr,
            "positions_per_second": self.steps * self.batch_size * self.env.world_size / elapsed,
            "data_wait_seconds": self.wait_seconds, "compute_seconds": max(0.0, elapsed - self.wait_seconds),
            "steps": self.steps,
        }
        if self.value_lambda is not None:
            record["value_lambda"] = self.value_lambda(step)
        if self.allreduce_counter is not None:  # runtime.ddp_diagnostics: checked after every step
            record["allreduce_calls"] = self.allreduce_counter.calls
            record["ranks_in_sync"] = True
        if self.digests:  # runtime.ddp_diagnostics: the window's global batches, a digest a step
            record["batch_digests"] = list(self.digests)
        return WindowRead(record, means, elapsed)

    def reset(self) -> None:
        self.sums.zero_()
        self.norms.clear()
        self.digests.clear()
        self.steps, self.wait_seconds, self.started = 0, 0.0, self.clock()


def _nan_first(value: float) -> float:
    """Sort key for the window's largest grad norm: a NaN counts as the largest (plain max would skip it)."""
    return math.inf if math.isnan(value) else value
