"""What the dashboard looks like for a fixed run directory, at the size of an SSH terminal (80x24), big
ones (160x48, 200x50: the charts in a grid), in ASCII mode, each chart alone at 80x24, and the cursor
and zoom. Update with `pytest tests/unit/test_tui_snapshots.py --snapshot-update` after checking the new
pictures (snapshot_report.html shows the differences).

The pictures are taken once the plot has drawn every point read (not only once the run is read: the
plot redraws at most once a second, and a picture taken before that showed "no step events yet" for a
run at step 400). `test_snapshots_show_the_curves` checks the same drawing has the curves in it, so a
picture of empty charts can never be accepted as the reference by mistake."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tideborn.tui.app import create_app
from tideborn.tui.options import TuiOptions
from tideborn.tui.testing import FIXTURE_NOW, write_fixture_run, write_small_run
from tideborn.tui.widgets.loss_plot import GROUPS

BRAILLE = range(0x2801, 0x2900)

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
    while not (screen.ready.is_set() and screen.query_one("#gpu").sample is not None
               and screen.history.points() and screen.plot.drawn_points == screen.history.points()
               and not screen.plot.redraw_pending):
        if time.monotonic() > deadline:
            pytest.fail("the dashboard never finished reading and drawing the fixture run")
        await pilot.pause(0.02)
    await pilot.pause()


def pressing(*keys):
    async def run_before(pilot) -> None:
        await attached(pilot)
        for key in keys:
            await pilot.press(key)
        await pilot.pause()
    return run_before


def test_dashboard_80x24(snap_compare, fixture_run):
    assert snap_compare(dashboard(fixture_run), terminal_size=(80, 24), run_before=attached)


def test_dashboard_160x48(snap_compare, fixture_run):
    assert snap_compare(dashboard(fixture_run), terminal_size=(160, 48), run_before=attached)


def test_dashboard_ascii_80x24(snap_compare, fixture_run):
    assert snap_compare(dashboard(fixture_run, ascii=True), terminal_size=(80, 24), run_before=attached)


def test_dashboard_200x50_grid(snap_compare, fixture_run):
    assert snap_compare(dashboard(fixture_run), terminal_size=(200, 50), run_before=attached)


@pytest.mark.parametrize("number", range(1, len(GROUPS)))
def test_each_chart_alone_80x24(snap_compare, fixture_run, number):
    """g shows the next chart: accuracy, learning rate, grad norm, throughput, data wait (losses first)."""
    assert snap_compare(dashboard(fixture_run), terminal_size=(80, 24), run_before=pressing(*["g"] * number))


def test_cursor_and_zoom_200x50(snap_compare, fixture_run):
    """Zoomed in twice about the cursor, moved two cells right: the legends read the values there."""
    assert snap_compare(dashboard(fixture_run), terminal_size=(200, 50),
                        run_before=pressing("v", "plus", "plus", "right_square_bracket", "right_square_bracket"))


@pytest.mark.parametrize("size, charts", [((80, 24), 1), ((160, 48), len(GROUPS)), ((200, 50), len(GROUPS))])
async def test_snapshots_show_the_curves(fixture_run, size, charts):
    """What the pictures above show, as text: every chart of the fixture has its curve (braille dots in
    its rows), not "no step events yet"."""
    async with dashboard(fixture_run).run_test(size=size) as pilot:
        await attached(pilot)
        plot = pilot.app.screen.plot
        text = plot.last_text.plain
        shown = plot.shown_charts()
    assert "no step events yet" not in text and "nothing logged yet" not in text
    assert len(shown) == charts and all(chart.curves for chart in shown)
    assert sum(ord(c) in BRAILLE for c in text) > 100, text
    for chart in shown:
        assert chart.title in text


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
