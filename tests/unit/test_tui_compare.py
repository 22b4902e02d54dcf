"""The run picker's marking, sorting and filtering; the comparison of runs on one plot; a run's eval table
and checkpoint list (resume and export from it); and keys offered only where they work (Pilot).

The runs are written by hand (tideborn.tui.testing) with fixed times, a host that is not this one and a fixed
clock, so nothing depends on this machine or on when the test runs. Resuming and exporting for real
(a trainer, `tideborn export`) are the slow tests at the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.common import until
from tests.helpers.tui import dashboard, footer, notices, options
from tideborn.rundir.files import PidRecord, this_host
from tideborn.tools.train_run import main as train_run_main
from tideborn.tui.app import create_app
from tideborn.tui.screens.checkpoints import CheckpointScreen, ChoiceScreen, ExportScreen
from tideborn.tui.screens.compare import RUN_GLYPHS, RUN_STYLES, CompareScreen
from tideborn.tui.screens.dashboard import DashboardScreen
from tideborn.tui.screens.help import TextScreen
from tideborn.tui.screens.run_picker import RunPickerScreen
from tideborn.tui.testing import FIXTURE_START, write_fixture_run, write_small_run

pytestmark = pytest.mark.usefixtures("utc")  # clock times in UTC, whatever this machine's zone


@pytest.fixture
def runs_folder(tmp_path) -> Path:
    """Three runs that differ in every way the picker sorts by: names, states, steps, last events."""
    folder = tmp_path / "runs"
    write_small_run(folder / "bravo", last_step=100, scale=1.0, end="run_stopped", start=FIXTURE_START)
    write_small_run(folder / "alpha", last_step=60, scale=0.6, end="run_failed", start=FIXTURE_START + 100)
    write_small_run(folder / "charlie", last_step=150, scale=1.4, end="run_finished", start=FIXTURE_START + 1000)
    return folder


async def picker_ready(pilot) -> RunPickerScreen:
    picker = pilot.app.screen
    assert isinstance(picker, RunPickerScreen)
    await until(pilot, picker.ready.is_set, "the runs")
    await pilot.pause()
    return picker


def shown(picker: RunPickerScreen) -> list[str]:
    return [run.name for run in picker.shown]


# -- the picker: mark, sort, filter ---------------------------------------------------------------------

async def test_picker_marks_sorts_and_filters(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(100, 30)) as pilot:
        picker = await picker_ready(pilot)
        assert shown(picker) == ["alpha", "bravo", "charlie"]
        # sort: name -> last update (newest event first) -> state (STATES order) -> step (most first)
        await pilot.press("s")
        assert picker.sort == "last update" and shown(picker) == ["charlie", "alpha", "bravo"]
        await pilot.press("s")
        assert picker.sort == "state" and shown(picker) == ["charlie", "bravo", "alpha"]  # finished, stopped, failed
        await pilot.press("s")
        assert picker.sort == "step" and shown(picker) == ["charlie", "bravo", "alpha"]
        assert "sort: step" in str(picker.query_one("#picker-title").render())
        await pilot.press("s")
        assert picker.sort == "name"
        # marks: space toggles, shown in the first column; they survive sorting
        await pilot.press("space", "down", "down", "space")
        table = picker.query_one("#runs")
        marks = [str(table.get_row_at(row)[0]) for row in range(3)]
        assert marks == ["[x]", "[ ]", "[x]"]
        assert picker.marked == {str(runs_folder / "alpha"), str(runs_folder / "charlie")}
        await pilot.press("up", "space", "space")  # bravo marked, then unmarked
        assert len(picker.marked) == 2
        # state filter: cycles all -> each state present
        await pilot.press("t")
        assert picker.state_filter == "finished" and shown(picker) == ["charlie"]
        await pilot.press("t", "t")
        assert picker.state_filter == "failed" and shown(picker) == ["alpha"]
        await pilot.press("t")
        assert picker.state_filter is None and len(shown(picker)) == 3
        # name filter: / opens it, typing filters as it goes, Enter keeps it, Esc clears it
        await pilot.press("slash", "r", "a")
        assert shown(picker) == ["bravo"]  # br-a-vo; alpha has no "ra", charlie neither
        await pilot.press("enter")
        assert shown(picker) == ["bravo"] and picker.query_one("#runs").has_focus
        assert "1 runs" not in table.border_title and "2 filtered out" in table.border_title
        await pilot.press("escape")
        assert picker.name_filter == "" and len(shown(picker)) == 3
        await pilot.press("slash", "h", "escape")
        assert picker.name_filter == "" and len(shown(picker)) == 3 and table.has_focus


async def test_compare_is_offered_once_two_runs_are_marked(runs_folder):
    seen: list = []
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(100, 30), message_hook=seen.append) as pilot:
        picker = await picker_ready(pilot)
        assert "c" not in footer(picker)
        await pilot.press("space", "c")
        assert isinstance(pilot.app.screen, RunPickerScreen)
        assert any("mark two or more runs" in n.notification.message for n in notices(seen))
        await pilot.press("down", "space")
        assert footer(picker)["c"] == "compare"
        await pilot.press("c")
        screen = pilot.app.screen
        assert isinstance(screen, CompareScreen)
        assert [run.name for run in screen.runs] == ["alpha", "bravo"]
        await pilot.press("escape")
        assert pilot.app.screen is picker


# -- the comparison -------------------------------------------------------------------------------------

async def open_compare(pilot, count: int = 3) -> CompareScreen:
    picker = await picker_ready(pilot)
    for row in range(count):
        await pilot.press("space")
        if row < count - 1:
            await pilot.press("down")
    await pilot.press("c")
    screen = pilot.app.screen
    assert isinstance(screen, CompareScreen), picker
    await until(pilot, lambda: screen.ready, "the runs' histories")
    await pilot.pause()
    return screen


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_compare_overlays_three_runs_with_a_legend(runs_folder, size):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=size) as pilot:
        screen = await open_compare(pilot)
        chart = screen.chart
        assert chart.region.width == size[0] and chart.region.height >= 7
        curves = chart.curves()
        assert [c.label for c in curves] == ["alpha", "bravo", "charlie"]
        assert [c.style for c in curves] == list(RUN_STYLES[:3])
        assert [len(c.series) for c in curves] == [12, 20, 30]  # each run's own steps (every 5th)
        drawn = chart.render()
        # Each run's colour is on the canvas: three curves drawn, not one.
        styles = {str(span.style) for span in drawn.spans}
        assert all(style in styles for style in RUN_STYLES[:3]), styles
        legend = screen.query_one("#compare-legend").render()
        lines = str(legend).split("\n")
        assert len(lines) == 3
        for line, name, state in zip(lines, ("alpha", "bravo", "charlie"), ("failed", "stopped", "finished")):
            assert name in line and state in line and "at step" in line, line
        assert all(name in drawn.plain.split("\n")[0] for name in ("alpha", "bravo", "charlie"))
        assert drawn.plain.split("\n")[-1].split() == ["5", "78", "150"]  # x is the step, to the longest run
        title = str(screen.query_one("#compare-title").render())
        assert "compare 3 runs: loss (1/9)" in title and len(title) <= size[0]


async def test_compare_in_ascii_gives_each_run_its_own_glyph(runs_folder):
    app = create_app(options(runs_folder=runs_folder, ascii=True, colour=False))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_compare(pilot)
        await pilot.press("m")  # smoothing off: only the runs' own glyphs, no faint raw values
        body = "\n".join(screen.chart.render().plain.split("\n")[1:-2])
        assert body.isascii()
        for glyph in RUN_GLYPHS[:3]:
            assert glyph in body, glyph
        legend = str(screen.query_one("#compare-legend").render())
        for glyph, name in zip(RUN_GLYPHS[:3], ("alpha", "bravo", "charlie")):
            assert f"{glyph}{glyph} {name}" in legend


async def test_compare_metric_keys_cycle_through_the_metrics_the_runs_have(runs_folder):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(100, 30)) as pilot:
        screen = await open_compare(pilot)
        seen = [screen.metric[0]]
        for _ in range(9):
            await pilot.press("n")
            seen.append(screen.metric[0])
        # the fixture's step events carry lr and positions/s, not grad_norm or data wait
        assert seen == ["loss", "policy_loss", "value_loss", "eval_policy_loss", "eval_value_loss",
                        "eval_policy_accuracy", "eval_value_accuracy", "lr", "positions_per_second", "loss"]
        await pilot.press("p", "p", "p")
        assert screen.metric[0] == "eval_value_accuracy"
        plot = screen.chart.render().plain
        assert plot.startswith("eval value accuracy")
        assert [len(c.series) for c in screen.chart.curves()] == [1, 2, 3]  # an eval every 50 steps
        legend = str(screen.query_one("#compare-legend").render())
        assert "at step 150 (3 points)" in legend
        await pilot.press("l")
        assert screen.chart.options.log and "log" in screen.chart.render().plain.split("\n")[0]


async def test_compare_shows_only_metrics_some_run_has(tmp_path):
    folder = tmp_path / "runs"
    write_small_run(folder / "one", last_step=40)  # below the first eval (step 50)
    write_small_run(folder / "two", last_step=45)
    async with create_app(options(runs_folder=folder)).run_test(size=(100, 30)) as pilot:
        screen = await open_compare(pilot, count=2)
        assert [name for name, _label in screen.metrics()] == ["loss", "policy_loss", "value_loss", "lr",
                                                               "positions_per_second"]


# -- keys offered where they work, and named in help ----------------------------------------------------

@pytest.fixture
def fixture_run(tmp_path) -> Path:
    run_dir = tmp_path / "runs" / "fixture"
    write_fixture_run(run_dir)
    return run_dir


async def test_footer_offers_no_stop_and_x_says_why_on_a_finished_run(fixture_run):
    seen: list = []
    async with create_app(options(run_dir=fixture_run)).run_test(size=(100, 30), message_hook=seen.append) as pilot:
        screen = await dashboard(pilot)
        assert screen.state == "stopped"
        offered = footer(screen)
        assert "x" not in offered and "Stop" not in {b.binding.description for b in screen.active_bindings.values()
                                                     if b.binding.show and b.enabled}
        assert offered["k"] == "checkpoints"
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(pilot.app.screen, DashboardScreen)
    assert any("not running (stopped)" in n.notification.message for n in notices(seen))


@pytest.fixture
def live_run(tmp_path):
    """A run directory whose train.pid names a live process (a sleep), with checkpoints and a launch.json."""
    run_dir = tmp_path / "live"
    write_small_run(run_dir, end=None)
    process = subprocess.Popen(["sleep", "120"])
    record = PidRecord(pid=process.pid, start_time=psutil.Process(process.pid).create_time(), host=this_host(),
                       argv=["sleep", "120"], started_at=time.time())
    (run_dir / "train.pid").write_text(json.dumps(record.to_dict()))
    (run_dir / "launch.json").write_text(json.dumps({"v": 1, "config": None, "overrides": [], "flags": {},
                                                     "cwd": str(tmp_path)}))
    yield run_dir
    process.kill()
    process.wait()


async def test_a_live_run_offers_stop_but_neither_start_nor_resume(live_run):
    seen: list = []
    app = create_app(options(run_dir=live_run, clock=time.time))
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        screen = await dashboard(pilot)
        assert screen.state == "running"
        offered = footer(screen)
        assert offered["x"] == "stop" and "s" not in offered
        await pilot.press("s")
        await pilot.pause()
        assert any("running already" in n.notification.message for n in notices(seen))
        await pilot.press("k")
        checkpoints = pilot.app.screen
        assert isinstance(checkpoints, CheckpointScreen)
        await pilot.pause()
        assert "r" not in footer(checkpoints) and footer(checkpoints)["x"] == "export"
        await pilot.press("r")
        await pilot.pause()
        assert pilot.app.screen is checkpoints  # nothing asked, nothing started
        refusal = next(n for n in notices(seen) if n.notification.title == "cannot resume")
        assert refusal.notification.message.startswith("the run is running: stop it first")
        assert "\n" not in refusal.notification.message
        await pilot.press("enter")
        choice = pilot.app.screen
        assert isinstance(choice, ChoiceScreen)
        assert "r" not in footer(choice) and "resume the run" not in str(choice.query_one("#choice-keys").render())
        assert "no resuming: the run is running" in str(choice.query_one("#choice-note").render())
        await pilot.press("r")  # not offered: nothing happens
        await pilot.pause()
        assert pilot.app.screen is choice
        await pilot.press("escape")
        assert pilot.app.screen is checkpoints
    assert not (live_run / "train.log").exists()


async def test_resume_is_not_offered_without_a_plan_to_start_with(fixture_run):
    seen: list = []
    async with create_app(options(run_dir=fixture_run)).run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await dashboard(pilot)  # no --config, no launch.json
        await pilot.press("k")
        screen = pilot.app.screen
        await pilot.pause()
        assert "r" not in footer(screen) and footer(screen)["x"] == "export"
        await pilot.press("r")
        await pilot.pause()
        assert pilot.app.screen is screen
    refusal = next(n for n in notices(seen) if n.notification.title == "cannot resume")
    assert refusal.notification.message.startswith(f"nothing to start: no launch.json in {fixture_run}")


async def test_help_names_every_key_of_the_new_screens(runs_folder, fixture_run):
    async with create_app(options(runs_folder=runs_folder)).run_test(size=(100, 30)) as pilot:
        await picker_ready(pilot)
        await pilot.press("question_mark")
        body = pilot.app.screen.body.plain
        for key, what in (("space", "Mark"), ("c", "Compare"), ("s", "Sort"), ("t", "State filter"),
                          ("/", "Filter"), ("o", "Open")):
            assert re.search(rf"^  {re.escape(key)}\s+{what}$", body, re.M), (key, body)
        await pilot.press("escape", "space", "down", "space", "c")
        await until(pilot, lambda: isinstance(pilot.app.screen, CompareScreen) and pilot.app.screen.ready, "compare")
        await pilot.press("question_mark")
        body = pilot.app.screen.body.plain
        for key, what in (("n", "Next metric"), ("p", "Prev metric"), ("m", "Smooth"), ("l", "Log"),
                          ("r", "Reload"), ("esc", "Runs")):
            assert re.search(rf"^  {re.escape(key)}\s+{what}$", body, re.M), (key, body)
    async with create_app(options(run_dir=fixture_run)).run_test(size=(100, 30)) as pilot:
        await dashboard(pilot)
        await pilot.press("k", "question_mark")
        assert isinstance(pilot.app.screen, TextScreen)
        body = pilot.app.screen.body.plain
        for key, what in (("r", "Resume from"), ("x", "Export"), ("esc", "Back")):
            assert re.search(rf"^  {re.escape(key)}\s+{what}$", body, re.M), (key, body)


# -- the eval table and the checkpoint list --------------------------------------------------------------

async def test_eval_table_shows_the_figures_status_prints(fixture_run, capsys):
    assert train_run_main(["status", "--out-dir", str(fixture_run)]) == 1  # the fixture has anomalies
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("eval "))
    printed = line.removeprefix("eval").strip()
    assert printed.startswith("step 400: policy top-1 ") and "(8,192 positions)" in printed, printed
    async with create_app(options(run_dir=fixture_run)).run_test(size=(80, 24)) as pilot:
        await dashboard(pilot)
        await pilot.press("k")
        screen = pilot.app.screen
        assert isinstance(screen, CheckpointScreen)
        await pilot.pause()
        box = screen.query_one("#evals")
        assert str(box.render()) == printed  # the same words, from the same formatter
        assert box.border_title == "last eval (as status shows it, 1m06s ago)"


async def test_checkpoint_list_is_newest_first_with_step_size_and_age(tmp_path):
    run_dir = tmp_path / "run"
    last = write_small_run(run_dir, last_step=150, checkpoints=(50, 100, 150))
    (run_dir / "step-000000999.pt").symlink_to(run_dir / "step-000000050.pt")  # never listed, never followed
    (run_dir / ".step-000000200.pt.tmp-77").write_bytes(b"half")  # a save killed midway: not a checkpoint
    async with create_app(options(run_dir=run_dir, clock=lambda: last + 30)).run_test(size=(80, 24)) as pilot:
        await dashboard(pilot)
        await pilot.press("k")
        screen = pilot.app.screen
        await pilot.pause()
        table = screen.query_one("#checkpoints")
        rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
    # saved at their step's event time, 2 s a logged step of 5; the last event is a second after step 150
    assert rows == [
        ["step-000000150.pt", "150", "1.1 KiB", "31s ago", "newest"],
        ["step-000000100.pt", "100", "1.1 KiB", "51s ago", ""],
        ["step-000000050.pt", "50", "1.0 KiB", "1m11s ago", ""],
    ]
    assert table.border_title == "3 checkpoints, newest first (a plain start resumes from the newest)"


async def test_export_asks_where_and_refuses_a_missing_directory(fixture_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    async with create_app(options(run_dir=fixture_run)).run_test(size=(100, 30)) as pilot:
        await dashboard(pilot)
        await pilot.press("k")
        await pilot.pause()
        await pilot.press("x")
        box = pilot.app.screen
        assert isinstance(box, ExportScreen)
        field = box.query_one("#export-path")
        assert field.value == str(tmp_path / "fixture-step-000000400.onnx")
        field.value = str(tmp_path / "absent" / "model.onnx")
        await pilot.press("enter")
        assert pilot.app.screen is box
        assert "no such directory" in str(box.query_one("#export-error").render())
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, CheckpointScreen)


# -- resuming and exporting for real (slow: a trainer, tideborn export) ------------------------------------


