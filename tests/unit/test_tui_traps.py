"""The dashboard's traps: anomalies stay visible while they hold (header badge, alert colour, scrolled
into view, found before the tail), the log pane can be read during a live run (follow toggle, long
lines, Enter on an anomaly jumps to its line), the header fits 80 columns. Textual's run_test on real
run directories."""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import pytest

from tests.helpers.common import until
from tests.helpers.tui import app_for, attached
from tideborn.rundir.anomaly import Anomaly
from tideborn.rundir.events import encode_event
from tideborn.rundir.kinds import parse_event
from tideborn.tui.messages import RunRefreshed
from tideborn.tui.screens.dashboard import DashboardScreen
from tideborn.tui.testing import FIXTURE_NOW, write_fixture_run
from tideborn.tui.widgets import anomalies as anomalies_module
from tideborn.tui.widgets.anomalies import AnomalyList
from tideborn.tui.widgets.log_pane import LogPane

pytestmark = pytest.mark.usefixtures("utc")  # clock times in UTC, whatever this machine's zone


@pytest.fixture
def fixture_run(tmp_path) -> Path:
    run_dir = tmp_path / "runs" / "fixture"
    write_fixture_run(run_dir)
    return run_dir


def header_lines(screen: DashboardScreen) -> list[str]:
    header = screen.header
    return [header.render_line(y).text for y in range(header.size.height)]


# -- anomalies stay visible ---------------------------------------------------------------------------

async def test_the_header_badge_shows_anomalies_that_hold_not_a_plain_state(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 40)) as pilot:
        screen = await attached(pilot)
        nan = Anomaly("nonfinite_loss", "non-finite loss at step 410: loss nan", {"step": 410, "loss": "nan"},
                      FIXTURE_NOW)
        running = dataclasses.replace(screen.status, state="running", terminal=None, pid=1, anomalies=(nan,))
        screen.header.show_status(running)
        await pilot.pause()
        first = header_lines(screen)[0]
        assert first.startswith(" RUNNING  1 anomaly ")
        badge = [span for span in screen.header.text().spans if span.end <= len(" RUNNING ")]
        assert badge and all("red" in str(span.style) and "green" not in str(span.style) for span in badge)
        screen.header.show_status(dataclasses.replace(running, anomalies=()))  # it holds no longer: the plain state
        await pilot.pause()
        assert "anomal" not in header_lines(screen)[0]
        assert any("green" in str(span.style) for span in screen.header.text().spans)


async def test_the_pane_keeps_its_alert_colour_while_anomalies_hold(fixture_run, monkeypatch):
    monkeypatch.setattr(anomalies_module, "ALERT_SECONDS", 0.05)
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        pane = screen.query_one("#anomalies", AnomalyList)
        assert screen.status.anomalies  # the fixture's OOM and traceback hold (status lists them)
        await pilot.pause(0.3)
        assert pane.has_class("-alert")
        pane.hold(False)  # none holds any more: the flash ends
        pane.alert()
        await pilot.pause(0.3)
        assert not pane.has_class("-alert")


async def test_new_anomalies_scroll_into_view(fixture_run):
    async with app_for(fixture_run).run_test(size=(100, 30)) as pilot:
        screen = await attached(pilot)
        pane = screen.query_one("#anomalies", AnomalyList)
        pane.add_anomalies([Anomaly("nonfinite_loss", f"non-finite loss at step {1000 + i}", {"step": 1000 + i},
                                    FIXTURE_NOW) for i in range(40)])
        await pilot.pause(0.2)
        assert pane.max_scroll_y > 0
        assert pane.scroll_y == pane.max_scroll_y
        assert pane.highlighted == pane.option_count - 1


async def test_an_anomaly_before_the_tail_is_found(tmp_path):
    """A NaN in the first steps of a run whose events.jsonl is longer than the tail read at first."""
    run_dir = tmp_path / "long"
    run_dir.mkdir()
    start = FIXTURE_NOW - 100_000
    with open(run_dir / "events.jsonl", "wb") as handle:
        handle.write(encode_event("run_started", {"step": 0, "max_steps": 100_000, "pid": 1, "host": "elsewhere"},
                                  now=start))
        for step in range(1, 16_000):
            bad = step in (7, 8)  # a streak of two: one anomaly, as status reports it
            handle.write(encode_event("step", {"step": step, "loss": "nan" if bad else 2.0, "policy_loss": 1.5,
                                               "value_loss": 0.5, "lr": 0.01, "padding": "x" * 80},
                                      now=start + step))
    assert (run_dir / "events.jsonl").stat().st_size > 2 * 1024 * 1024
    async with app_for(run_dir).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        pane = screen.query_one("#anomalies", AnomalyList)
        found = [a for a in pane.anomalies if a.rule == "nonfinite_loss"]
        assert [a.evidence["step"] for a in found] == [7]
        assert pane.anomalies[0] is found[0]  # oldest first
        assert 7.0 in [m.step for m in screen.plot.anomaly_markers]


