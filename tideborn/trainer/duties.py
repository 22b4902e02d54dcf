"""When the training loop's periodic duties are due: the step event, evaluation, checkpoints, matches, the
ONNX exports (at the end, and for the engine during the run), `gpu` events and the one `compile` event.

Each duty is an object the loop asks (`should_run(step, final)`, after torchtitan's
`MetricsProcessor.should_log` and `checkpointer.save(step, last_step=...)`), so the cadences are decided in
one place and tested without training. Counts are of the run's absolute step, so a run resumed from a step
that is not a multiple keeps the cadence of the run it continues. No torch here.
"""

from __future__ import annotations

import time
import typing
from dataclasses import dataclass

from tideborn.config.schema import RuntimeSettings


@dataclass(frozen=True)
class Horizon:
    """Where this attempt ends: at `runtime.max_steps`, or at `--stop-at-step` before it."""

    max_steps: int
    stop_at_step: int | None = None

    def is_final(self, step: int) -> bool:
        """The attempt's last step: what the run ends with is logged, evaluated and saved there."""
        return step in (self.max_steps, self.stop_at_step)

    def reached(self, step: int) -> bool:
        return step >= self.max_steps or step == self.stop_at_step

    def finished(self, step: int) -> bool:
        """The run itself is done (not only this attempt, as at --stop-at-step)."""
        return step >= self.max_steps


@dataclass(frozen=True)
class Every:
    """Due at each multiple of `steps` (0: at none) and, with `at_final`, at the final step too."""

    steps: int = 0
    at_final: bool = False

    def should_run(self, step: int, final: bool) -> bool:
        return (self.steps > 0 and step % self.steps == 0) or (final and self.at_final)


NEVER = Every()


class Interval:
    """Due at the first ask, then again once `seconds` have passed since the last time it was due: a cadence
    by the clock, for events that report the machine rather than the steps."""

    def __init__(self, seconds: float, enabled: bool = True,
                 clock: typing.Callable[[], float] = time.perf_counter):
        self.seconds, self.enabled, self.clock = seconds, enabled, clock
        self.next_due: float | None = None

    def should_run(self) -> bool:
        """Whether it is due now; a yes starts the next interval."""
        if not self.enabled:
            return False
        now = self.clock()
        if self.next_due is not None and now < self.next_due:
            return False
        self.next_due = now + self.seconds
        return True


class Once:
    """Due at the first ask only (when enabled)."""

    def __init__(self, enabled: bool):
        self.pending = enabled

    def should_run(self) -> bool:
        due, self.pending = self.pending, False
        return due


@dataclass(frozen=True)
class Duties:
    """Every periodic duty of one attempt, as `runtime` sets them."""

    horizon: Horizon
    log: Every
    """The `step` event (and the progress line) closing the metrics window."""
    evaluate: Every
    """Held-out evaluation (`eval` event), where the run has test data."""
    checkpoint: Every
    match: Every
    """A match of the checkpoint just saved against the reference (asked only right after a save)."""
    keep_reference: bool
    """Keep the run's own match reference at every save in the loop (`match_every` with no `match_reference`)."""
    export: Every
    """ONNX export of the final weights (asked only when the run finishes)."""
    engine_export: Every
    """`runtime.export_every`: the weights for the engine, in `export/`, at its multiples and (asked with `final`
    meaning the run finishes there, not the attempt) at the run's last step."""
    gpu: Interval
    compile_report: Once
    """The `compile` event, timing the first step (torch.compile compiles inside it)."""

    @classmethod
    def of(cls, runtime: RuntimeSettings, stop_at_step: int | None, *, evaluating: bool, main: bool,
           cuda: bool, clock: typing.Callable[[], float] = time.perf_counter) -> Duties:
        """`main`: this is rank 0, which alone writes checkpoints, plays matches, exports and reports the GPUs;
        `evaluating`: this rank has held-out data to evaluate on."""
        return cls(
            horizon=Horizon(runtime.max_steps, stop_at_step),
            log=Every(runtime.log_every, at_final=True),
            evaluate=Every(runtime.eval_every, at_final=True) if evaluating else NEVER,
            checkpoint=Every(runtime.checkpoint_every, at_final=True),
            # The final step is saved whether or not it is a multiple; it is matched only at a multiple.
            match=Every(runtime.match_every) if main else NEVER,
            keep_reference=main and runtime.match_every > 0 and not runtime.match_reference,
            export=Every(at_final=runtime.export_onnx and main),
            engine_export=Every(runtime.export_every, at_final=True) if main and runtime.export_every else NEVER,
            gpu=Interval(runtime.gpu_event_seconds, enabled=cuda and main, clock=clock),
            compile_report=Once(runtime.compile),
        )
