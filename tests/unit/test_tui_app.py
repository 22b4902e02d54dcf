"""The TUI driven with Textual's Pilot: each pane shows what the run directory says, each key does what
its footer label says, the files are followed as they change, and start/stop go to the right process.

The fixture run (tideborn.tui.testing) has fixed times, a host that is not this one and a fixed clock, so what
the panes show does not depend on this machine or on when the test runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pytest
from textual.notifications import Notify

from tests.helpers.common import until
from tests.helpers.tui import app_for, attached
from tideborn.errors import UserError
from tideborn.rundir.events import encode_event
from tideborn.rundir.files import PidRecord, this_host
from tideborn.rundir.kinds import parse_event
from tideborn.tui.app import create_app, main
from tideborn.tui.gpu import NvmlProbe
from tideborn.tui.history import load_history
from tideborn.tui.options import TuiOptions, parse_options
from tideborn.tui.plan import LaunchPlan
from tideborn.tui.screens.confirm import ConfirmScreen
from tideborn.tui.screens.dashboard import DashboardScreen
from tideborn.tui.screens.help import TextScreen
from tideborn.tui.screens.run_picker import RunPickerScreen
from tideborn.tui.testing import FIXTURE_NOW, FIXTURE_START, write_fixture_run
from tideborn.tui.widgets.anomalies import AnomalyList
from tideborn.tui.widgets.gpu_panel import GpuPanel
from tideborn.tui.widgets.log_pane import LogPane

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("utc")  # clock times in UTC, whatever this machine's zone


@pytest.fixture
def fixture_run(tmp_path) -> Path:
    run_dir = tmp_path / "runs" / "fixture"
    write_fixture_run(run_dir)
    return run_dir


def notices(messages: list) -> list[str]:
    return [m.notification.message for m in messages if isinstance(m, Notify)]


# -- the panes ---------------------------------------------------------------------------------------

async def test_header_shows_state_progress_rate_lr_and_ages(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        text = screen.header.text().plain
    for part in ("STOPPED", "step 400 / 400 (100.0%)", "2,560 pos/s", "lr 1.25e-04", "event 1m05s ago",
                 "checkpoint step 400 (1m05s ago)", "run_stopped at step 400: SIGTERM"):
        assert part in text, (part, text)


async def test_plot_shows_losses_eval_nonfinite_and_axis_markers(fixture_run):
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        lines = plot.render().plain.split("\n")
        # 120x40 has no room for the grid: the losses chart alone, the others one key away
        assert plot.chart_name() == "1/6 losses"
        assert {c.label for c in plot.curves()} == {"loss", "policy", "value", "eval-pol", "eval-val"}
        assert {c.label for chart in plot.charts() for c in chart.curves} == {
            "loss", "policy", "value", "eval-pol", "eval-val", "acc-pol", "acc-val", "lr", "grad-norm", "pos/s",
            "wait-share"}
        assert plot.history.series["loss"].segments == [0, 60]  # the resume at step 200 starts a segment
    assert "4 non-finite" in lines[0]
    axis = lines[-2]
    assert "◀" in axis and "┼" in axis and "!" in axis
    assert lines[-1].split() == ["5", "202", "400"]


async def test_gpu_panel_shows_the_trainers_gpu_events(fixture_run):
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        await attached(pilot)
        panel = pilot.app.screen.query_one("#gpu", GpuPanel)
        await until(pilot, lambda: panel.sample is not None, "a hardware sample")
        text = panel.text().plain
        assert panel.border_title == "GPU (trainer events)"
    for part in ("0 GeForce RTX 4070 Ti", "util  91%", "mem 9.5/12.0 GiB", "67°C", "252 W", "torch peak 8.0 GiB",
                 "gpu event 1m06s ago"):
        assert part in text, (part, text)


async def test_cpu_run_says_so_and_shows_the_trainer_process(tmp_path):
    run_dir = tmp_path / "cpu-run"
    run_dir.mkdir()
    started = encode_event("run_started", {"step": 0, "device": "cpu, fp32", "pid": os.getpid(), "host": this_host(),
                                           "max_steps": 10, "settings": {"runtime": {"device": "cpu"}}})
    (run_dir / "events.jsonl").write_bytes(started)
    async with app_for(run_dir, clock=time.time).run_test(size=(100, 30)) as pilot:
        await attached(pilot)
        panel = pilot.app.screen.query_one("#gpu", GpuPanel)
        await until(pilot, lambda: panel.sample is not None, "a hardware sample")
        text = panel.text().plain
    assert "CPU run: no GPU in use" in text
    assert f"trainer pid {os.getpid()}" in text and "RSS" in text and "CPU" in text


async def test_anomalies_pane_lists_each_with_time_step_and_evidence(fixture_run):
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        await attached(pilot)
        pane = pilot.app.screen.query_one("#anomalies", AnomalyList)
        assert {a.rule for a in pane.anomalies} == {"nonfinite_loss", "cuda_oom", "traceback"}
        assert pane.has_class("-alert")
        nonfinite = next(a for a in pane.anomalies if a.rule == "nonfinite_loss")
        prompt = pane._prompt(nonfinite).plain
        assert prompt.startswith("22:14:20 step 150 nonfinite_loss") and 'loss="nan"' in prompt
        pane.focus()
        pane.highlighted = pane.anomalies.index(nonfinite)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, TextScreen), "the anomaly's details")
        body = str(pilot.app.screen.body)
        assert "nonfinite_loss" in body and "step      150" in body and "policy_loss=" in body
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, DashboardScreen)


async def test_log_pane_shows_the_tail_with_errors_highlighted(fixture_run):
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        await attached(pilot)
        log = pilot.app.screen.query_one("#log", LogPane)
        await until(pilot, lambda: log.lines, "log lines")
        shown = [strip.text for strip in log.lines]
        styles = {strip.text.strip(): {str(seg.style) for seg in strip if seg.style} for strip in log.lines}
    assert any("stopped (SIGTERM) at step 400" in line for line in shown)
    assert log.errors == 4 and log.border_title == "train.log (4 error lines)"
    oom = next(key for key in styles if key.startswith("torch.OutOfMemoryError"))
    assert any("bold" in s and "red" in s for s in styles[oom])
    plain = next(key for key in styles if key.startswith("resuming"))
    assert not any("red" in s for s in styles[plain])


# -- following the files ------------------------------------------------------------------------------

async def test_new_events_arrive_torn_lines_wait_and_new_anomalies_notify(fixture_run):
    seen: list = []
    app = app_for(fixture_run, follow=True)
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        screen = await attached(pilot)
        focused = pilot.app.focused
        points = len(screen.history.series["loss"])
        with open(fixture_run / "events.jsonl", "ab") as handle:
            handle.write(b"\n")  # ends the fixture's torn line: a malformed line, skipped
            handle.write(encode_event("run_started", {"step": 400, "resumed_from": "x", "pid": 424242,
                                                      "host": "fixture-host", "max_steps": 500}, now=FIXTURE_NOW))
            handle.write(encode_event("step", {"step": 405, "loss": 2.0, "policy_loss": 1.5, "value_loss": 0.5},
                                      now=FIXTURE_NOW))
            handle.write(b'{"v":1,"time":1,"kind":"step","step":410,"loss":')  # torn: must wait for its newline
        await until(pilot, lambda: len(screen.history.series["loss"]) == points + 1, "the new step")
        with open(fixture_run / "events.jsonl", "ab") as handle:
            handle.write(b'"nan","policy_loss":"nan","value_loss":0.5}\n')
        await until(pilot, lambda: len(screen.history.series["loss"]) == points + 2, "the completed line")
        await until(pilot, lambda: any("non-finite loss at step 410" in n for n in notices(seen)),
                    "a notification for the new NaN")
        assert pilot.app.focused is focused  # attention drawn, focus not stolen
        await until(pilot, lambda: screen.status and screen.status.step == 410, "the header's new step")


async def test_a_truncated_log_is_read_again(fixture_run):
    async with app_for(fixture_run, follow=True).run_test(size=(120, 40)) as pilot:
        await attached(pilot)
        log = pilot.app.screen.query_one("#log", LogPane)
        (fixture_run / "train.log").write_text("a new beginning\n")
        await until(pilot, lambda: any("a new beginning" in s.text for s in log.lines), "the new log")
        assert any("truncated or replaced" in s.text for s in log.lines)
        assert not any("OutOfMemoryError" in s.text for s in log.lines)


async def test_a_replaced_events_file_starts_the_curves_over(fixture_run):
    async with app_for(fixture_run, follow=True).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        fresh = fixture_run / "events.new"
        fresh.write_bytes(encode_event("run_started", {"step": 0, "fresh": True, "pid": 424242,
                                                       "host": "fixture-host", "max_steps": 50}, now=FIXTURE_NOW)
                          + encode_event("step", {"step": 5, "loss": 9.0, "policy_loss": 8.0, "value_loss": 1.0},
                                         now=FIXTURE_NOW))
        os.replace(fresh, fixture_run / "events.jsonl")  # what --fresh does: the old file is archived
        await until(pilot, lambda: len(screen.history.series["loss"]) == 1, "the curves to start over")
        assert screen.history.series["loss"].y.view[0] == 9.0 and screen.history.markers == []


def later_steps(first: int, last: int, when: float) -> bytes:
    """Step events after the fixture's last one (step 400), 2 s apart from `when`."""
    return b"".join(encode_event("step", {"step": step, "loss": 1.0 + step / 1000, "policy_loss": 0.8,
                                          "value_loss": 0.2}, now=when + 2.0 * i)
                    for i, step in enumerate(range(first, last + 1, 5)))


