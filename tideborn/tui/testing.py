"""Run directories made by hand, with fixed times, for the TUI's tests, snapshots and benchmark.

`write_fixture_run` writes a small two-session run (a NaN, an eval, a resume, checkpoints, gpu events,
an unknown event kind, a torn last line, a traceback and an OOM line in train.log) on a host that is
not this one, so nothing about it depends on this machine or on the wall clock: give the app
`FIXTURE_NOW` as its clock.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from tideborn.rundir.events import encode_event

FIXTURE_START = 1_700_000_000.0
FIXTURE_HOST = "fixture-host"
FIXTURE_PID = 424242
SECONDS_PER_LOGGED_STEP = 2.0


def _loss(step: int) -> tuple[float, float, float]:
    policy = 7.0 * math.exp(-step / 180.0) + 1.2 + 0.15 * math.sin(step * 0.37)
    value = 0.62 - 0.1 * (1 - math.exp(-step / 250.0)) + 0.02 * math.cos(step * 0.51)
    return policy + value, policy, value


def fixture_events(max_steps: int = 400) -> list[tuple[str, dict, float]]:
    """(kind, fields, time) in order: session 1 to step 300, then a resume from step 200 to 400."""
    out: list[tuple[str, dict, float]] = []
    t = FIXTURE_START

    def started(step: int, resumed: str | None) -> None:
        out.append(("run_started", {
            "step": step, "settings": {"runtime": {"device": "cuda", "max_steps": max_steps}},
            "device": "cuda:0 (NVIDIA GeForce RTX 4070 Ti), bf16, channels_last", "precision": "bf16",
            "world_size": 1, "resumed_from": resumed, "changed_settings": {}, "fresh": False,
            "archived_to": None, "pid": FIXTURE_PID, "host": FIXTURE_HOST, "argv": ["train"],
            "max_steps": max_steps, "batch_size": 1024, "run_dir": "fixture"}, t))

    def steps(first: int, last: int) -> None:
        nonlocal t
        for step in range(first, last + 1, 5):
            t += SECONDS_PER_LOGGED_STEP
            loss, policy, value = _loss(step)
            fields: dict = {"step": step, "loss": loss, "policy_loss": policy, "value_loss": value,
                            "grad_norm": 1.5, "lr": 0.05 * (1 - step / (max_steps + 1)),
                            "positions_per_second": 2560.0, "data_wait_seconds": 0.01, "compute_seconds": 1.99,
                            "steps": 5}
            if step == 150:
                fields.update(loss=math.nan, policy_loss=math.nan)
            if step == 155:
                fields.update(value_loss=math.inf, loss=math.inf)
            out.append(("step", fields, t))
            if step % 50 == 0:
                out.append(("gpu", {"step": step, "devices": [{
                    "index": 0, "name": "NVIDIA GeForce RTX 4070 Ti", "utilization_percent": 90.0 + step % 7,
                    "memory_used_bytes": 9_800_000_000 + step * 1_000_000, "memory_total_bytes": 12_878_086_144,
                    "temperature_c": 67.0 + step % 5, "power_watts": 251.5}],
                    "torch_peak_memory_bytes": 8_600_000_000, "torch_memory_allocated_bytes": 7_100_000_000}, t))
            if step % 100 == 0:
                out.append(("eval", {"step": step, "policy_loss": policy + 0.1, "value_loss": value + 0.02,
                                     "policy_accuracy": 0.2 + step / 2000.0, "value_accuracy": 0.6 + step / 4000.0,
                                     "positions": 8192, "skipped_records": 0}, t))
                out.append(("checkpoint_saved", {"step": step, "path": f"fixture/step-{step:09d}.pt",
                                                 "bytes": 123_456_789, "seconds": 0.8, "pruned": []}, t))

    started(0, None)
    steps(5, 300)
    out.append(("future_kind", {"step": 300, "note": "a kind this reader does not know"}, t))
    t += 30.0  # the first session died here (no terminal event): the second resumes from step 200
    started(200, "fixture/step-000000200.pt")
    out.append(("warning", {"step": 200, "message": "removed a temp checkpoint left by an interrupted save"}, t))
    steps(205, max_steps)
    t += 1.0
    out.append(("run_stopped", {"step": max_steps, "reason": "SIGTERM",
                                "checkpoint": f"fixture/step-{max_steps:09d}.pt", "elapsed_seconds": 402.0}, t))
    return out


FIXTURE_LOG = """\
=== 2023-11-14 22:13:20 train_run start: python -m tideborn.trainer train --config configs/rtx4070ti.toml ===
training 10x192 on cuda:0 (NVIDIA GeForce RTX 4070 Ti), bf16, from step 0, to step 400
step 100/400 | loss 3.9 (policy 3.3, value 0.6) | lr 3.75e-02 | 2,560 pos/s
Traceback (most recent call last):
  File "tideborn/trainer/loop.py", line 250, in run
    loss = self.step(batch)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