# -- the log pane ---------------------------------------------------------------------------------------

def long_log(run_dir: Path, lines: int = 200) -> None:
    with open(run_dir / "train.log", "a", encoding="utf-8") as handle:
        for i in range(lines):
            handle.write(f"step {1000 + i} | filler line {i}\n")


async def test_scrolling_up_stays_put_while_lines_arrive_and_f_follows_again(fixture_run):
    long_log(fixture_run)
    async with app_for(fixture_run, follow=True).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        log = screen.query_one("#log", LogPane)
        await until(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y, "the log at its end")
        assert log.has_focus and log.follow
        await pilot.press("pageup", "up")
        await pilot.pause()
        kept = log.scroll_y
        assert kept < log.max_scroll_y and not log.follow
        count = len(log.lines)
        long_log(fixture_run, 30)
        await until(pilot, lambda: len(log.lines) >= count + 30, "the new lines")
        await pilot.pause(0.1)
        assert log.scroll_y == kept  # stays put
        await pilot.press("f")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y, "the log to follow again")
        assert log.follow
        long_log(fixture_run, 30)
        await until(pilot, lambda: len(log.lines) >= count + 60, "more lines")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y, "following the new lines")


async def test_long_log_lines_scroll_sideways_or_wrap(fixture_run):
    with open(fixture_run / "train.log", "a", encoding="utf-8") as handle:
        handle.write("a long line " + "x" * 300 + " END\n")
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        log = screen.query_one("#log", LogPane)
        await until(pilot, lambda: log.lines, "log lines")
        assert log.max_scroll_x > 0
        log.focus()
        await pilot.press("end", "right", "right")
        await pilot.pause()
        assert log.scroll_x > 0
        count = len(log.lines)
        await pilot.press("w")
        await pilot.pause()
        assert log.wrap and len(log.lines) > count  # the long line takes several rows now
        assert any(strip.text.rstrip().endswith("END") for strip in log.lines)
        assert log.max_scroll_x == 0


async def test_enter_on_a_log_anomaly_jumps_to_its_line(fixture_run):
    long_log(fixture_run)  # the OOM line is far above the end
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        log = screen.query_one("#log", LogPane)
        pane = screen.query_one("#anomalies", AnomalyList)
        await until(pilot, lambda: log.lines, "log lines")
        oom = next(i for i, a in enumerate(pane.anomalies) if a.rule == "cuda_oom")
        pane.focus()
        pane.highlighted = oom
        await pilot.press("enter")
        await pilot.pause()
        assert log.has_focus and not log.follow
        assert log.lines[int(log.scroll_y)].text.startswith("torch.OutOfMemoryError")
        pane.focus()
        await pilot.press("d")  # the details are a key away
        await pilot.pause()
        assert "cuda_oom" in str(pilot.app.screen.body)


# -- the header fits 80 columns ------------------------------------------------------------------------

async def test_an_80_column_header_keeps_both_lines_and_the_failure(fixture_run):
    async with app_for(fixture_run).run_test(size=(80, 30)) as pilot:
        screen = await attached(pilot)
        error = "RuntimeError: CUDA error: an illegal memory access was encountered\nTraceback (most recent ..."
        screen.header.note = "a long note that would push the header onto a third line if it wrapped at all"
        screen.header.show_status(dataclasses.replace(screen.status, state="failed", anomalies=(), terminal=parse_event(
            {"kind": "run_failed", "step": 12, "error": error})))
        await pilot.pause()
        first, second = header_lines(screen)
        assert first.startswith(" FAILED ") and "step 400" in first
        assert second.startswith(" run_failed at step 12: RuntimeError: CUDA error")


# -- header, notifications, help, ASCII, keys that refuse ----------------------------------------------

def screen_text(app) -> str:
    """Every character on the screen, from Textual's own screenshot."""
    svg = app.export_screenshot()
    return "".join(html.unescape(t) for t in re.findall(r"<text [^>]*>(.*?)</text>", svg)).replace("\xa0", " ")


