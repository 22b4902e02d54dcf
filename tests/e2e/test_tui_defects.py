"""The monitor's defects of issue 28, each driven through the real app (Textual's run_test) on real run
directories: run text is never markup, the footer follows the live state, figures are compact and nothing
wraps at 80 columns, a run directory that goes away is said gone, wrapping a paused log keeps the place, and
the last eval reads in the trainer's words in `status` and on the checkpoint screen alike."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from textual.widgets import Static
from textual.widgets._footer import FooterKey

from tests.helpers.common import until
from tests.helpers.tui import app_for, attached
from tideborn.rundir.events import encode_event
from tideborn.rundir.files import PidRecord, this_host
from tideborn.rundir.kinds import parse_event
from tideborn.tools.train_run import main as train_run_main
from tideborn.tui.app import create_app
from tideborn.tui.messages import RunRefreshed
from tideborn.tui.options import TuiOptions
from tideborn.tui.plan import LaunchPlan
from tideborn.tui.screens.checkpoints import CheckpointScreen
from tideborn.tui.screens.confirm import ConfirmScreen
from tideborn.tui.screens.help import TextScreen
from tideborn.tui.screens.run_picker import RunPickerScreen
from tideborn.tui.testing import FIXTURE_NOW, write_fixture_run, write_small_run
from tideborn.tui.widgets.anomalies import AnomalyList
from tideborn.tui.widgets.log_pane import LogPane

pytestmark = pytest.mark.usefixtures("utc")  # clock times in UTC, whatever this machine's zone
SMOKE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smoke.toml"
TRACEBACK_END = "ValueError: bad shape [/batch] in [bold]tensor"


def screen_text(app) -> str:
    """Every character on the screen, from Textual's own screenshot."""
    svg = app.export_screenshot()
    return "".join(html.unescape(t) for t in re.findall(r"<text [^>]*>(.*?)</text>", svg)).replace("\xa0", " ")


def footer_actions(screen) -> dict[str, FooterKey]:
    return {key.action: key for key in screen.query(FooterKey)}


# -- 1. text from a run file is never markup ------------------------------------------------------------

async def test_markup_in_run_files_is_shown_as_written_in_every_pane(tmp_path):
    """`d` on a traceback ending in "[/batch]" stopped the monitor with a MarkupError; "[watchdog]" vanished.
    The log, the anomalies, their details, the header, the GPU pane, notifications, the picker and the
    questions all show such text as it is written."""
    folder = tmp_path / "runs"
    run_dir = folder / "run [bold]x"
    write_fixture_run(run_dir)
    with open(run_dir / "events.jsonl", "ab") as handle:
        handle.write(b"\n")  # ends the fixture's torn last line
        handle.write(encode_event("gpu", {"step": 400, "devices": [{
            "index": 0, "name": "NVIDIA [red]H200[/red]", "utilization_percent": 50.0,
            "memory_used_bytes": 1, "memory_total_bytes": 2}]}, now=FIXTURE_NOW - 5))
    with open(run_dir / "train.log", "a", encoding="utf-8") as handle:
        handle.write("settings: [watchdog] on\nTraceback (most recent call last):\n"
                     '  File "tideborn/trainer/loop.py", line 1, in run\n' + TRACEBACK_END + "\n")
    seen: list = []
    async with app_for(run_dir, follow=True).run_test(size=(140, 40), notifications=True,
                                                      message_hook=seen.append) as pilot:
        screen = await attached(pilot)
        pane = screen.query_one("#anomalies", AnomalyList)
        await until(pilot, lambda: any(TRACEBACK_END in a.message for a in pane.anomalies), "the traceback")
        await pilot.pause(0.3)
        shown = screen_text(pilot.app)
        assert "settings: [watchdog] on" in shown and "[/batch] in [bold]tensor" in shown
        assert "[red]H200[/red]" in shown  # the GPU pane
        pane.highlighted = next(i for i, a in enumerate(pane.anomalies) if TRACEBACK_END in a.message)
        pane.focus()
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(pilot.app.screen, TextScreen)
        assert TRACEBACK_END in screen_text(pilot.app)
        await pilot.press("escape")
        # a run_failed whose error holds markup: the header and the notification
        with open(run_dir / "events.jsonl", "ab") as handle:
            handle.write(encode_event("run_failed", {"step": 400, "error": "RuntimeError: [/batch] [b]x"},
                                      now=FIXTURE_NOW))
        await until(pilot, lambda: screen.status is not None and screen.status.state == "failed", "run_failed")
        await pilot.pause(0.3)
        shown = screen_text(pilot.app)
        assert shown.count("RuntimeError: [/batch] [b]x") >= 2, shown  # the header and the notification
        pilot.app.push_screen(ConfirmScreen(f"Stop the run in {run_dir}?"))
        await pilot.pause()
        assert "run [bold]x?" in screen_text(pilot.app)
    picker = create_app(TuiOptions(runs_folder=folder, clock=lambda: FIXTURE_NOW, use_nvml=False, follow=False))
    async with picker.run_test(size=(100, 24)) as pilot:
        await until(pilot, lambda: isinstance(pilot.app.screen, RunPickerScreen) and pilot.app.screen.ready.is_set(),
                    "the runs")
        # the table sizes its columns to the rows on a later refresh than the one that adds them
        await until(pilot, lambda: "run [bold]x" in screen_text(pilot.app), "the run's name as written", timeout=20)


