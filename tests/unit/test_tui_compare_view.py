"""The comparison as a full view (live overlay, zoom and pan, the value cursor, metrics, step or wall time,
every metric in a grid, short runs at their own scale) and what makes 80x24 usable (maximise, hide single
curves, notifications beside the chart, never over it). Pilot on hand-written runs, at 80x24 and 200x50."""

from __future__ import annotations

import re

import pytest
from textual.geometry import Region

from tests.helpers.common import until
from tests.helpers.tui import app_for, attached, compared, options
from tideborn.rundir.events import encode_event
from tideborn.tui.app import create_app
from tideborn.tui.screens.compare import CompareScreen
from tideborn.tui.screens.curves import CurvePickerScreen
from tideborn.tui.testing import FIXTURE_START, write_fixture_run, write_small_run

pytestmark = pytest.mark.usefixtures("utc")


@pytest.fixture
def runs_folder(tmp_path):
    folder = tmp_path / "runs"
    write_small_run(folder / "alpha", last_step=60, scale=0.6, end=None, start=FIXTURE_START + 100)
    write_small_run(folder / "bravo", last_step=100, scale=1.0, start=FIXTURE_START)
    write_small_run(folder / "charlie", last_step=150, scale=1.4, start=FIXTURE_START + 1000, match_every=50)
    return folder


async def open_compare(pilot, count: int = 3) -> CompareScreen:
    return await compared(pilot, count)


def x_labels(text) -> list[str]:
    return text.plain.split("\n")[-1].split()


def uncovered(screen, widget) -> bool:
    """Is every cell of `widget` drawn by it (no notification, nothing else, on top)?"""
    region = widget.region
    assert region.area > 0
    return all(screen.get_widget_at(x, y)[0] is widget for y in range(region.y, region.bottom)
               for x in range(region.x, region.right))


async def test_the_overlay_follows_live_runs(runs_folder):
    async with create_app(options(runs_folder=runs_folder, follow=True)).run_test(size=(80, 24)) as pilot:
        screen = await open_compare(pilot)
        before = [len(c.series) for c in screen.chart.curves()]
        assert before == [12, 20, 30]
        events = runs_folder / "alpha" / "events.jsonl"
        with open(events, "ab") as handle:
            for step in range(65, 90, 5):
                handle.write(encode_event("step", {"step": step, "loss": 1.0, "policy_loss": 0.7, "value_loss": 0.3},
                                          now=FIXTURE_START + 500 + step))
            handle.write(encode_event("run_finished", {"step": 85}, now=FIXTURE_START + 600))
        await until(pilot, lambda: len(screen.chart.curves()[0].series) == 17, "alpha's new steps", timeout=20)
        legend = str(screen.query_one("#compare-legend").render()).split("\n")
        assert "finished" in legend[0] and "at step 85 (17 points)" in legend[0]
        assert x_labels(screen.chart.render())[0] == "5"


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_zoom_pan_and_the_value_cursor(runs_folder, size):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=size) as pilot:
        screen = await open_compare(pilot)
        chart = screen.chart
        assert chart.span() == (5.0, 150.0)
        await pilot.press("plus")
        assert chart.zoom is not None and chart.zoom[1] - chart.zoom[0] == pytest.approx(72.5)
        assert "zoom" in chart.render().plain.split("\n")[0]
        zoomed = chart.zoom
        await pilot.press("left_square_bracket")
        assert chart.zoom[0] < zoomed[0]
        await pilot.press("0")
        assert chart.zoom is None
        # The cursor: every run's value at one step, in the plot's legend and in the runs' legend below.
        await pilot.press("v")
        assert chart.cursor is not None
        at = chart.cursor
        await pilot.press("right_square_bracket")
        assert chart.cursor > at
        legend = str(screen.query_one("#compare-legend").render()).split("\n")
        step = int(chart.cursor)
        assert f"at step {step}" in legend[1] and f"at step {step}" in legend[2]
        assert "at step 60" in legend[0] or chart.cursor <= 60  # alpha ends at 60: its nearest point
        first = chart.render().plain.split("\n")[0]
        assert re.search(r"alpha [\d.]+", first) and re.search(r"bravo [\d.]+", first), first


async def test_metrics_and_step_or_wall_time(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(100, 30)) as pilot:
        screen = await open_compare(pilot)
        await pilot.press("n")
        assert screen.metric == ("policy_loss", "policy loss")
        title = str(screen.query_one("#compare-title").render())
        assert "policy loss (2/10)" in title
        await pilot.press("p", "p")
        assert screen.metric[0] == "elo"  # charlie played matches
        await pilot.press("n")
        # Wall time: x is the events' clock, so runs that ran at the same time line up; charlie started
        # 1000 s after bravo and ends last.
        await pilot.press("t")
        assert screen.chart.options.wall_time
        span = screen.chart.span()
        assert span[0] == pytest.approx(FIXTURE_START + 2.0) and span[1] > FIXTURE_START + 1000
        labels = x_labels(screen.chart.render())
        assert all(re.fullmatch(r"\d\d:\d\d", label) for label in labels), labels
        await pilot.press("t")
        assert x_labels(screen.chart.render()) == ["5", "78", "150"]


