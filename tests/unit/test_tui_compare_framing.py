"""The comparison's default view: short runs beside a far longer one fill the axis (the long run cut where
they end, and the chart says so), `0` shows every run whole, a zoom is kept as the runs grow, runs of
similar lengths show whole, the y axis fits what is in view; by step and wall time, alone and in the grid.
Pilot on hand-written runs (tideborn.tui.testing)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.helpers.common import until
from tests.helpers.tui import compared, options
from tideborn.humanize import compact
from tideborn.rundir.events import encode_event
from tideborn.tui import framing
from tideborn.tui.app import create_app
from tideborn.tui.plotting import Y_LABEL_WIDTH
from tideborn.tui.screens import compare
from tideborn.tui.testing import FIXTURE_START, SECONDS_PER_LOGGED_STEP, write_small_run

pytestmark = pytest.mark.usefixtures("utc")

SPIKE_STEP, SPIKE = 500, 1000.0
"""The long run's loss at one step past the short runs' end: what the y axis must not fit while cut."""


def long_run(run_dir, last_step: int = 1500, spike: bool = False) -> None:
    """A live run (no terminal event) of `last_step` steps; with `spike`, a loss of SPIKE at SPIKE_STEP."""
    write_small_run(run_dir, last_step=last_step, end=None, checkpoints=())
    if not spike:
        return
    events = run_dir / "events.jsonl"
    lines = events.read_bytes().splitlines(keepends=True)
    for number, line in enumerate(lines):
        record = json.loads(line)
        if record["kind"] == "step" and record["step"] == SPIKE_STEP:
            fields = {key: value for key, value in record.items() if key not in ("v", "time", "kind")}
            lines[number] = encode_event("step", {**fields, "loss": SPIKE}, now=record["time"])
    events.write_bytes(b"".join(lines))


@pytest.fixture(autouse=True)
def quick_follow(monkeypatch):
    """The runs read for new events every quarter second, not every two: the tests wait for refreshes."""
    monkeypatch.setattr(compare, "FOLLOW_SECONDS", 0.25)


@pytest.fixture
def runs_folder(tmp_path):
    """Three 60-step runs (started a second apart) and one of 1,500 steps, live, with a spike at step 500."""
    folder = tmp_path / "runs"
    for number, (name, scale) in enumerate((("a", 0.6), ("b", 0.8), ("c", 1.2)), start=1):
        write_small_run(folder / name, last_step=60, scale=scale, start=FIXTURE_START + number, checkpoints=())
    long_run(folder / "long", spike=True)
    return folder


def append_steps(run_dir, steps, seconds: float = 0.0) -> None:
    with open(run_dir / "events.jsonl", "ab") as handle:
        for step in steps:
            handle.write(encode_event("step", {"step": step, "loss": 1.0, "policy_loss": 0.7, "value_loss": 0.3},
                                      now=FIXTURE_START + seconds + step))


def clock(moment: float, length: int = 8) -> str:
    """A wall time as the axis writes it (UTC in these tests): with seconds for spans under three minutes."""
    return time.strftime("%H:%M:%S", time.gmtime(moment))[:length]


def lines_of(chart) -> list[str]:
    return chart.render().plain.split("\n")


def x_labels(chart) -> list[str]:
    return lines_of(chart)[-1].split()


def loaded_series(screen, run: str, name: str):
    return next(r.history.series[name] for r in screen.loaded if r.run.name == run)


async def test_short_runs_beside_a_long_one_fill_the_axis_and_the_cut_follows_them(runs_folder):
    async with create_app(options(runs_folder=runs_folder, follow=True)).run_test(size=(80, 24)) as pilot:
        screen = await compared(pilot, 4)
        chart = screen.chart
        assert chart.span() == (5.0, 60.0)  # not 5-1500: the 60-step runs were in its first 4%
        assert x_labels(chart)[0] == "5" and x_labels(chart)[-1] == "60"
        assert "cut 5-60 of 1500, 0: all" in lines_of(chart)[0]
        # The short runs reach the right edge of the plot: their last tenth of the columns has their curves.
        rows = lines_of(chart)[1:-2]
        right = [row[Y_LABEL_WIDTH + (len(row) - Y_LABEL_WIDTH) * 9 // 10:] for row in rows]
        assert sum(ch.strip() not in ("", "\u2800") for part in right for ch in part) >= 5, "\n".join(rows)
        # A short run goes on: the cut follows its end (the view is the default one, not a zoom).
        append_steps(runs_folder / "a", range(65, 85, 5))
        await until(pilot, lambda: chart.span() == (5.0, 80.0), "the cut to follow run a", timeout=20)
        assert chart.zoom is None and "cut 5-80 of 1500" in lines_of(chart)[0]


async def test_zero_shows_every_run_whole_and_again_the_cut_view(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(80, 24)) as pilot:
        screen = await compared(pilot, 4)
        chart = screen.chart
        assert chart.span() == (5.0, 60.0)
        await pilot.press("0")
        assert chart.span() == (5.0, 1500.0) and x_labels(chart)[-1] == "1500"
        assert "cut" not in lines_of(chart)[0] and "all]" in lines_of(chart)[0]
        await pilot.press("0")  # the default, cut view again
        assert chart.span() == (5.0, 60.0)
        # Zoomed out from the cut view as far as it goes: all of it, not back to the cut.
        for _ in range(8):
            await pilot.press("minus")
        assert chart.zoom is None and chart.span() == (5.0, 1500.0)
        await pilot.press("plus", "0")  # from a zoom, 0 shows all
        assert chart.zoom is None and chart.span() == (5.0, 1500.0)


async def test_a_zoom_of_the_cut_view_is_kept_as_the_runs_grow(runs_folder):
    async with create_app(options(runs_folder=runs_folder, follow=True)).run_test(size=(80, 24)) as pilot:
        screen = await compared(pilot, 4)
        chart = screen.chart
        await pilot.press("plus")  # about the middle of the cut view: 55 steps wide, halved
        zoom = chart.zoom
        assert zoom is not None and zoom[1] - zoom[0] == pytest.approx(27.5) and 5.0 <= zoom[0] < zoom[1] <= 60.0
        polls = screen.polls
        append_steps(runs_folder / "a", range(65, 85, 5))
        append_steps(runs_folder / "long", range(1505, 1600, 5))
        await until(pilot, lambda: len(loaded_series(screen, "long", "loss")) == 319 and screen.polls > polls,
                    "the new steps read, and a refresh after them", timeout=20)
        await pilot.pause()
        assert chart.zoom == zoom and chart.span() == zoom
        assert "zoom" in lines_of(chart)[0] and "cut" not in lines_of(chart)[0]
        # Panning goes on past the short runs' end, into the long run (the data's whole range is the limit).
        for _ in range(12):
            await pilot.press("right_square_bracket")
        assert chart.zoom[1] > 60.0


async def test_runs_of_similar_length_show_whole_until_one_is_over_four_times_the_other(tmp_path):
    folder = tmp_path / "runs"
    write_small_run(folder / "short", last_step=100, checkpoints=())
    long_run(folder / "long", last_step=350)  # 345 steps against 95: 3.6 times
    async with create_app(options(runs_folder=folder, follow=True)).run_test(size=(80, 24)) as pilot:
        screen = await compared(pilot, 2)
        chart = screen.chart
        assert chart.span() == (5.0, 350.0) and x_labels(chart)[-1] == "350"
        assert "cut" not in lines_of(chart)[0]
        append_steps(folder / "long", range(355, 455, 5), seconds=2 * 350)  # 445 steps against 95: 4.7 times
        await until(pilot, lambda: chart.span() == (5.0, 100.0), "the long run to be cut", timeout=20)
        assert "cut 5-100 of 450" in lines_of(chart)[0]


async def test_the_y_axis_fits_what_is_in_view(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(80, 24)) as pilot:
        screen = await compared(pilot, 4)
        chart = screen.chart
        in_view = []
        for run in ("a", "b", "c", "long"):
            series = loaded_series(screen, run, "loss")
            steps, values = series.x.view, series.y.view
            in_view.append(values[(steps >= 5) & (steps <= 60)])
        top = lines_of(chart)[1][:Y_LABEL_WIDTH - 1].strip()
        assert top == compact(float(np.max(np.concatenate(in_view)))), top  # not the spike at step 500
        await pilot.press("0")
        assert lines_of(chart)[1][:Y_LABEL_WIDTH - 1].strip() == compact(SPIKE)


async def test_the_cut_by_wall_time_and_in_the_grid(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(200, 50)) as pilot:
        screen = await compared(pilot, 4)
        chart = screen.chart
        await pilot.press("g")
        assert chart.showing_grid()
        drawn = chart.render().plain
        # Every chart is cut where the short runs end: none of them runs on to step 1500.
        assert drawn.count("cut 5-60 of 1500") == len(screen.metrics()) >= 5, drawn
        assert drawn.count("1500") == drawn.count("of 1500")
        assert chart.span() == (5.0, 60.0)
        # By wall time: the short runs took 24 s each (started 1-3 s after the long run, which took 600 s).
        await pilot.press("t")
        first, last = FIXTURE_START + 1 + SECONDS_PER_LOGGED_STEP, FIXTURE_START + 3 + 12 * SECONDS_PER_LOGGED_STEP
        assert chart.span() == pytest.approx((first, last))
        drawn = chart.render().plain
        cut = f"cut {clock(first)}-{clock(last)} of {clock(FIXTURE_START + 300 * SECONDS_PER_LOGGED_STEP, 5)}"
        assert drawn.count(cut) == len(screen.metrics()), drawn
        await pilot.press("g")  # one chart alone, by wall time: the same cut
        assert chart.span() == pytest.approx((first, last))
        assert cut in lines_of(chart)[0]
        await pilot.press("0")
        assert chart.span() == pytest.approx((first, FIXTURE_START + 300 * SECONDS_PER_LOGGED_STEP))


async def test_by_wall_time_a_long_run_that_ran_after_the_others_is_not_cut_out_of_view(tmp_path):
    folder = tmp_path / "runs"
    write_small_run(folder / "short", last_step=60, checkpoints=())
    later = FIXTURE_START + 3600  # an hour after the short run
    write_small_run(folder / "long", last_step=1500, end=None, checkpoints=(), start=later)
    async with create_app(options(runs_folder=folder)).run_test(size=(80, 24)) as pilot:
        screen = await compared(pilot, 2)
        chart = screen.chart
        assert chart.span() == (5.0, 60.0)  # by step they overlap: cut
        await pilot.press("t")  # by wall time a cut to the short run's minute would show none of the long run
        assert chart.span() == pytest.approx((FIXTURE_START + SECONDS_PER_LOGGED_STEP,
                                              later + 300 * SECONDS_PER_LOGGED_STEP))
        assert "cut" not in lines_of(chart)[0]


def test_the_shortest_run_fills_at_least_a_quarter_of_the_axis_whatever_the_others() -> None:
    # 60 steps beside 1,500 and 7,000, or beside 1,500 and 1,600: the first 60 shown, the longer runs cut there
    assert framing.framed_range([(0.0, 60.0), (0.0, 1500.0), (0.0, 7000.0)]) == (0.0, 60.0)
    assert framing.framed_range([(0.0, 60.0), (0.0, 1500.0), (0.0, 1600.0)]) == (0.0, 60.0)
    assert framing.framed_range([(0.0, 60.0), (0.0, 200.0), (0.0, 700.0), (0.0, 2500.0)]) == (0.0, 200.0)
    # runs of similar lengths beside one far longer: cut to them; of similar lengths alone: all shown
    assert framing.framed_range([(0.0, 1000.0), (0.0, 1500.0), (0.0, 9000.0)]) == (0.0, 1500.0)
    assert framing.framed_range([(0.0, 1000.0), (0.0, 1500.0)]) is None