# -- 2. the footer follows the live state ---------------------------------------------------------------

async def test_the_footer_follows_the_run_going_live_and_ending(tmp_path):
    """Start stayed offered once the run was live, and Stop once it had finished (x then said "nothing to
    stop"): the footer follows the state, not only a stop in progress."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    process = subprocess.Popen(["sleep", "120"])
    try:
        plan = LaunchPlan(config=str(SMOKE_CONFIG), cwd=tmp_path)
        async with app_for(run_dir, plan=plan, follow=True, clock=time.time).run_test(size=(100, 30)) as pilot:
            screen = await attached(pilot)
            assert "start" in footer_actions(screen) and "stop" not in footer_actions(screen)
            record = PidRecord(pid=process.pid, start_time=psutil.Process(process.pid).create_time(),
                               host=this_host(), argv=["sleep", "120"], started_at=time.time())
            (run_dir / "train.pid").write_text(json.dumps(record.to_dict()))
            (run_dir / "events.jsonl").write_bytes(encode_event("run_started", {
                "step": 0, "pid": process.pid, "host": this_host(), "max_steps": 100}, now=time.time()))
            await until(pilot, lambda: screen.state == "running", "the run to go live")
            await until(pilot, lambda: "stop" in footer_actions(screen), "Stop in the footer")
            assert "start" not in footer_actions(screen)
            process.kill()
            process.wait()
            with open(run_dir / "events.jsonl", "ab") as handle:
                handle.write(encode_event("run_finished", {"step": 100}, now=time.time()))
            await until(pilot, lambda: screen.state == "finished", "the run to finish")
            await until(pilot, lambda: "start" in footer_actions(screen), "Start in the footer again")
            assert "stop" not in footer_actions(screen)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


# -- 3. compact figures; nothing wraps at 80 columns ------------------------------------------------------

def stopping(status):
    return dataclasses.replace(status, state="running", terminal=None, stop_requested=parse_event(
        {"kind": "stop_requested", "signal": "SIGTERM", "time": FIXTURE_NOW}))


HEADER_STATES = {
    "stopped": lambda status: status,
    "running": lambda status: dataclasses.replace(status, state="running", terminal=None),
    "stopping": stopping,
    "failed": lambda status: dataclasses.replace(status, state="failed", terminal=parse_event(
        {"kind": "run_failed", "step": 12, "error": "RuntimeError: " + "x" * 200})),
}


@pytest.mark.parametrize("size", [(80, 24), (40, 12)])
@pytest.mark.parametrize("state", sorted(HEADER_STATES))
async def test_the_header_keeps_its_two_lines_in_every_state(tmp_path, state, size):
    """During a stop the header's first line wrapped at 80 columns and pushed the second away."""
    run_dir = tmp_path / "run"
    write_fixture_run(run_dir)
    async with app_for(run_dir).run_test(size=size) as pilot:
        screen = await attached(pilot)
        screen.post_message(RunRefreshed(HEADER_STATES[state](screen.status)))
        await pilot.pause(0.2)
        first, second = (screen.header.render_line(y).text for y in range(2))
        label = {"stopping": "RUNNING (stopping"}.get(state, state.upper())
        assert first.startswith(f" {label}"), first
        if state == "failed":
            assert second.startswith(" run_failed at step 12"), second
        else:
            assert second.startswith(" event ") and "ago" in second, second


