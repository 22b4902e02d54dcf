"""The monitor on an elastic job that torchrun's agent restarted: one run, a badge with the restarts and the world
size in the header, a `restarted` anomaly for each restart in the anomalies panel, never "vanished"."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.tui import app_for, attached
from tideborn.tui.testing import FIXTURE_NOW
from tideborn.tui.widgets.anomalies import AnomalyList

T = FIXTURE_NOW - 60


def elastic_run(tmp_path: Path) -> Path:
    """A job that lost a worker (restart 1, at world size 2), then a node (restart 2, alone), then got it back
    (a membership change: torchrun's count stays 2), and was stopped."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started = {"v": 1, "kind": "run_started", "max_steps": 100, "pid": 999999, "max_restarts": 3}
    events = [
        {**started, "time": T, "step": 0, "world_size": 2, "restart_count": 0},
        {"v": 1, "kind": "step", "time": T + 1, "step": 7, "loss": 1.0},
        {"v": 1, "kind": "run_failed", "time": T + 2, "step": 7, "error": "RuntimeError: Connection closed by peer"},
        {**started, "time": T + 3, "step": 5, "world_size": 2, "restart_count": 1, "resumed_from": "step-5.pt"},
        {"v": 1, "kind": "run_failed", "time": T + 4, "step": 12, "error": "RuntimeError: Connection reset by peer"},
        {**started, "time": T + 5, "step": 10, "world_size": 1, "restart_count": 2, "resumed_from": "step-10.pt"},
        {"v": 1, "kind": "run_stopped", "time": T + 6, "step": 13, "reason": "SIGTERM"},
        {**started, "time": T + 7, "step": 13, "world_size": 2, "restart_count": 2, "resumed_from": "step-13.pt"},
        {"v": 1, "kind": "step", "time": T + 8, "step": 14, "loss": 1.0},
        {"v": 1, "kind": "run_stopped", "time": T + 9, "step": 15, "reason": "SIGTERM"},
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run_dir


async def test_the_header_shows_the_restarts_and_the_panel_one_anomaly_for_each(tmp_path: Path) -> None:
    async with app_for(elastic_run(tmp_path)).run_test(size=(140, 40)) as pilot:
        screen = await attached(pilot)
        header = screen.header.text().plain
        assert header.startswith(" STOPPED ") and "VANISHED" not in header, header
        assert " 3 restarts, world size 2 " in header, header
        shown = screen.query_one("#anomalies", AnomalyList).anomalies
        restarted = [a for a in shown if a.rule == "restarted"]
        assert [a.evidence["world_size"] for a in restarted] == [2, 1, 2], shown
        assert "Connection closed by peer" in restarted[0].message and "restart 2 of 3" in restarted[1].message
        assert not [a for a in shown if a.rule == "vanished"]