async def test_a_rotated_events_file_keeps_the_curves_read_before(fixture_run):
    """logrotate's copytruncate under a live run: the points read before stay, the new file's follow."""
    events = fixture_run / "events.jsonl"
    async with app_for(fixture_run, follow=True).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        before = screen.plot.history.steps.x.view.copy()
        markers = list(screen.plot.history.markers)
        evals = len(screen.plot.history.series["eval_policy_loss"])
        assert evals and before.size > 50 and before[-1] == 400
        shutil.copyfile(events, fixture_run / "events.jsonl.1")  # copytruncate: copy, then truncate in place
        with open(events, "r+b") as handle:
            handle.truncate(0)
            handle.write(later_steps(405, 420, FIXTURE_NOW))
        await until(pilot, lambda: screen.plot.history.steps.x.view[-1:].tolist() == [420.0], "the new steps")
        steps = screen.plot.history.steps.x.view
        assert steps[:before.size].tolist() == before.tolist()  # the curve read before the rotation is kept
        assert steps[before.size:].tolist() == [405.0, 410.0, 415.0, 420.0]
        assert screen.plot.history.markers == markers
        assert len(screen.plot.history.series["eval_policy_loss"]) == evals


async def test_a_replaced_events_file_that_repeats_events_adds_only_the_new_ones(fixture_run):
    """A rotation that replaces events.jsonl with a file holding the last events already read and new ones:
    each step is drawn once."""
    events = fixture_run / "events.jsonl"
    lines = events.read_bytes().split(b"\n")[:-1]  # without the fixture's torn last line
    async with app_for(fixture_run, follow=True).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        before = screen.plot.history.steps.x.view.copy()
        evals = len(screen.plot.history.series["eval_policy_loss"])
        replaced = fixture_run / "events.new"
        replaced.write_bytes(b"\n".join(lines[-30:]) + b"\n" + later_steps(405, 415, FIXTURE_NOW))
        os.replace(replaced, events)
        await until(pilot, lambda: screen.plot.history.steps.x.view[-1:].tolist() == [415.0], "the new steps")
        steps = screen.plot.history.steps.x.view
        assert steps.tolist() == before.tolist() + [405.0, 410.0, 415.0]
        assert len(screen.plot.history.series["eval_policy_loss"]) == evals


