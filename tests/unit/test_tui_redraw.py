"""The charts are drawn again only where their data changed: a chart whose curves, x range, size and view are as
they were is taken from the cache, and new data repaints only the charts whose picture it changes (following a
live run costs what changed, not the whole grid). Counts of drawings and repaints, never times."""

from __future__ import annotations

import pytest

from tests.helpers.common import until
from tests.helpers.tui import app_for, attached
from tideborn.tui.history import RunHistory
from tideborn.tui.messages import EventsArrived
from tideborn.tui.plotting import ChartCache, PlotOptions, grid_cells, grid_shape
from tideborn.tui.testing import FIXTURE_NOW, write_fixture_run
from tideborn.tui.widgets import loss_plot
from tideborn.tui.widgets.loss_plot import GROUPS, LossPlot

STEP_CHARTS = {"losses", "learning rate", "grad norm", "throughput", "data wait"}
"""The charts a `step` event adds points to; `accuracy` has eval points only."""


def step_event(step: int, when: float) -> dict:
    return {"v": 1, "time": when, "kind": "step", "step": step, "loss": 2.5, "policy_loss": 2.0, "value_loss": 0.5,
            "grad_norm": 3.0, "lr": 0.02, "positions_per_second": 3000.0, "data_wait_seconds": 0.4,
            "compute_seconds": 1.6, "steps": 5}


def eval_event(step: int, when: float) -> dict:
    return {"v": 1, "time": when, "kind": "eval", "step": step, "policy_loss": 1.0, "value_loss": 0.2,
            "policy_accuracy": 0.9, "value_accuracy": 0.95, "positions": 8192}


def charts_of(history: RunHistory) -> list:
    plot = LossPlot(history, PlotOptions())
    return plot.charts()


def test_an_unchanged_chart_is_not_drawn_again():
    history = RunHistory()
    history.add([step_event(step, 1000.0 + step) for step in range(5, 205, 5)] + [eval_event(100, 1100.0)])
    cache = ChartCache()
    options = PlotOptions(x_range=(0.0, 400.0))  # a fixed x range (zoomed): only data can change a chart
    shape = grid_shape(len(GROUPS), 200, 48)
    assert shape is not None

    def draw() -> dict[str, list]:
        cells = grid_cells(charts_of(history), list(history.markers), options, 200, 48, shape, cache)
        return {cell.chart.title: cell.lines for cell in cells}

    first = draw()
    assert set(cache.draws) == {title for title, _names in GROUPS} and set(cache.draws.values()) == {1}
    again = draw()
    assert set(cache.draws.values()) == {1}, "nothing changed: no chart is drawn again"
    assert again == first

    history.add([eval_event(200, 1200.0)])
    after_eval = draw()
    assert cache.draws["accuracy"] == cache.draws["losses"] == 2  # eval points are in both
    assert all(cache.draws[title] == 1 for title in STEP_CHARTS - {"losses"})
    assert after_eval["accuracy"] != first["accuracy"]

    history.add([step_event(205, 1205.0)])
    draw()
    assert all(cache.draws[title] == 3 if title == "losses" else cache.draws[title] == 2 for title in STEP_CHARTS)
    assert cache.draws["accuracy"] == 2, "a step event adds nothing to the accuracy chart"


@pytest.fixture
def fixture_run(tmp_path):
    run_dir = tmp_path / "fixture"
    write_fixture_run(run_dir)
    return run_dir


async def settled(pilot, plot: LossPlot) -> None:
    """The events posted handled, and the redraw they scheduled (at most once a second) done."""
    await pilot.pause()
    await until(pilot, lambda: not plot.redraw_pending, "the plot's scheduled redraw")
    await pilot.pause()


async def test_new_data_repaints_only_the_charts_it_changes(fixture_run, monkeypatch):
    monkeypatch.setattr(loss_plot, "MIN_REDRAW_INTERVAL", 0.1)  # the pace is not what is tested: keep it short
    async with app_for(fixture_run).run_test(size=(200, 50)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        await settled(pilot, plot)
        assert plot.showing_grid()
        plot.zoom = (0.0, 600.0)  # the x range held still, as a long run's is between two columns' worth of steps
        plot.refresh()
        await pilot.pause()
        drawn, renders, repaints = dict(plot.chart_draws), plot.draws, dict(plot.repaints)
        when = FIXTURE_NOW + 10

        screen.post_message(EventsArrived([{"v": 1, "time": when, "kind": "gpu", "step": 400, "devices": []}]))
        await settled(pilot, plot)
        assert dict(plot.chart_draws) == drawn and plot.draws == renders, "no new points: nothing is drawn"

        screen.post_message(EventsArrived([eval_event(450, when + 1)]))
        await settled(pilot, plot)
        assert {title for title in plot.chart_draws if plot.chart_draws[title] != drawn[title]} == {"losses",
                                                                                                  "accuracy"}
        assert {title for title in plot.repaints if plot.repaints[title] != repaints.get(title, 0)} == {
            "losses", "accuracy"}, plot.repaints

        repaints = dict(plot.repaints)
        screen.post_message(EventsArrived([step_event(550, when + 2)]))
        await settled(pilot, plot)
        assert plot.repaints["accuracy"] == repaints.get("accuracy", 0)
        assert all(plot.repaints[title] == repaints.get(title, 0) + 1 for title in STEP_CHARTS), plot.repaints

        drawn, repaints = dict(plot.chart_draws), dict(plot.repaints)
        screen.post_message(EventsArrived([step_event(650, when + 3)]))  # right of the zoomed range: not on screen
        await settled(pilot, plot)
        assert {title for title in plot.chart_draws if plot.chart_draws[title] != drawn[title]} == STEP_CHARTS
        assert dict(plot.repaints) == repaints, "drawn again, the step charts came out as they were: none repainted"
