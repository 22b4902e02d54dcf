"""The TUI and its terminal: it refuses to run without one (stdin at end of file, a pipe; also inside a
real terminal, standard error a tty), it exits when
its terminal goes away (window closed with SIGHUP ignored) instead of spinning on end of file, and
SIGTERM and SIGHUP leave the terminal as they found it (no alternate screen, no mouse reporting, echo on). Real
processes in a real terminal (tmux on a private socket)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.tmux import TMUX
from tests.helpers.tmux import Terminal as TmuxTerminal
from tideborn.tui.testing import write_fixture_run

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "tideborn-tui"
WAIT_SECONDS = 600.0
"""A hang fails the test instead of hanging the suite."""

needs_tmux = pytest.mark.skipif(not Path(TMUX).exists(), reason="tmux is not installed")


def tui_argv(run_dir: Path) -> list[str]:
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} is missing: install the project first (pip install --no-deps -e .)")
    return [str(SCRIPT), str(run_dir), "--no-nvml"]


@pytest.fixture
def run_dir(tmp_path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    write_fixture_run(path)
    return path


ENV = {"TERM": "xterm-256color", "TZ": "UTC", "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")}


@pytest.mark.parametrize("stdin", ["devnull", "pipe"])
def test_without_a_terminal_it_refuses_with_one_line(run_dir, stdin):
    """`tideborn-tui RUN < /dev/null` and `sleep 3 | tideborn-tui RUN | head`: one line, exit 2, no spin."""
    source = subprocess.DEVNULL if stdin == "devnull" else subprocess.PIPE
    process = subprocess.Popen(tui_argv(run_dir), stdin=source, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, **ENV})
    try:
        out, err = process.communicate(timeout=WAIT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 2
    assert out == ""
    assert err.count("\n") == 1 and "must be a terminal" in err, err


class Terminal(TmuxTerminal):
    def pane(self, variable: str) -> str:
        return self.tmux("display", "-p", "-t", "tui", f"#{{{variable}}}").stdout.strip()

    def wait_for(self, pattern: str, what: str, timeout: float = WAIT_SECONDS) -> re.Match:
        return super().wait_for(pattern, what, timeout)


@pytest.fixture
def terminal(request):
    term = Terminal(f"tideborn-test-{os.getpid()}-{time.monotonic_ns()}")
    started: list[psutil.Process] = []

    def cleanup() -> None:
        term.tmux("kill-server", check=False)
        for process in started:  # the TUI, if a test failed while it still ran
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass  # it exited, as it should
    request.addfinalizer(cleanup)
    return term, started


def shell(argv: list[str], before: str = "", after: str = "") -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in ENV.items())
    return f"bash -c {shlex.quote(f'{before}env {env} {shlex.join(argv)}{after}')}"


def wait_exit(process: psutil.Process) -> None:
    try:
        process.wait(timeout=WAIT_SECONDS)
    except psutil.TimeoutExpired:
        pytest.fail(f"the TUI (pid {process.pid}) is still running, at {process.cpu_percent(1.0):.0f}% CPU")


@needs_tmux
def test_closing_the_terminal_ends_a_tui_that_ignores_sighup(terminal, run_dir):
    """The window closes, SIGHUP is ignored (nohup, an orphaned shell): the TUI exits all the same."""
    term, started = terminal
    command = shell(tui_argv(run_dir), before="trap '' HUP; exec ")
    term.tmux("new-session", "-d", "-s", "tui", "-x", "100", "-y", "30", command)
    term.wait_for(r"STOPPED|FINISHED|RUNNING|VANISHED", "the dashboard")
    process = psutil.Process(int(term.pane("pane_pid")))
    started.append(process)
    assert process.cmdline()[1:2] == [str(SCRIPT)]

    term.tmux("kill-server")  # the terminal goes away; the TUI is not signalled (SIGHUP is ignored)
    wait_exit(process)


@needs_tmux
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_restores_the_terminal(terminal, run_dir, signum):
    """SIGTERM, or SIGHUP sent while the terminal is still there (kill -HUP): the TUI exits and the
    terminal is as it was (main screen, mouse reporting off, echo and line editing on)."""
    term, started = terminal
    command = shell(tui_argv(run_dir), after='; echo "exit status $?"; stty -a; exec sleep 600')
    term.tmux("new-session", "-d", "-s", "tui", "-x", "120", "-y", "40", command)
    term.wait_for(r"STOPPED|FINISHED|RUNNING|VANISHED", "the dashboard")
    assert term.pane("alternate_on") == "1"
    shell_process = psutil.Process(int(term.pane("pane_pid")))
    [tui] = [p for p in shell_process.children() if str(SCRIPT) in p.cmdline()]
    started.append(tui)

    tui.send_signal(signum)
    wait_exit(tui)
    # stty -a's local flags line, whole (echoctl comes after echo and icanon): its output is all there
    screen = term.wait_for(r"exit status \d+[\s\S]*\s-?echoctl\s", "the TUI to exit and stty -a").string
    assert f"exit status {128 + signum}" in screen
    settings = screen[screen.index("exit status"):].split()
    assert "echo" in settings and "icanon" in settings, screen  # not -echo / -icanon: raw mode is over
    assert term.pane("alternate_on") == "0"  # back on the shell's screen
    assert term.pane("mouse_any_flag") == "0" and term.pane("mouse_sgr_flag") == "0"  # mouse reporting off


@needs_tmux
@pytest.mark.parametrize("redirect", ["< /dev/null", "<&-", "| true"], ids=["devnull", "closed", "pipe"])
def test_in_a_terminal_without_stdin_it_refuses_with_one_line(terminal, run_dir, redirect):
    """In a real terminal (tmux), standard error a tty, but standard input at end of file (/dev/null),
    closed, or a pipe whose writer is gone (`true |`): the one-line refusal and exit status 2, not a
    TUI reading end of file for ever. (The subprocess test above has standard error on a pipe too.)"""
    term, _started = terminal
    argv = shlex.join(tui_argv(run_dir))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in ENV.items())
    line = (f"true | env {env} {argv}" if redirect == "| true" else f"env {env} {argv} {redirect}")
    command = "bash -c " + shlex.quote(line + '; echo "exit status $?"; exec sleep 600')
    term.tmux("new-session", "-d", "-s", "tui", "-x", "200", "-y", "30", command)
    screen = term.wait_for(r"exit status \d+", "the refusal").string
    assert "exit status 2" in screen, screen
    assert "must be a terminal" in screen, screen
    assert "STOPPED" not in screen and term.pane("alternate_on") == "0"  # no dashboard was drawn
