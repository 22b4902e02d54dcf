"""The Elo chart (the `match` events, the 95% interval shaded behind the curve) on the dashboard and in the
comparison; sparse points (eval, match) drawn as markers; curves of one chart in colours far apart (Pilot
and the plotting functions, on hand-written runs)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from textual.color import Color, rgb_to_lab

from tests.helpers.common import until
from tests.helpers.tui import app_for, attached, options
from tideborn.tui.app import create_app
from tideborn.tui.history import ELO_SERIES, RunHistory
from tideborn.tui.plotting import POINT_GLYPH, Curve, PlotOptions, render_plot
from tideborn.tui.screens.compare import RUN_STYLES, CompareScreen
from tideborn.tui.testing import FIXTURE_START, match_fields, write_small_run
from tideborn.tui.widgets.loss_plot import CURVES, ELO_GROUP, GROUPS

pytestmark = pytest.mark.usefixtures("utc")

ELO_COLOUR = dict((name, colour) for name, _label, colour, _glyph in CURVES)[ELO_SERIES]
MIN_DISTANCE = 45.0
"""CIE76 distance (CIELAB) between two curves of one chart: the earlier palette had pairs at 16-31."""


@pytest.fixture
def match_run(tmp_path):
    run = tmp_path / "runs" / "elo"
    write_small_run(run, last_step=300, match_every=50, end=None)
    return run


def lab_distance(a: str, b: str) -> float:
    la, lb = rgb_to_lab(Color.parse(a)), rgb_to_lab(Color.parse(b))
    return math.dist((la.L, la.a, la.b), (lb.L, lb.a, lb.b))


def test_curves_of_one_chart_have_colours_far_apart():
    colours = {name: colour for name, _label, colour, _glyph in CURVES}
    for title, names in GROUPS + (ELO_GROUP,):
        for a, b in itertools.combinations(names, 2):
            assert lab_distance(colours[a], colours[b]) >= MIN_DISTANCE, (title, a, b)
    for a, b in itertools.combinations(RUN_STYLES, 2):  # the runs of a comparison share every chart
        assert lab_distance(a, b) >= MIN_DISTANCE, (a, b)


def elo_history(*matches: dict) -> RunHistory:
    history = RunHistory()
    history.add([{"kind": "match", "time": FIXTURE_START + i, **fields} for i, fields in enumerate(matches)])
    return history


def elo_curve(history: RunHistory) -> Curve:
    return Curve(history.series[ELO_SERIES], "elo", ELO_COLOUR, "E", points=True, band=history.elo_interval.band())


def test_the_interval_is_drawn_as_a_band_behind_the_curve():
    history = elo_history(*(match_fields(step) for step in (50, 100, 150, 200)))
    text = render_plot([elo_curve(history)], [], PlotOptions(), 60, 16)
    lines = text.plain.split("\n")
    top, bottom = lines[1][:8].strip(), lines[-3][:8].strip()
    # The y range is the interval's, not the curve's alone: from the lowest low to the highest high.
    assert float(bottom) == pytest.approx(-70, abs=0.5)
    assert float(top) == pytest.approx(match_fields(200)["elo_high"], abs=0.5)
    styles = {str(span.style) for span in text.spans}
    assert f"dim {ELO_COLOUR}" in styles and ELO_COLOUR in styles  # the band, faint; the curve over it
    # The band fills the rows between the bounds: at the last match, from its high to its low row.
    last_column = max(i for i, ch in enumerate(lines[1]) if ch != " ")
    filled = [row for row, line in enumerate(lines[1:-2]) if last_column < len(line) and line[last_column] != " "]
    assert len(filled) >= 4, filled


def test_an_infinite_bound_reaches_the_chart_edge():
    history = elo_history(match_fields(50), {**match_fields(100), "elo_high": "inf"})
    assert history.elo_interval.high[-1] == math.inf
    text = render_plot([elo_curve(history)], [], PlotOptions(), 60, 12)
    lines = text.plain.split("\n")
    canvas_top = lines[1][9:]
    assert canvas_top.rstrip()[-1] != " "  # the band of the last match reaches the top row


def test_eval_points_are_drawn_as_markers_not_single_dots():
    history = RunHistory()
    history.add([{"kind": "eval", "step": step, "time": FIXTURE_START + step, "policy_loss": 3.0 - step / 100}
                 for step in (100, 200, 300, 400)])
    curve = Curve(history.series["eval_policy_loss"], "eval-pol", "#d55e00", "P", points=True)
    text = render_plot([curve], [], PlotOptions(), 60, 12)
    assert text.plain.count(POINT_GLYPH) == 4
    # Many points in view (more than one per two cells): a line, no row of markers.
    dense = RunHistory()
    dense.add([{"kind": "eval", "step": step, "time": 0.0, "policy_loss": 1.0} for step in range(1, 200)])
    crowded = Curve(dense.series["eval_policy_loss"], "eval-pol", "#d55e00", "P", points=True)
    assert POINT_GLYPH not in render_plot([crowded], [], PlotOptions(), 60, 12).plain


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_the_dashboard_has_an_elo_chart(match_run, size):
    async with app_for(match_run).run_test(size=size) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        assert [title for title, _names in plot.groups()] == [title for title, _ in GROUPS] + [ELO_GROUP[0]]
        if size == (200, 50):
            assert plot.showing_grid()
        else:
            for _ in range(len(GROUPS)):
                await pilot.press("g")
            assert plot.chart_name() == f"7/7 {ELO_GROUP[0]}"
        drawn = plot.render()
        assert ELO_GROUP[0] in drawn.plain
        styles = {str(span.style) for span in drawn.spans}
        assert f"dim {ELO_COLOUR}" in styles  # the interval
        elo_rows = [line for line in drawn.plain.split("\n") if POINT_GLYPH in line]
        assert elo_rows  # the matches (and evals) as markers
        # The cursor reads the Elo at a match.
        await pilot.press("v")
        assert any(c.label == "elo" for c in plot.curves())
        assert "elo " in plot.render().plain


async def test_a_run_without_matches_has_no_elo_chart(tmp_path):
    run = tmp_path / "plain"
    write_small_run(run, last_step=100)
    async with app_for(run).run_test(size=(200, 50)) as pilot:
        screen = await attached(pilot)
        assert len(screen.plot.groups()) == len(GROUPS)
        assert ELO_GROUP[0] not in screen.plot.render().plain


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_compare_has_the_elo_chart_with_each_runs_interval(tmp_path, size):
    folder = tmp_path / "runs"
    write_small_run(folder / "a", last_step=300, match_every=50)
    write_small_run(folder / "b", last_step=200, scale=1.3, match_every=40, start=FIXTURE_START + 50)
    async with create_app(options(runs_folder=folder)).run_test(size=size) as pilot:
        picker = pilot.app.screen
        await until(pilot, picker.ready.is_set, "the runs")
        await pilot.press("space", "down", "space", "c")
        screen = pilot.app.screen
        assert isinstance(screen, CompareScreen)
        await until(pilot, lambda: screen.ready, "the runs' histories")
        await pilot.press("p")  # the last metric: the Elo
        assert screen.metric == (ELO_SERIES, "Elo vs reference")
        drawn = screen.chart.render()
        styles = {str(span.style) for span in drawn.spans}
        for colour in RUN_STYLES[:2]:
            assert f"dim {colour}" in styles and colour in styles  # each run's band and curve
        assert all(c.band is not None and len(c.band.x) for c in screen.chart.curves())
        assert drawn.plain.count(POINT_GLYPH) >= 6
        legend = str(screen.query_one("#compare-legend").render())
        assert "at step 300 (6 points)" in legend and "at step 200 (5 points)" in legend
        assert np.isfinite(screen.chart.span()).all()
