"""A real terminal for the monitor: tmux on a private socket, its screen read and keys sent."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest

TMUX = shutil.which("tmux") or "/usr/bin/tmux"


WAIT_SECONDS = 600.0
"""A hung step fails the test instead of hanging the suite (the trainer imports torch first)."""


class Terminal:
    def __init__(self, socket: str):
        self.socket = socket

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([TMUX, "-L", self.socket, *args], capture_output=True, text=True, check=check,
                              timeout=30)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "tui").stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "tui", *keys)

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "tui", check=False).returncode == 0

    def wait_for(self, pattern: str, what: str, timeout: float = WAIT_SECONDS) -> re.Match:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            if not self.alive():
                pytest.fail(f"the TUI exited before {what}; last screen:\n{screen}")
            screen = self.screen()
            found = re.search(pattern, screen)
            if found:
                return found
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}; last screen:\n{screen}")