async def test_ascii_mode_emits_only_ascii(fixture_run):
    long_log(fixture_run)
    with open(fixture_run / "train.log", "a", encoding="utf-8") as handle:
        handle.write("a long line " + "x" * 300 + "\n")
    async with app_for(fixture_run, ascii=True, colour=False).run_test(size=(80, 24)) as pilot:
        await attached(pilot)
        await pilot.pause(0.2)
        shown = screen_text(pilot.app)
        assert "STOPPED" in shown
        assert shown.isascii(), sorted({c for c in shown if not c.isascii()})
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        shown = screen_text(pilot.app)
        assert "Keys here" in shown and shown.isascii(), sorted({c for c in shown if not c.isascii()})


async def test_help_lists_every_key_by_a_readable_name(fixture_run):
    async with app_for(fixture_run).run_test(size=(120, 60)) as pilot:
        screen = await attached(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        body = str(pilot.app.screen.body)
    assert "question_mark" not in body and "escape" not in body
    listed = {line.split()[0].rstrip(",") for line in body.splitlines() if line.startswith("  ")}
    for binding in [*screen.BINDINGS, *pilot.app.BINDINGS]:
        for key in binding.key.split(","):
            assert pilot.app.get_key_display(type(binding)(key, "")) in listed or key in body, key
    assert "Enter jumps" in body and "End or f follows" in body


async def test_notifications_never_cover_the_anomalies(fixture_run):
    async with app_for(fixture_run).run_test(size=(80, 24), notifications=True) as pilot:
        screen = await attached(pilot)
        for i in range(3):
            screen.notify(f"a long notification number {i} " * 3, timeout=30)
        await pilot.pause(0.3)
        pane = screen.query_one("#anomalies", AnomalyList).region
        toasts = [t.region for t in screen.query("Toast")]
        assert toasts
        assert not any(t.overlaps(pane) for t in toasts), (toasts, pane)


async def test_an_empty_directory_without_config_does_not_offer_start_or_edit(tmp_path):
    (tmp_path / "empty").mkdir()
    async with app_for(tmp_path / "empty").run_test(size=(80, 24)) as pilot:
        screen = await attached(pilot)
        await until(pilot, lambda: screen.state == "not started" and screen.header.note, "the header's note")
        await pilot.pause()
        footer = screen_text(pilot.app).splitlines()
        shown = screen_text(pilot.app)
        assert "Start" not in shown and "Overrides" not in shown, footer
        assert "s starts a run" not in shown and "--config" in shown
        seen: list = []
        pilot.app.notify = lambda message, **kw: seen.append(message)  # pressed anyway: it says why
        await pilot.press("s")
        await pilot.pause()
        assert seen and "no --config given" in seen[0]


async def test_a_stall_held_across_refreshes_is_listed_once(fixture_run):
    """status's stalled message counts the seconds: each refresh brings a new text, the pane one entry."""
    async with app_for(fixture_run).run_test(size=(120, 40)) as pilot:
        screen = await attached(pilot)
        pane = screen.query_one("#anomalies", AnomalyList)
        count = len(pane.anomalies)
        for quiet in (300, 301, 302):
            stall = Anomaly("stalled", f"no new output in events.jsonl or train.log for {quiet} s", {}, FIXTURE_NOW)
            screen.post_message(RunRefreshed(dataclasses.replace(screen.status, state="stalled", anomalies=(stall,))))
            await pilot.pause()
        assert [a.rule for a in pane.anomalies[count:]] == ["stalled"]
        assert screen.header.render_line(0).text.startswith(" STALLED  1 anomaly ")


@pytest.mark.parametrize("state", ["empty", "stopped"])
async def test_the_footer_keeps_help_within_80_columns_with_a_launch_plan(tmp_path, state):
    """With --config the footer also offers Start and Overrides: the view keys (m, l, n) live in the help
    screen, so that "? Help" is still on screen at 80 columns (it was cut off after "f Foll")."""
    from textual.widgets._footer import FooterKey

    from tideborn.tui.plan import LaunchPlan

    run_dir = tmp_path / "run"
    if state == "stopped":
        write_fixture_run(run_dir)
    else:
        run_dir.mkdir()
    plan = LaunchPlan(config=str(Path(__file__).parents[2] / "configs" / "smoke.toml"), cwd=tmp_path)
    async with app_for(run_dir, plan=plan).run_test(size=(80, 24)) as pilot:
        await attached(pilot)
        await pilot.pause()
        shown = {key.key: key for key in pilot.app.screen.query(FooterKey)}
        assert "s" in shown and "e" in shown, sorted(shown)
        assert "question_mark" in shown and shown["question_mark"].region.right <= 80, \
            [(k, key.region) for k, key in shown.items()]