def rotate_fixture(run_dir: Path, run_dir_named: str) -> list[float]:
    """Split the fixture's events.jsonl as copytruncate leaves it: the first 60 lines in events.jsonl.1
    (its run_started naming `run_dir_named`), the rest in events.jsonl. Returns the steps of the whole."""
    events = run_dir / "events.jsonl"
    whole = load_history(events, events.stat().st_size, 0.9)
    lines = events.read_bytes().split(b"\n")
    head = json.loads(lines[0])
    head["run_dir"] = run_dir_named
    (run_dir / "events.jsonl.1").write_bytes(b"\n".join([json.dumps(head).encode(), *lines[1:60]]) + b"\n")
    events.write_bytes(b"\n".join(lines[60:]))
    return whole.steps.x.view.tolist()


async def test_opened_after_a_rotation_the_rotated_away_file_is_read_first(fixture_run):
    whole = rotate_fixture(fixture_run, str(fixture_run))
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        assert screen.plot.history.steps.x.view.tolist() == whole


@pytest.mark.parametrize("case", ["another run", "a symlink"])
async def test_a_rotated_away_file_of_another_run_or_a_symlink_is_not_read(fixture_run, tmp_path, case):
    other = tmp_path / "other"
    other.mkdir()
    whole = rotate_fixture(fixture_run, str(other if case == "another run" else fixture_run))
    if case == "a symlink":
        os.replace(fixture_run / "events.jsonl.1", tmp_path / "elsewhere.jsonl")
        (fixture_run / "events.jsonl.1").symlink_to(tmp_path / "elsewhere.jsonl")
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        steps = screen.plot.history.steps.x.view.tolist()
        assert steps and steps == whole[len(whole) - len(steps):] and len(steps) < len(whole)


