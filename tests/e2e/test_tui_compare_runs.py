"""From the monitor's checkpoint list, with real processes: a resume from a chosen checkpoint, an export, an
export that fails, and quitting while one runs."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
from textual.notifications import Notify

from tests.helpers.common import TEMPLATE_SETS, copy_run, events_of, until
from tests.helpers.reliability import launched_runs, process_gone, write_launch_file
from tests.helpers.tui import dashboard, footer, notices, options
from tideborn.rundir.files import read_pid_record
from tideborn.tui.app import create_app
from tideborn.tui.screens.checkpoints import CheckpointScreen, ChoiceScreen, ExportScreen
from tideborn.tui.screens.confirm import ConfirmScreen
from tideborn.tui.testing import write_small_run

pytestmark = pytest.mark.usefixtures("utc")  # clock times in UTC, whatever this machine's zone


async def test_resume_from_a_chosen_checkpoint_starts_the_run_from_that_step(template_run, tmp_path, launched):
    run_dir = copy_run(template_run, tmp_path / "run")  # finished at step 4; checkpoints at 2 and 4
    launched.append(run_dir)
    write_launch_file(run_dir, *TEMPLATE_SETS, "runtime.max_steps=6")
    seen: list = []
    app = create_app(options(run_dir=run_dir, clock=time.time))
    async with app.run_test(size=(110, 32), message_hook=seen.append) as pilot:
        await dashboard(pilot)
        await pilot.press("k")
        screen = pilot.app.screen
        assert isinstance(screen, CheckpointScreen)
        await pilot.pause()
        assert [ck.path.name for ck in screen.checkpoints] == ["step-000000004.pt", "step-000000002.pt"]
        assert footer(screen)["r"] == "resume"
        await pilot.press("down", "enter")
        assert isinstance(pilot.app.screen, ChoiceScreen)
        await pilot.press("r")
        question = await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen) and pilot.app.screen,
                               "the start question", timeout=120)
        assert "resumes from step-000000002.pt (step 2) to step 6" in question.question
        assert "later checkpoint(s), to step 4, are abandoned" in question.question
        await pilot.press("y")
        started = await until(pilot, lambda: next((n for n in notices(seen) if n.notification.title == "start"),
                                                  None), "the start notice", timeout=180)
        assert "at step 2" in started.notification.message
        record = read_pid_record(run_dir)
        assert record is not None and f"pid {record.pid}" in started.notification.message
        await until(pilot, lambda: process_gone(record.pid), "the trainer to train steps 3 to 6", timeout=180)
    events = events_of(run_dir)
    resumed = [e for e in events if e["kind"] == "run_started"][-1]
    assert resumed["step"] == 2 and Path(resumed["resumed_from"]).name == "step-000000002.pt"
    assert events[-1]["kind"] == "run_finished" and events[-1]["step"] == 6
    assert list((run_dir / "archive").glob("branch-*/step-000000004.pt"))  # the abandoned branch, kept


async def test_export_from_the_checkpoint_list_writes_the_onnx_model(template_run, tmp_path, monkeypatch):
    import onnx

    run_dir = copy_run(template_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    seen: list = []
    app = create_app(options(run_dir=run_dir, clock=time.time))
    async with app.run_test(size=(110, 32), message_hook=seen.append) as pilot:
        await dashboard(pilot)
        await pilot.press("k")
        await pilot.pause()
        await pilot.press("down", "enter", "x")  # step 2: not the newest
        box = pilot.app.screen
        assert isinstance(box, ExportScreen)
        await pilot.press("enter")
        assert isinstance(pilot.app.screen, CheckpointScreen)
        await pilot.press("j")  # the UI goes on while the export runs
        done = await until(pilot, lambda: next((n for n in notices(seen) if export_result(n)), None), "the export",
                           timeout=300)
    out = tmp_path / "run-step-000000002.onnx"
    assert done.notification.title == "export", done.notification.message
    assert done.notification.message.startswith(f"wrote {out}")
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert meta["tideborn.step"] == "2"
    assert not list(tmp_path.glob(".*.tmp-*"))


async def test_export_failure_is_one_line(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    write_small_run(run_dir)  # its checkpoints are not checkpoints: tideborn export refuses them
    monkeypatch.chdir(tmp_path)
    seen: list = []
    async with create_app(options(run_dir=run_dir)).run_test(size=(110, 32), message_hook=seen.append) as pilot:
        await dashboard(pilot)
        await pilot.press("k")
        await pilot.pause()
        await pilot.press("x", "enter")
        failed = await until(pilot, lambda: next((n for n in notices(seen) if n.notification.title == "export failed"),
                                                 None), "the export's refusal", timeout=300)
    message = failed.notification.message
    assert message.startswith("exit status 2: tideborn export: ") and "step-000000100.pt" in message, message
    assert "\n" not in message
    assert not (tmp_path / "run-step-000000100.onnx").exists()


async def test_quitting_during_an_export_asks_then_stops_it_and_leaves_no_file(template_run, tmp_path, monkeypatch):
    """A real `tideborn export` running when q is pressed: a y/n question, then the export is stopped (no
    process left behind, no ONNX file, no temp file)."""
    run_dir = copy_run(template_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    app = create_app(options(run_dir=run_dir, clock=time.time))
    exporting: list[psutil.Process] = []
    try:
        async with app.run_test(size=(110, 32)) as pilot:
            await dashboard(pilot)
            await pilot.press("k")
            await pilot.pause()
            await pilot.press("x", "enter")
            exporting = await until(pilot, export_children, "tideborn export to start")
            assert all(p.is_running() for p in exporting)  # still importing torch: caught mid-way
            await pilot.press("q")
            question = await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen) and pilot.app.screen,
                                   "the question", timeout=30)
            assert "an export is running" in question.question and "quit and stop it?" in question.question
            await pilot.press("y")
            await until(pilot, lambda: not pilot.app.is_running, "the app to quit")
        assert exporting and not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in exporting)
        assert not export_children()
        assert not (tmp_path / "run-step-000000004.onnx").exists()
        assert not list(tmp_path.glob(".*.tmp-*"))
    finally:
        for process in exporting + export_children():  # the old code left it running: end it here
            try:
                process.kill()
                process.wait(30)
            except psutil.NoSuchProcess:
                pass


def export_result(notice: Notify) -> bool:
    return (notice.notification.title in ("export", "export failed")
            and not notice.notification.message.startswith("exporting"))


def export_children() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "export" in child.cmdline():
                found.append(child)
        except psutil.NoSuchProcess:  # ended while listed
            continue
    return found


@pytest.fixture
def launched():
    yield from launched_runs()