=== 2023-11-14 22:23:50 train_run start: python -m tideborn.trainer train --config configs/rtx4070ti.toml ===
resuming from step 200 (fixture/step-000000200.pt)
step 400/400 | loss 1.9 (policy 1.4, value 0.5) | lr 1.25e-04 | 2,560 pos/s
stopped (SIGTERM) at step 400; checkpoint fixture/step-000000400.pt
"""


def write_fixture_run(run_dir: Path, max_steps: int = 400) -> float:
    """Write the fixture run into `run_dir`; returns the time its last event was written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    events = fixture_events(max_steps)
    with open(run_dir / "events.jsonl", "wb") as handle:
        for kind, fields, when in events:
            handle.write(encode_event(kind, fields, now=when))
        handle.write(b'{"v":1,"time":1700000999.0,"kind":"step","step":4')  # a writer mid-append
    last = events[-1][2]
    (run_dir / "train.log").write_text(FIXTURE_LOG, encoding="utf-8")
    for step in (300, max_steps):
        path = run_dir / f"step-{step:09d}.pt"
        path.write_bytes(b"not a real checkpoint")
        os.utime(path, (last - (max_steps - step) * 0.4, last - (max_steps - step) * 0.4))
    for name in ("events.jsonl", "train.log"):
        os.utime(run_dir / name, (last, last))
    return last


FIXTURE_NOW = FIXTURE_START + 296.0
"""A clock for the fixture: 65 s after its last event."""


def write_small_run(run_dir: Path, last_step: int = 100, scale: float = 1.0, end: str | None = "run_stopped",
                    checkpoints: tuple[int, ...] = (50, 100), start: float = FIXTURE_START,
                    match_every: int | None = None) -> float:
    """A one-session run on the fixture host for the run comparison and the checkpoint list: a loss that
    falls from about 8 * `scale`, an `eval` every 50 steps, checkpoints at `checkpoints` (files with the
    time of their step's event) and `end` as its terminal event (None: no
    terminal event); with `match_every`, a `match` against the first checkpoint every so many steps (an Elo
    that climbs, with its interval). Returns the time of its last event."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t = start
    lines = [encode_event("run_started", {
        "step": 0, "settings": {"runtime": {"device": "cuda", "max_steps": last_step}}, "device": "cuda:0, bf16",
        "resumed_from": None, "pid": FIXTURE_PID, "host": FIXTURE_HOST, "max_steps": last_step,
        "batch_size": 1024}, now=t)]
    for step in range(5, last_step + 1, 5):
        t += SECONDS_PER_LOGGED_STEP
        _total, policy, value = _loss(step)
        policy, value = policy * scale, value * scale
        lines.append(encode_event("step", {"step": step, "loss": policy + value, "policy_loss": policy,
                                           "value_loss": value, "lr": 0.05, "positions_per_second": 2560.0}, now=t))
        if step % 50 == 0:
            lines.append(encode_event("eval", {"step": step, "policy_loss": policy + 0.1, "value_loss": value + 0.02,
                                               "policy_accuracy": 0.2 + step / 2000.0 / scale,
                                               "value_accuracy": 0.6 + step / 4000.0, "positions": 8192,
                                               "skipped_records": 0}, now=t))
        if match_every and step % match_every == 0:
            lines.append(encode_event("match", match_fields(step, scale, match_every), now=t))
        if step in checkpoints:
            lines.append(encode_event("checkpoint_saved", {"step": step, "path": str(run_dir / f"step-{step:09d}.pt"),
                                                           "bytes": 1000 + step, "seconds": 0.5, "pruned": []}, now=t))
    if end is not None:
        t += 1.0
        fields = {"step": last_step, "reason": "SIGTERM", "checkpoint": str(run_dir / f"step-{last_step:09d}.pt")}
        if end == "run_failed":
            fields = {"step": last_step, "error": "RuntimeError: boom"}
        lines.append(encode_event(end, fields, now=t))
    (run_dir / "events.jsonl").write_bytes(b"".join(lines))
    for step in checkpoints:
        path = run_dir / f"step-{step:09d}.pt"
        path.write_bytes(b"c" * (1000 + step))
        saved = start + step // 5 * SECONDS_PER_LOGGED_STEP  # when its step event was written
        os.utime(path, (saved, saved))
    os.utime(run_dir / "events.jsonl", (t, t))
    return t


def match_fields(step: int, scale: float = 1.0, match_every: int = 50) -> dict:
    """A `match` event's figures: the first is the reference against itself (Elo 0), then an Elo that climbs
    with the step, its 95% interval about 60 Elo either side (wider for a weaker run: `scale`)."""
    if step <= match_every:
        elo, half = 0.0, 70.0
    else:
        elo, half = 120.0 * math.log1p(step / 50.0) / scale, 55.0 * scale
    return {"step": step, "checkpoint": f"step-{step:09d}.pt", "reference": "match-reference.pt",
            "reference_step": match_every, "games": 64, "wins": 30, "draws": 4, "losses": 30, "score": 0.5,
            "elo": elo, "elo_low": elo - half, "elo_high": elo + half, "los": 0.5, "model": "pentanomial",
            "seconds": 3.0, "games_per_second": 21.0}
