"""A CPU trainer keeps the memory a step frees for the next one: without it, glibc hands large freed blocks back
to the kernel and every step pays a page fault per 4 KiB page of its activations (docs/benchmarks.md, per-step
speed). Counted in page faults, not timed."""

from __future__ import annotations

import ctypes
import os
import resource
import statistics
from pathlib import Path

import pytest

from tideborn.config.load import load_settings
from tideborn.trainer.device import resolve_device
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.state import TrainingState

BATCH, CHANNELS = 512, 32
ACTIVATION_PAGES = BATCH * CHANNELS * 81 * 4 // 4096
"""One activation of the net below: a 5.3 MB block, allocated and freed a dozen times per step."""
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
GLIBC_INITIAL_THRESHOLD = 128 * 1024
"""glibc's mmap and trim thresholds when a process starts (malloc.h's DEFAULT_MMAP_THRESHOLD_MIN)."""


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif("CS_GNU_LIBC_VERSION" not in getattr(os, "confstr_names", {}),
                    reason="the allocator setting is glibc's")
def test_a_cpu_training_step_reuses_the_memory_the_last_step_freed(tmp_path: Path):
    # glibc's initial thresholds, pinned, so that the test does not hang on what this process freed before: glibc
    # raises them as large blocks are freed, and a lucky history hid the faults in 1 run of 6. Harsher than a
    # fresh trainer process (which still took 10,000 to 19,000 faults a step on this net); the trainer's setting
    # must replace it either way.
    libc = ctypes.CDLL(None)
    assert libc.mallopt(M_MMAP_THRESHOLD, GLIBC_INITIAL_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD,
                                                                                    GLIBC_INITIAL_THRESHOLD)
    overrides = ['runtime.device="cpu"', "runtime.threads=1", "model.blocks=1", f"model.channels={CHANNELS}",
                 f"optim.batch_size={BATCH}", f"runtime.out_dir={str(tmp_path)!r}"]
    settings = load_settings(None, overrides, environ={}).settings
    state = TrainingState(settings, resolve_device(settings.runtime), DistEnv())
    state.restore(StartPoint())
    for step in range(3):  # the first steps map the memory the steps need
        state.train_step(step)
    per_step = []
    for step in range(3, 12):
        before = _faults()
        state.train_step(step)
        per_step.append(_faults() - before)
    # Without the setting: 60,000 to 110,000 faults in every step on this net (glibc unmaps and trims what each
    # step freed). With it, none in most steps, and now and then one activation's block or two while the heap's
    # layout settles, at any step and more often after a long history in the process (4,020 in 3 steps once in
    # the full suite): the median step tells the two apart where a sum over a few steps did not.
    assert statistics.median(per_step) < ACTIVATION_PAGES, (f"page faults per step: {per_step} "
                                                            f"(one activation is {ACTIVATION_PAGES} pages)")
