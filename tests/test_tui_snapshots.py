"""What the dashboard looks like for a fixed run directory, at the size of an SSH terminal (80x24), a big
one (160x48), and in ASCII mode. Update with `pytest tests/test_tui_snapshots.py --snapshot-update`
after checking the new pictures (snapshot_report.html shows the differences)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tui.app import create_app
from tui.options import TuiOptions
from tui.testing import FIXTURE_NOW, write_fixture_run, write_small_run

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


# -- the run comparison: three runs, one metric, a legend ------------------------------------------------

@pytest.fixture
def runs_folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    folder = tmp_path / "runs"
    write_small_run(folder / "bravo", last_step=100, scale=1.0, end="run_stopped")
    write_small_run(folder / "alpha", last_step=60, scale=0.6, end="run_failed")
    write_small_run(folder / "charlie", last_step=150, scale=1.4, end="run_finished")
    yield folder
    monkeypatch.undo()
    time.tzset()


def picker(folder: Path, ascii: bool = False):
    return create_app(TuiOptions(runs_folder=folder, clock=lambda: FIXTURE_NOW, use_nvml=False, follow=False,
                                 ascii=ascii, colour=not ascii))


async def compared(pilot) -> None:
    """All three runs marked in the picker, compared, their histories read. Given up on after WAIT_SECONDS
    (the picture then differs, and says what is on the screen instead: failing here would hang the app)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not pilot.app.screen.ready.is_set() and time.monotonic() < deadline:
        await pilot.pause(0.02)
    await pilot.press("space", "down", "space", "down", "space", "c")
    while getattr(pilot.app.screen, "ready", False) is not True and time.monotonic() < deadline:
        await pilot.pause(0.02)
    await pilot.pause()


def test_compare_80x24(snap_compare, runs_folder):
    assert snap_compare(picker(runs_folder), terminal_size=(80, 24), run_before=compared)


def test_compare_200x50(snap_compare, runs_folder):
    assert snap_compare(picker(runs_folder), terminal_size=(200, 50), run_before=compared)


def test_compare_ascii_80x24(snap_compare, runs_folder):
    assert snap_compare(picker(runs_folder, ascii=True), terminal_size=(80, 24), run_before=compared)