@pytest.mark.parametrize("size", [(80, 24), (40, 12)])
async def test_the_picker_shows_compact_losses_and_keeps_help_on_one_line(tmp_path, size):
    """A diverged loss printed as %.4f (1755163633910096541826154496.0000) pushed the columns off; with two
    runs marked, "? Help" fell off the footer."""
    folder = tmp_path / "runs"
    write_small_run(folder / "calm")
    write_small_run(folder / "diverged", scale=3.0676e26)
    picker = create_app(TuiOptions(runs_folder=folder, clock=lambda: FIXTURE_NOW, use_nvml=False, follow=False))
    async with picker.run_test(size=size) as pilot:
        screen = pilot.app.screen
        await until(pilot, lambda: isinstance(screen, RunPickerScreen) and screen.ready.is_set(), "the runs")
        table = screen.query_one("#runs")
        losses = [str(table.get_row_at(i)[4]) for i in range(table.row_count)]
        assert losses == ["5.72", "1.76e27"], losses
        await pilot.press("space", "down", "space")
        await pilot.pause(0.2)
        assert "compare" in footer_actions(screen)
        title = screen.query_one("#picker-title", Static)
        assert title.size.height == 1 and title.render_line(0).text.startswith(" runs in ")
        if size[0] == 80:
            keys = {key.key: key for key in screen.query(FooterKey)}
            assert "question_mark" in keys and keys["question_mark"].region.right <= 80, sorted(keys)


# -- 4. a run directory that goes away ---------------------------------------------------------------------

@pytest.mark.parametrize("how", ["renamed", "removed"])
async def test_a_run_directory_that_goes_away_is_said_gone(tmp_path, how):
    import shutil

    run_dir = tmp_path / "run"
    write_small_run(run_dir, end="run_finished")
    async with app_for(run_dir, follow=True).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        assert screen.header.text().plain.startswith(" FINISHED ")
        if how == "renamed":
            run_dir.rename(tmp_path / "elsewhere")
        else:
            shutil.rmtree(run_dir)
        await until(pilot, lambda: screen.header.text().plain.startswith(" GONE "), "the header to say GONE")
        second = screen.header.render_line(1).text
        assert "is gone (removed or renamed)" in screen.header.text().plain and second.strip()
        assert screen.state == "gone" and "stop" not in footer_actions(screen)


# -- 5. wrapping a paused log keeps the place ------------------------------------------------------------

async def test_wrapping_a_paused_log_keeps_the_line_at_the_top(tmp_path):
    """`w` drew the log again from the top: the view jumped from step 735 to step 360."""
    run_dir = tmp_path / "run"
    write_fixture_run(run_dir)
    with open(run_dir / "train.log", "a", encoding="utf-8") as handle:
        for step in range(1000):
            handle.write(f"step {step} | " + ("a long line " * 20 if step % 3 == 0 else "short") + "\n")
    async with app_for(run_dir).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        log = screen.query_one("#log", LogPane)
        await until(pilot, lambda: log.max_scroll_y > 100, "the log")
        log.focus()
        await pilot.press("end", *["pageup"] * 8)
        await pilot.pause()
        assert not log.follow
        top = log.line_at_top()
        text_at_top = log.lines[round(log.scroll_y)].text
        for _ in range(2):  # wrap, then scroll sideways again
            await pilot.press("w")
            await pilot.pause()
            assert log.line_at_top() == top
            assert log.lines[round(log.scroll_y)].text.split("|")[0] == text_at_top.split("|")[0], log.scroll_y


# -- 6. the last eval in the trainer's words ---------------------------------------------------------------

def test_eval_text_phrases_the_figures_as_the_trainer_does():
    from tideborn.rundir.report import eval_text  # here: the formatter is what this test is about

    event = parse_event({"kind": "eval", "time": 1.0, "step": 4000, "policy_loss": 2.3456, "value_loss": 2.0649,
                         "policy_accuracy": 0.2154, "policy_accuracy_legal": 0.2331, "value_accuracy": None,
                         "positions": 8192, "skipped_records": 0, "seconds": 1.5, "new_figure": 3.0676e26,
                         "ema": {"policy_loss": 2.2, "policy_accuracy": 0.25}})
    assert eval_text(event) == ("step 4,000: policy top-1 21.5% (legal 23.3%), value accuracy n/a, policy loss "
                                "2.35, value loss 2.06, new_figure 3.07e26 (8,192 positions); EMA policy top-1 "
                                "25.0%, policy loss 2.2")


async def test_status_and_the_checkpoint_screen_print_the_last_eval_alike(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_fixture_run(run_dir)
    assert train_run_main(["status", "--out-dir", str(run_dir)]) == 1  # the fixture has anomalies
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("eval "))
    said = line.removeprefix("eval").strip()
    assert said.startswith("step 400: policy top-1 40.0%, value accuracy 70.0%, policy loss 2.01"), said
    async with app_for(run_dir).run_test(size=(80, 24)) as pilot:
        await attached(pilot)
        await pilot.press("k")
        await pilot.pause()
        screen = pilot.app.screen
        assert isinstance(screen, CheckpointScreen)
        box = screen.query_one("#evals", Static)
        assert str(box.render()) == said
        assert box.border_title == "last eval (as status shows it, 1m06s ago)"
