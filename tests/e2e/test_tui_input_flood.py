"""An input flood (thousands of keys a second, NUL bytes among them) neither grows the monitor's memory without
bound nor keeps it from ending on SIGTERM, and the terminal is put back. A real monitor process in a
pseudo-terminal (raw bytes in and out, faster than tmux send-keys can type)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import psutil
import pytest

from tests.helpers.common import child_env
from tideborn.tui.testing import write_fixture_run

FLOOD = (b"\x00" * 48 + b"jk[]" * 8 + b"\x1b[A\x1b[B" * 4 + b"\x00" * 16) * 16
"""NUL bytes (Ctrl+@, bound to nothing), keys that move the log and pan the charts, arrow keys: nothing that
quits, starts or opens a screen. About 1,600 keys a chunk, written as fast as the terminal takes them: far
more than the monitor can handle on an idle machine."""
FLOOD_SECONDS = 6.0
GROWTH_LIMIT_MB = 25.0
"""What RSS may grow by while flooded after its first second (the monitor before the bound: about 8 MB a
second, without end)."""
WAIT_SECONDS = 600.0
RESTORE = b"\x1b[?1049l"
"""The escape that leaves the alternate screen and puts the main screen back."""


class Pty:
    """The monitor in a pseudo-terminal of 120x40; everything it writes is read (and kept) as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.before = termios.tcgetattr(slave)
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True)
        os.close(slave)
        os.set_blocking(master, False)  # the flood never waits on a full input buffer
        self.master = master
        self.output = bytearray()
        self.restored = False
        """Whether the monitor wrote the escape that leaves the alternate screen. Kept apart from `output`,
        which holds only its last 400 kB: once the monitor restores the terminal's echo, the flood still
        being written comes back as echo and can push the escape out of that tail before the process ends."""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            ready, _w, _x = select.select([self.master], [], [], 0.2)
            if not ready:
                if self.process.poll() is not None:
                    return
                continue
            try:
                chunk = os.read(self.master, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:  # EIO: the process and its terminal are gone
                return
            if not chunk:
                return
            self.output += chunk
            if RESTORE in self.output[-(len(chunk) + len(RESTORE)):]:
                self.restored = True
            del self.output[:-400_000]

    def wait_for(self, needle: bytes, what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while needle not in self.output:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {what} (exit status {self.process.poll()}); last output: "
                            f"{bytes(self.output[-500:])!r}")
            time.sleep(0.1)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.reader.join(5)
        os.close(self.master)


@pytest.fixture
def monitor(tmp_path):
    run_dir = tmp_path / "run"
    write_fixture_run(run_dir)
    terminal = Pty([sys.executable, "-m", "tideborn.tui.app", str(run_dir), "--no-nvml"],
                   child_env({"TERM": "xterm-256color", "TZ": "UTC"}))
    yield terminal
    terminal.close()


def test_a_flood_of_keys_and_nul_bytes_keeps_memory_bounded_and_sigterm_ends_it(monitor):
    monitor.wait_for(b"STOPPED", "dashboard")  # the fixture run ends with run_stopped
    process = psutil.Process(monitor.process.pid)
    stop = threading.Event()
    sent = [0]

    def flood() -> None:
        while not stop.is_set():
            try:
                sent[0] += os.write(monitor.master, FLOOD)
            except BlockingIOError:  # the terminal's input buffer is full: the monitor reads slower than this
                pass
            except OSError:  # EIO: the monitor has ended and its terminal with it
                return
            time.sleep(0.003)

    feeder = threading.Thread(target=flood, daemon=True)
    feeder.start()
    try:
        time.sleep(1.0)
        start_mb = process.memory_info().rss / 2**20
        samples = []
        for _ in range(int(FLOOD_SECONDS)):
            time.sleep(1.0)
            samples.append(process.memory_info().rss / 2**20)
        assert max(samples) - start_mb < GROWTH_LIMIT_MB, f"RSS grew from {start_mb:.0f} MB: {samples}"
        flooded = sent[0]

        # SIGTERM while the flood goes on: it ends, and through the orderly exit (status 128 + 15)
        monitor.output.clear()
        monitor.restored = False
        process.send_signal(signal.SIGTERM)
        try:
            status = monitor.process.wait(WAIT_SECONDS / 4)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM did not end the monitor under the flood")
    finally:
        stop.set()
        feeder.join(5)
    assert status == 128 + signal.SIGTERM
    # the monitor read the flood as it came (a monitor that stops reading would pass the checks above)
    assert flooded > 20_000 * FLOOD_SECONDS, f"the terminal took only {flooded} bytes of the flood"
    monitor.reader.join(5)
    assert monitor.restored, "the main screen was not restored"
    # the terminal's modes as they were: echo and canonical input on again
    after = termios.tcgetattr(monitor.master)
    assert after[3] & (termios.ECHO | termios.ICANON) == monitor.before[3] & (termios.ECHO | termios.ICANON)
