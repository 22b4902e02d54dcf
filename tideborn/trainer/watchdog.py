"""The gradient watchdog (`[watchdog]`): halts a run whose gradient norm explodes before its weights are saved.

Modelled on KataGo's GnormWatcher, which follows the gradient norm against its recent history; this one
acts on it. A step trips it when its gradient norm (before clipping) is

- non-finite, unless a grad scaler is in use (fp16): there an overflow is routine, the scaler skips that
  update and lowers its scale, and the weights are untouched; or
- above `factor` times the median of the last `window` accepted norms, for `consecutive` steps in a row,
  once `warmup_steps` norms of the run have been seen (one spike is only a bad batch; spikes do not enter
  the median). Until the window fills, the median is that of the run's first norms.

The norms stay on the device as the steps make them (`add`, no host sync); `check` reads them back in one
transfer and judges them in step order. The loop checks at every `step` event and before every checkpoint,
so no checkpoint is written after the step that tripped it.
A checkpoint saved while a streak of spikes is open is not healthy: it prunes nothing, and a trip (or a
non-finite loss) moves it to `archive/watchdog-STAMP/`, since its weights took exploding updates; the newest
healthy checkpoint is the resume point. The history, the open streak and the newest healthy step are saved in
every checkpoint (`state_dict`), so a resumed run is judged from its first step, as if it had never stopped.
"""

from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass, field

import torch

from tideborn.config.schema import WatchdogSettings

NONFINITE = "nonfinite_grad_norm"
SPIKE = "grad_norm_spike"


@dataclass(frozen=True)
class Trip:
    """Why the watchdog halts the run: the `watchdog` event's fields."""

    reason: str
    """NONFINITE or SPIKE."""
    trip_step: int
    grad_norm: float
    median: float | None
    factor: float
    consecutive: int
    window: int
    spikes: list[list[float]] = field(default_factory=list)
    """[step, norm] of each step of the streak that tripped it."""

    def text(self) -> str:
        if self.reason == NONFINITE:
            return (f"gradient watchdog: non-finite gradient norm ({self.grad_norm}) at step {self.trip_step}"
                    + (f" (running median {self.median:.4g})" if self.median is not None else ""))
        first = int(self.spikes[0][0]) if self.spikes else self.trip_step
        return (f"gradient watchdog: gradient norm {self.grad_norm:.4g} at step {self.trip_step}, above "
                f"{self.factor:g} x the running median {self.median:.4g} for {self.consecutive} consecutive "
                f"step(s) (steps {first}-{self.trip_step})")

    def event_fields(self) -> dict:
        return {"reason": self.reason, "trip_step": self.trip_step, "grad_norm": self.grad_norm,
                "median": self.median, "factor": self.factor, "consecutive": self.consecutive,
                "window": self.window, "spikes": self.spikes}


class GradientJudge:
    """The rule itself, on host floats, one step at a time (pure: tests feed it directly)."""

    def __init__(self, settings: WatchdogSettings, nonfinite_is_skipped: bool = False):
        self.settings = settings
        self.nonfinite_is_skipped = nonfinite_is_skipped
        self.history: collections.deque[float] = collections.deque(maxlen=settings.window)
        self.seen = 0
        self.streak: list[list[float]] = []

    def median(self) -> float | None:
        return statistics.median(self.history) if self.history else None

    def feed(self, step: int, norm: float) -> Trip | None:
        s = self.settings
        if not math.isfinite(norm):
            if self.nonfinite_is_skipped:
                return None  # the grad scaler skipped this update: the weights did not take it
            # The streak open before it belongs to the same explosion: its saves are condemned with it.
            return Trip(NONFINITE, step, norm, self.median(), s.factor, s.consecutive, s.window,
                        [*self.streak, [step, norm]])
        self.seen += 1
        median = self.median()
        armed = self.seen > s.warmup_steps and median is not None and median > 0
        if armed and norm > s.factor * median:
            self.streak.append([step, norm])
            if len(self.streak) >= s.consecutive:
                return Trip(SPIKE, step, norm, median, s.factor, s.consecutive, s.window, list(self.streak))
            return None
        self.streak = []
        self.history.append(norm)
        return None

    def state_dict(self) -> dict:
        """Plain data for a checkpoint (a `weights_only` load reads it back)."""
        return {"history": list(self.history), "seen": self.seen, "streak": [list(pair) for pair in self.streak]}

    def load_state_dict(self, state: dict) -> None:
        self.history.clear()
        self.history.extend(float(norm) for norm in state["history"])  # a smaller window keeps the newest
        self.seen = int(state["seen"])
        self.streak = [[int(step), float(norm)] for step, norm in state["streak"]]


class GradientWatchdog:
    """Per-step gradient norms kept on the device until `check` judges them (off: does nothing)."""

    def __init__(self, settings: WatchdogSettings, nonfinite_is_skipped: bool = False):
        self.enabled = settings.enabled
        self.judge = GradientJudge(settings, nonfinite_is_skipped)
        self.pending: list[torch.Tensor] = []
        self.first_pending_step = 0

    def add(self, step: int, norm: torch.Tensor) -> None:
        """The norm of the update that made step `step` (a 0-d tensor, not read back here)."""
        if not self.enabled:
            return
        if not self.pending:
            self.first_pending_step = step
        self.pending.append(norm.detach().reshape(()).float())

    @property
    def streak_open(self) -> bool:
        """Spikes are being counted (as of the last check): the weights may be taking exploding updates."""
        return self.enabled and bool(self.judge.streak)

    def state_dict(self, healthy_step: int | None) -> dict:
        """The checkpoint's `watchdog` entry. `healthy`: saved with no streak open; `healthy_step`: the step of
        the newest checkpoint saved so (this one's, when healthy), which a trip leaves as the resume point."""
        return {**self.judge.state_dict(), "healthy": not self.streak_open, "healthy_step": healthy_step}

    def load_state_dict(self, state: dict | None) -> None:
        """Resume the judge where the checkpoint left it (an older checkpoint without one: start afresh)."""
        if state is not None:
            self.judge.load_state_dict(state)

    def check(self) -> Trip | None:
        """Judge the norms added since the last check, in step order; the first trip, or None."""
        if not self.pending:
            return None
        values = torch.stack(self.pending).tolist()
        first, self.pending = self.first_pending_step, []
        for offset, value in enumerate(values):
            trip = self.judge.feed(first + offset, value)
            if trip is not None:
                return trip
        return None


def saved_healthy(payload: dict) -> bool:
    """Whether a checkpoint was saved with no spike streak open (one from before the watchdog kept state: yes)."""
    state = payload.get("watchdog")
    return state is None or bool(state["healthy"])


def healthy_step_of(payload: dict) -> int | None:
    """The step of the newest healthy checkpoint as of `payload`'s save (its own step when it is healthy)."""
    if saved_healthy(payload):
        return int(payload["step"])
    return payload["watchdog"]["healthy_step"]
