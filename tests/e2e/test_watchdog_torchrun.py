"""The watchdog under torchrun: every rank halts together at the step that trips it."""

from __future__ import annotations

from tests.helpers.common import EXPLODING, events_of


def test_under_torchrun_every_rank_halts_together_at_the_trip(tmp_path):
    from tests.helpers.torchrun import torchrun

    run_dir = tmp_path / "run"
    result = torchrun(run_dir, *EXPLODING, cwd=tmp_path)
    assert result.returncode != 0, result.stderr
    events = events_of(run_dir)
    (trip,) = [e for e in events if e["kind"] == "watchdog"]
    assert [e["kind"] for e in events if e["kind"] in ("run_failed", "run_finished", "run_stopped")] == ["run_failed"]
    assert "gradient watchdog" in events[-1]["error"]
    assert all(e["step"] < trip["trip_step"] for e in events if e["kind"] == "checkpoint_saved")
