"""What the dashboard looks like for a fixed run directory, at the size of an SSH terminal (80x24), a big
one (160x48), and in ASCII mode. Update with `pytest tests/test_tui_snapshots.py --snapshot-update`
after checking the new pictures (snapshot_report.html shows the differences)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tui.app import create_app
from tui.options import TuiOptions
from tui.testing import FIXTURE_NOW, write_fixture_run

WAIT_SECONDS = 30.0


@pytest.fixture
def fixture_run(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    run_dir = tmp_path / "fixture"
    write_fixture_run(run_dir)
    yield run_dir
    monkeypatch.undo()
    time.tzset()


def dashboard(run_dir: Path, ascii: bool = False):
    return create_app(TuiOptions(run_dir=run_dir, clock=lambda: FIXTURE_NOW, use_nvml=False, follow=False,
                                 ascii=ascii, colour=not ascii))


async def attached(pilot) -> None:
    """The run read and every pane drawn (the reading happens in a worker)."""
    deadline = time.monotonic() + WAIT_SECONDS
    screen = pilot.app.screen
    while not (screen.ready.is_set() and screen.query_one("#gpu").sample is not None):
        if time.monotonic() > deadline:
            pytest.fail("the dashboard never finished reading the fixture run")
        await pilot.pause(0.02)
    await pilot.pause()


def test_dashboard_80x24(snap_compare, fixture_run):
    assert snap_compare(dashboard(fixture_run), terminal_size=(80, 24), run_before=attached)


def test_dashboard_160x48(snap_compare, fixture_run):
    assert snap_compare(dashboard(fixture_run), terminal_size=(160, 48), run_before=attached)


def test_dashboard_ascii_80x24(snap_compare, fixture_run):
    assert snap_compare(dashboard(fixture_run, ascii=True), terminal_size=(80, 24), run_before=attached)