async def test_every_metric_in_a_grid_at_200x50_and_short_runs_at_their_own_scale(tmp_path):
    folder = tmp_path / "runs"
    write_small_run(folder / "long", last_step=2000, checkpoints=())
    write_small_run(folder / "short", last_step=100, match_every=25, start=FIXTURE_START + 10)
    async with create_app(options(runs_folder=folder)).run_test(size=(200, 50)) as pilot:
        screen = await open_compare(pilot, count=2)
        await pilot.press("g")
        chart = screen.chart
        assert chart.showing_grid()
        assert "all 10 metrics" in str(screen.query_one("#compare-title").render())
        drawn = chart.render().plain
        for _name, label in screen.metrics():
            assert label[:12] in drawn, label
        # The Elo is only the short run's: its chart spans that run's matches (25-100), not 5-2000.
        elo = next(i for i, (name, _label) in enumerate(screen.metrics()) if name == "elo")
        await pilot.press("g", *["n"] * elo)
        assert screen.metric[0] == "elo" and not chart.showing_grid()
        assert x_labels(chart.render()) == ["25", "62", "100"]


async def test_the_grid_needs_room_and_says_so_at_80x24(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(80, 24), notifications=True) as pilot:
        screen = await open_compare(pilot)
        await pilot.press("g")
        assert not screen.chart.showing_grid()
        await until(pilot, lambda: list(screen.query("Toast")), "the notification")
        await pilot.pause(0.2)
        assert uncovered(screen, screen.chart)


async def test_hide_single_runs_in_compare(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(80, 24)) as pilot:
        screen = await open_compare(pilot)
        await pilot.press("h")
        assert isinstance(pilot.app.screen, CurvePickerScreen)
        await pilot.press("space", "escape")  # alpha, the first, unchecked
        assert pilot.app.screen is screen
        assert screen.chart.hidden == {"alpha"}
        assert [c.label for c in screen.chart.curves()] == ["bravo", "charlie"]
        assert "hidden (h)" in str(screen.query_one("#compare-legend").render()).split("\n")[0]
        await pilot.press("h", "space", "escape")
        assert not screen.chart.hidden


@pytest.fixture
def fixture_run(tmp_path):
    run = tmp_path / "run"
    write_fixture_run(run)
    return run


async def test_hide_single_curves_on_the_dashboard(fixture_run):
    async with app_for(fixture_run).run_test(size=(80, 24)) as pilot:
        screen = await attached(pilot)
        assert [c.label for c in screen.plot.curves()][:3] == ["loss", "policy", "value"]
        await pilot.press("h", "down", "space", "escape")  # policy
        assert screen.plot.hidden == {"policy_loss"}
        assert [c.label for c in screen.plot.curves()][:2] == ["loss", "value"]
        assert "policy" not in screen.plot.render().plain.split("\n")[0]


async def test_the_maximise_key_gives_the_charts_then_the_log_the_whole_screen(fixture_run):
    async with app_for(fixture_run).run_test(size=(80, 24)) as pilot:
        screen = await attached(pilot)
        plot, log, lower = screen.plot, screen.query_one("#log"), screen.query_one("#lower")
        normal = plot.region.height
        await pilot.press("z")
        await pilot.pause()
        assert not lower.display and plot.region.height == 24 - 2 - 1  # all but the header and the footer
        assert plot.region.height > normal
        await pilot.press("z")
        await pilot.pause()
        assert not plot.display and log.region.height >= 24 - 2 - 1 - 1 and log.has_focus
        await pilot.press("z")
        await pilot.pause()
        assert plot.display and lower.display and plot.region.height == normal


@pytest.mark.parametrize("maximised", [False, True])
async def test_notifications_never_cover_the_chart(fixture_run, maximised):
    async with app_for(fixture_run).run_test(size=(80, 24), notifications=True) as pilot:
        screen = await attached(pilot)
        if maximised:
            await pilot.press("z")
        for number in range(4):  # several at once, some long: they stack up
            pilot.app.notify(f"notification {number}: " + "a long message that wraps over several lines " * 2,
                             timeout=30)
        await pilot.press("l")  # and one of the view keys' own
        await until(pilot, lambda: len(screen.query("Toast")) == 5, "the notifications")
        await pilot.pause(0.2)
        assert uncovered(screen, screen.plot)
        shown = [toast for toast in screen.query("Toast")
                 if any(screen.get_widget_at(x, y)[0] is toast for x, y in cells(toast.region, screen.region))]
        assert shown  # they are seen, beside the chart


def cells(region: Region, inside: Region):
    region = region.intersection(inside)
    return ((x, y) for y in range(region.y, region.bottom) for x in range(region.x, region.right))