async def test_a_replaced_log_is_read_from_its_start(fixture_run):
    async with app_for(fixture_run, follow=True).run_test(size=(120, 40)) as pilot:
        await attached(pilot)
        log = pilot.app.screen.query_one("#log", LogPane)
        fresh = fixture_run / "train.log.new"
        fresh.write_text("first line of a new log\n")
        os.replace(fresh, fixture_run / "train.log")
        await until(pilot, lambda: any("first line of a new log" in s.text for s in log.lines), "the new log")


async def test_nothing_is_redrawn_while_nothing_changes(fixture_run):
    async with app_for(fixture_run, follow=True).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        await until(pilot, lambda: not screen.plot.redraw_pending, "the plot's last scheduled redraw")
        await pilot.pause(0.3)
        plot_draws, header = screen.plot.draws, screen.header.shown_text
        await pilot.pause(2.5)  # the follower polls (at least every second) and finds nothing new
        assert screen.plot.draws == plot_draws
        assert screen.header.shown_text == header


async def test_status_refreshes_redraw_the_footer_only_when_what_it_offers_changes(fixture_run):
    """Status arrives about once a second while a run is followed; redrawing the footer each time
    restyled all its keys (most of the TUI's CPU use while following). Only a change of what it offers
    (Stop, or only the stopping note; Start) redraws it."""
    from tideborn.tui.messages import RunRefreshed

    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        calls = []
        screen.refresh_bindings = lambda: calls.append(1)
        status = dataclasses.replace(screen.status, state="running", terminal=None)
        screen.post_message(RunRefreshed(status))  # stopped -> running changes what is offered: Stop, once
        await pilot.pause()
        assert calls == [1]
        calls.clear()
        for number in range(5):
            screen.post_message(RunRefreshed(dataclasses.replace(status, loss_step=400 + number)))
            await pilot.pause()
        assert calls == []
        # a stop sent from elsewhere (stop_requested): Stop leaves the footer, once
        stopping = dataclasses.replace(status, stop_requested=parse_event(
            {"kind": "stop_requested", "signal": "SIGTERM", "time": FIXTURE_NOW}))
        for _ in range(3):
            screen.post_message(RunRefreshed(stopping))
            await pilot.pause()
        assert calls == [1] and not screen.check_action("stop", ())


async def test_a_directory_that_does_not_exist_yet_is_waited_for(tmp_path):
    run_dir = tmp_path / "later"
    async with app_for(run_dir, follow=True, clock=time.time).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        assert "NOT STARTED" in screen.header.text().plain
        write_fixture_run(run_dir)
        await until(pilot, lambda: screen.state == "stopped", "the run to appear")


# -- keys ---------------------------------------------------------------------------------------------

