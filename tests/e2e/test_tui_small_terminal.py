"""The monitor in a real 80x24 terminal (tmux on a private socket): the Elo chart reached with g, its
points as markers; z gives the charts the whole screen and a notification then stays off the chart; h
lists the curves to hide; q quits."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.tmux import TMUX, Terminal
from tideborn.tui.plotting import POINT_GLYPH
from tideborn.tui.testing import write_small_run

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "tideborn-tui"
ENV = {"TERM": "xterm-256color", "TZ": "UTC", "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")}
WAIT_SECONDS = 600.0

pytestmark = pytest.mark.skipif(not Path(TMUX).exists(), reason="tmux is not installed")


@pytest.fixture
def terminal():
    term = Terminal(f"tideborn-small-{os.getpid()}-{time.monotonic_ns()}")
    yield term
    term.tmux("kill-server", check=False)  # ends the TUI with its terminal, if a test failed first


def test_80x24_elo_chart_maximised_with_a_notification_beside_it(terminal, tmp_path):
    run = tmp_path / "elo-run"
    write_small_run(run, last_step=300, match_every=50)
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} is missing: install the project first (pip install --no-deps -e .)")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in ENV.items())
    command = f"env {env} {shlex.join([str(SCRIPT), str(run), '--no-nvml'])}"
    terminal.tmux("new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", command)
    terminal.wait_for(r"STOPPED", "the dashboard", WAIT_SECONDS)

    terminal.keys(*["g"] * 6)
    terminal.wait_for(r"7/7 Elo vs reference", "the Elo chart", WAIT_SECONDS)
    assert POINT_GLYPH in terminal.screen()

    terminal.keys("z")  # the charts alone: the log pane's border goes, the chart reaches the footer
    terminal.wait_for(r"^(?![\s\S]*train\.log)[\s\S]*$", "the charts maximised", WAIT_SECONDS)
    terminal.keys("l")  # a view key's notification, while the chart fills the screen
    terminal.wait_for(r"log scale", "the notification", WAIT_SECONDS)
    rows = terminal.screen().split("\n")[:24]
    chart_rows = rows[2:23]
    assert chart_rows[0].startswith("7/7 Elo vs reference"), rows
    assert any("└" in row for row in chart_rows[-3:]), rows  # the x axis, uncovered, at the bottom
    assert not any("log scale" in row for row in chart_rows), rows  # the notification is over the header
    assert any("log scale" in row for row in rows[:2]), rows

    terminal.keys("h")
    terminal.wait_for(r"curves shown", "the curve list", WAIT_SECONDS)
    terminal.keys("Escape")  # alone: an Escape followed at once by q reads as Alt+q
    terminal.wait_for(r"^(?![\s\S]*curves shown)[\s\S]*$", "the curve list to close", WAIT_SECONDS)
    terminal.keys("q")
    deadline = time.monotonic() + WAIT_SECONDS
    while terminal.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not terminal.alive(), terminal.screen()
