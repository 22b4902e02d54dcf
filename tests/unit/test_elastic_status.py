"""status of an elastic job: the attempts torchrun's agent restarted are one run with restarts, a `restarted`
anomaly for each (what it recovered from named), not a new run each time."""

from __future__ import annotations

import json
from pathlib import Path

from tideborn.rundir.report import status_text
from tideborn.rundir.state import RunTracker

T = 1_700_000_000.0


def test_restarts_are_one_run_with_a_restarted_anomaly_each(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started = {"v": 1, "kind": "run_started", "max_steps": 100, "pid": 999999, "max_restarts": 3}
    events = [
        {**started, "time": T, "step": 0, "world_size": 2, "restart_count": 0},
        {"v": 1, "kind": "step", "time": T + 1, "step": 10, "loss": 1.0},
        {"v": 1, "kind": "run_failed", "time": T + 2, "step": 12, "error": "RuntimeError: Connection reset by peer"},
        {**started, "time": T + 3, "step": 10, "world_size": 1, "restart_count": 1, "resumed_from": "step-10.pt"},
        {**started, "time": T + 4, "step": 20, "world_size": 2, "restart_count": 2, "resumed_from": "step-20.pt"},
        {"v": 1, "kind": "run_stopped", "time": T + 5, "step": 25, "reason": "SIGTERM"},
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    tracker = RunTracker(run_dir, start="tail")
    tracker.refresh(now=T + 6, keep_events=False)
    status = tracker.status(T + 6)
    assert status.state == "stopped" and status.restarts == 2 and status.world_size == 2
    restarted = [a for a in status.anomalies if a.rule == "restarted"]
    assert [a.evidence["world_size"] for a in restarted] == [1, 2]
    assert "restart 1 of 3" in restarted[0].message and "Connection reset by peer" in restarted[0].message
    assert "restarts    2 by torchrun's elastic agent; now at world size 2" in status_text(status)