async def test_plot_keys_toggle_smoothing_log_scale_windows_and_curves(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        assert plot.options.smooth and not plot.options.log and plot.options.window is None
        await pilot.press("m")
        assert not plot.options.smooth and "EMA" not in plot.render().plain.split("\n")[0]
        await pilot.press("l")
        assert plot.options.log and "log" in plot.render().plain.split("\n")[0]
        await pilot.press("n")
        assert plot.options.window == 1000
        await pilot.press("n")
        assert plot.options.window == 10_000
        await pilot.press("a")
        assert plot.options.window is None
        await pilot.press("c")
        assert plot.view == "train" and "eval-pol" not in plot.render().plain.split("\n")[0]
        await pilot.press("c")
        assert plot.view == "eval" and {c.label for c in plot.curves()} == {"eval-pol", "eval-val"}


def legend(plot) -> str:
    return plot.render().plain.split("\n")[0]


async def test_chart_key_shows_each_metric_group_alone_at_80x24(fixture_run):
    """80x24 has room for one chart: g cycles losses, accuracy, learning rate, grad norm, throughput and
    data wait, each titled with its place, each with its curve drawn."""
    async with app_for(fixture_run).run_test(size=(80, 24)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        assert not plot.showing_grid()
        seen = []
        for _ in range(6):
            text = plot.render().plain
            seen.append(plot.chart_name())
            assert text.startswith(plot.chart_name()), text
            assert sum(0x2800 < ord(c) < 0x2900 for c in text) > 20, text  # the chart's curve is drawn
            await pilot.press("g")
        assert seen == ["1/6 losses", "2/6 accuracy", "3/6 learning rate", "4/6 grad norm", "5/6 throughput",
                        "6/6 data wait"]
        assert plot.chart_name() == "1/6 losses"  # and round again
        labels = {chart.title: [c.label for c in chart.curves] for chart in plot.charts()}
    assert labels == {"losses": ["loss", "policy", "value", "eval-pol", "eval-val"], "accuracy": ["acc-pol", "acc-val"],
                      "learning rate": ["lr"], "grad norm": ["grad-norm"], "throughput": ["pos/s"],
                      "data wait": ["wait-share"]}


async def test_a_big_terminal_shows_every_chart_in_a_grid(fixture_run):
    """200x50: the six charts at once, each with a y axis of its own (its own labels); g shows one
    alone, full width, and after the last, the grid again."""
    async with app_for(fixture_run).run_test(size=(200, 50)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        assert plot.showing_grid() and plot.chart_name() == "grid"
        text = plot.render().plain
        for title in ("losses", "accuracy", "learning rate", "grad norm", "throughput", "data wait"):
            assert title in text
        rows = text.split("\n")
        assert "8.75┤" in rows[1] and "0.7┤" in rows[1] and "0.0494┤" in rows[1]  # losses, accuracy, lr: own scales
        await pilot.press("g")
        assert plot.chart_name() == "1/6 losses" and plot.render().plain.split("\n")[0].startswith("1/6 losses")
        for _ in range(6):
            await pilot.press("g")
        assert plot.showing_grid()


async def test_zoom_and_pan_keys_move_the_step_axis(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        assert plot.span() == (5.0, 400.0)
        await pilot.press("plus")
        lo, hi = plot.zoom
        assert hi - lo == pytest.approx(395 / 2) and (lo + hi) / 2 == pytest.approx(202.5)  # about the middle
        assert "zoom" in legend(plot) and plot.render().plain.split("\n")[-1].split()[0] == f"{lo:.0f}"
        await pilot.press("left_square_bracket")
        assert plot.zoom == pytest.approx((lo - (hi - lo) / 4, hi - (hi - lo) / 4))
        for _ in range(5):
            await pilot.press("left_square_bracket")
        assert plot.zoom[0] == 5.0  # never past the first step
        await pilot.press("right_square_bracket")
        assert plot.zoom[0] > 5.0
        await pilot.press("minus")
        assert plot.zoom is None and "zoom" not in legend(plot)  # zoomed out to everything: all again
        await pilot.press("plus", "plus", "0")
        assert plot.zoom is None and plot.span() == (5.0, 400.0)


async def test_the_charts_keys_reach_it_wherever_the_focus_is(fixture_run):
    # The keys are the chart's (LossPlot.KEYS), and the chart never has the focus: the log has it as the dashboard
    # opens, Tab moves it to the anomalies. Each key still reaches the chart, says what it did, and leaves the focus.
    seen: list = []
    async with app_for(fixture_run).run_test(size=(100, 30), message_hook=seen.append) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        for pane in (LogPane, AnomalyList):
            screen.query_one(pane).focus()
            await pilot.pause()
            views = (plot.options.smooth, plot.options.log, plot.options.wall_time)
            await pilot.press("m", "l", "t")
            assert (plot.options.smooth, plot.options.log, plot.options.wall_time) == tuple(not on for on in views)
            await pilot.press("t", "plus")
            assert plot.zoom is not None
            await pilot.press("0", "v")
            assert plot.zoom is None and plot.cursor is not None
            await pilot.press("v")
            assert plot.cursor is None and isinstance(pilot.app.focused, pane)
        said = {"smoothing off", "smoothing on", "log scale", "linear scale", "x axis: wall time", "x axis: step",
                "cursor on: [ and ] move it, the legends read the values there", "cursor off"}
        await until(pilot, lambda: said <= set(notices(seen)), "each key's notification")


async def test_mouse_wheel_zooms_about_the_pointer_and_scrolls_sideways(fixture_run):
    from textual import events

    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        at = plot.x_at(20)  # a column towards the left of the chart
        plot.post_message(events.MouseScrollUp(plot, 20, 5, 0, 0, 0, False, False, False))
        await pilot.pause()
        lo, hi = plot.zoom
        assert hi - lo == pytest.approx(395 / 2)
        assert (at - lo) / (hi - lo) == pytest.approx((at - 5) / 395)  # the step under the pointer stays put
        plot.post_message(events.MouseScrollRight(plot, 20, 5, 0, 0, 0, False, False, False))
        await pilot.pause()
        assert plot.zoom[0] > lo
        plot.post_message(events.MouseScrollDown(plot, 20, 5, 0, 0, 0, False, False, False))
        await pilot.pause()
        assert plot.zoom is None


async def test_cursor_reads_each_curves_value_at_a_logged_step(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        await pilot.press("g", "g")  # the learning rate alone: one curve, never smoothed
        await pilot.press("v")
        steps = plot.history.steps.x.view
        assert plot.cursor in steps  # on a logged step, the one nearest the middle
        first = plot.cursor
        lr = plot.history.series["lr"]
        value = float(lr.y.view[len(steps) - 1 - list(steps[::-1]).index(first)])  # the newest session's
        text = plot.render().plain
        assert f"lr {value:.3g}" in text.split("\n")[0], text
        assert f"↑{first:.0f}" in text.split("\n")[-1]  # the cursor's step under the x axis
        await pilot.press("right_square_bracket")
        assert plot.cursor > first and plot.cursor in steps  # moved, to the next logged step or further
        await pilot.press("g", "g", "g", "g")  # round to losses: eval points say where they are
        head = plot.render().plain.split("\n")[0]
        assert "eval-pol" in head and "@" in head and "~" in head, head  # train: raw~smoothed; eval: @step
        await pilot.press("v")
        assert plot.cursor is None and "↑" not in plot.render().plain


async def test_wall_time_axis_shows_clock_times(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        await pilot.press("t")
        assert plot.options.wall_time
        ticks = plot.render().plain.split("\n")[-1].split()
        first, last = plot.history.steps.t.view.min(), plot.history.steps.t.view.max()
        assert first == FIXTURE_START + 2.0 and 180 < last - first < 2 * 86400  # minutes: shown as HH:MM
        assert ticks[0] == "22:13" and ticks[-1] == time.strftime("%H:%M", time.gmtime(last)), ticks
        axis = plot.render().plain.split("\n")[-2]
        assert "┼" in axis and "◀" in axis  # checkpoints and the resume at their times
        await pilot.press("t")
        assert plot.render().plain.split("\n")[-1].split()[0] == "5"


async def test_smoothing_weight_keys_and_eval_points_never_smoothed(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        plot = screen.plot
        history = plot.history
        assert "EMA 0.9" in legend(plot)
        await pilot.press("greater_than_sign")
        assert history.series["loss"].weight == 0.95 and "EMA 0.95" in legend(plot)
        raw, smooth = history.series["loss"].y.view, history.series["loss"].smooth.view
        assert smooth[-1] != pytest.approx(raw[-1])
        await pilot.press("less_than_sign", "less_than_sign", "less_than_sign")  # 0.9, 0.8, 0.5
        assert history.series["loss"].weight == 0.5 and "EMA 0.5" in legend(plot)
        await pilot.press("less_than_sign")
        assert not plot.options.smooth and "EMA" not in legend(plot)  # 0 is off
        await pilot.press("greater_than_sign")
        assert plot.options.smooth and "EMA 0.5" in legend(plot)
        # eval points are drawn raw whatever the weight: their series is never smoothed
        assert not any(history.series[name].smoothed for name in history.series if name.startswith("eval_"))
        assert not history.series["lr"].smoothed


async def test_view_keys_on_a_run_without_steps_change_nothing_harmful(tmp_path):
    """An empty run directory: every chart says so, and each view key (zoom, pan, cursor, wall time,
    smoothing, chart, curves) leaves it so, in the grid and one chart at a time."""
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("")
    for size in ((200, 50), (80, 24)):
        async with app_for(run_dir).run_test(size=size) as pilot:
            screen = await attached(pilot)
            keys = ["plus", "minus", "left_square_bracket", "right_square_bracket", "0", "v",
                    "right_square_bracket", "t", "less_than_sign", "greater_than_sign", "g", "c", "m", "l",
                    "n", "a", "v"]
            for key in keys:
                await pilot.press(key)
            text = screen.plot.render().plain
            assert "no step events yet" in text and screen.plot.zoom is None
            assert pilot.app.is_running


async def test_help_lists_the_keys_and_closes(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        await attached(pilot)
        await pilot.press("question_mark")
        assert isinstance(pilot.app.screen, TextScreen)
        body = pilot.app.screen.body.plain
        for key in ("s ", "x ", "m ", "l ", "n ", "a ", "c ", "e ", "q ", "g ", "+ ", "- ", "[ ", "] ", "0 ",
                    "k ", "t ", "< ", "> "):
            assert f"  {key}" in body, key
        assert "Start" in body and "checkpoint" in body
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, DashboardScreen)


async def test_start_without_a_plan_says_what_is_missing(fixture_run):
    seen: list = []
    async with app_for(fixture_run).run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await attached(pilot)
        await pilot.press("s")
        await pilot.pause()
    assert any("no launch.json" in n and "--config" in n for n in notices(seen))


async def test_stop_refuses_a_run_that_is_not_running(fixture_run):
    seen: list = []
    async with app_for(fixture_run).run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await attached(pilot)
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(pilot.app.screen, DashboardScreen)  # no confirmation for nothing
    assert any("not running (stopped)" in n for n in notices(seen))


@pytest.fixture
def fake_trainer(tmp_path):
    """A process recorded in train.pid as a run's trainer (a sleep; SIGTERM ends it)."""
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    process = subprocess.Popen(["sleep", "120"])
    record = PidRecord(pid=process.pid, start_time=psutil.Process(process.pid).create_time(), host=this_host(),
                       argv=["sleep", "120"], started_at=time.time())
    (run_dir / "train.pid").write_text(json.dumps(record.to_dict()))
    yield run_dir, process
    if process.poll() is None:
        process.kill()
    process.wait()


async def test_stop_asks_first_then_sends_sigterm_to_the_recorded_process(fake_trainer):
    run_dir, process = fake_trainer
    seen: list = []
    async with app_for(run_dir, clock=time.time).run_test(size=(100, 30), message_hook=seen.append) as pilot:
        screen = await attached(pilot)
        assert screen.state == "running"
        await pilot.press("x")
        assert isinstance(pilot.app.screen, ConfirmScreen)
        await pilot.press("n")
        assert isinstance(pilot.app.screen, DashboardScreen)
        await pilot.pause(0.2)
        assert process.poll() is None  # declined: nothing sent
        await pilot.press("x", "y")
        await until(pilot, lambda: process.poll() is not None, "the process to get SIGTERM")
        assert process.returncode == -signal.SIGTERM
        await until(pilot, lambda: any("SIGTERM sent" in n for n in notices(seen)), "the stop notice")
        assert "stopping, SIGTERM" in screen.header.text().plain


async def test_quitting_never_stops_the_run(fake_trainer):
    run_dir, process = fake_trainer
    async with app_for(run_dir, clock=time.time).run_test(size=(100, 30)) as pilot:
        await attached(pilot)
        await pilot.press("q")
    time.sleep(0.2)
    assert process.poll() is None


async def test_ascii_mode_draws_no_braille_and_no_box_drawing(fixture_run):
    async with app_for(fixture_run, ascii=True, colour=False).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        assert pilot.app.has_class("-ascii")
        assert screen.plot.render().plain.isascii()
        assert pilot.app.screen.query_one("#gpu").styles.border.top[0] == "ascii"


# -- the run picker -----------------------------------------------------------------------------------

async def test_picker_lists_a_folder_of_runs_and_opens_one(tmp_path):
    folder = tmp_path / "runs"
    write_fixture_run(folder / "alpha")
    write_fixture_run(folder / "beta", max_steps=300)
    (folder / "not-a-run").mkdir()
    options = TuiOptions(runs_folder=folder, clock=lambda: FIXTURE_NOW, use_nvml=False, follow=False)
    async with create_app(options).run_test(size=(100, 30)) as pilot:
        picker = pilot.app.screen
        assert isinstance(picker, RunPickerScreen)
        await until(pilot, picker.ready.is_set, "the runs")
        assert [run.name for run in picker.runs] == ["alpha", "beta"]
        assert [run.status.step for run in picker.runs] == [400, 300]
        await pilot.press("down", "enter")
        screen = await attached(pilot)
        assert screen.run_dir == folder / "beta"
        await pilot.press("escape")
        assert pilot.app.screen is picker


# -- the command line ---------------------------------------------------------------------------------

def test_command_line_resolves_runs_folders_and_plans(tmp_path, fixture_run, monkeypatch):
    monkeypatch.delenv("TIDEBORN_PROJECT_FILE", raising=False)
    assert parse_options([str(fixture_run)], cwd=tmp_path).run_dir == fixture_run
    assert parse_options([str(fixture_run.parent)], cwd=tmp_path).runs_folder == fixture_run.parent
    config = str(REPO / "configs" / "smoke.toml")
    options = parse_options(["--config", config, "--set", "runtime.max_steps=7"], cwd=tmp_path)
    assert options.run_dir == tmp_path / "runs" / "ckpt" / "smoke"
    empty = tmp_path / "new-run"
    options = parse_options([str(empty), "--config", config], cwd=tmp_path)
    assert options.run_dir == empty and options.plan is not None
    aimed = options.plan.aimed_at(empty)
    assert aimed.override_of("runtime.out_dir") == json.dumps(str(empty.resolve()))


@pytest.mark.parametrize("argv, message", [
    ([], "give a run directory"),
    (["/no/such/dir"], "no such directory"),
    (["--config", "/no/such.toml"], "config file not found"),
    (["--smoothing", "1.5", "x"], "--smoothing 1.5"),
    (["--bogus"], "unrecognized arguments"),
])
def test_command_line_errors_are_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        parse_options(argv)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tideborn-tui: error:") and "Traceback" not in err


def test_a_launch_file_plan_never_carries_fresh_over(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "launch.json").write_text(json.dumps({
        "config": "configs/smoke.toml", "config_path": str(REPO / "configs" / "smoke.toml"),
        "overrides": ["runtime.max_steps=9"], "flags": {"network": "resnet2x32"}, "trainer_args": ["--fresh"],
        "cwd": str(tmp_path / "gone")}))
    plan = LaunchPlan.from_launch_file(run_dir)
    assert plan.config == str(REPO / "configs" / "smoke.toml")
    assert plan.overrides == ("runtime.max_steps=9",) and plan.flags == {"network": "resnet2x32"}
    assert plan.request().trainer_args == () and "--fresh" not in plan.request().trainer_argv()


def test_tui_app_does_not_import_torch():
    code = "import sys, tideborn.tui.app, tideborn.tui.screens.dashboard, tideborn.tui.screens.override_editor, " \
           "tideborn.tui.screens.run_picker; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


# -- NVML (faked: no GPU needed) ------------------------------------------------------------------------

class FakeNvml(types.ModuleType):
    """The parts of nvidia-ml-py the GPU pane uses: two devices, the trainer's process on the second,
    and a first device that will not report its power."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self, trainer_pid: int):
        super().__init__("pynvml")
        self.trainer_pid = trainer_pid
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200" if handle else "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=97 if handle else 3)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=(70 if handle else 1) * 2**30, total=140 * 2**30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, handle):
        if not handle:
            raise self.NVMLError("Not Supported")
        return 612_000

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [types.SimpleNamespace(pid=self.trainer_pid)] if handle else []


def test_nvml_reads_the_devices_the_trainer_uses(monkeypatch):
    fake = FakeNvml(trainer_pid=4321)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    probe = NvmlProbe()
    assert probe.available
    used = probe.sample({4321})
    assert [(d.index, d.name, d.utilization_percent, d.power_watts) for d in used] == [(1, "NVIDIA H200", 97.0, 612.0)]
    everything = probe.sample({999})  # the trainer is on none of them (yet): show all
    assert [d.index for d in everything] == [0, 1] and everything[0].power_watts is None
    probe.close()
    assert fake.shut


async def test_gpu_pane_prefers_nvml_on_the_runs_own_host(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(trainer_pid=os.getpid()))
    run_dir = tmp_path / "gpu-run"
    run_dir.mkdir()
    started = encode_event("run_started", {"step": 0, "device": "cuda:0 (NVIDIA H200), bf16", "pid": os.getpid(),
                                           "host": this_host(), "max_steps": 10})
    (run_dir / "events.jsonl").write_bytes(started)
    async with app_for(run_dir, clock=time.time, use_nvml=True).run_test(size=(100, 30)) as pilot:
        await attached(pilot)
        panel = pilot.app.screen.query_one("#gpu", GpuPanel)
        await until(pilot, lambda: panel.sample is not None, "a hardware sample")
        text = panel.text().plain
        assert panel.border_title == "GPU (NVML, live)"
    assert "1 H200" in text and "util  97%" in text and "mem 70.0/140.0 GiB" in text and "612 W" in text
    assert "A100" not in text  # a device the trainer does not use
