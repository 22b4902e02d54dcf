"""The monitor's terminal driver: Textual's own, with key input bounded, and a way to put the terminal back
when the orderly exit cannot finish.

Why bounded: Textual hands every key the terminal sends to the event loop, however fast they come. A flood
(a key held down in a slow terminal, a paste with no bracketed paste, a line sending NUL bytes: thousands a
second) outruns the app, and the queue of keys waiting grows without bound: memory climbs, and a SIGTERM
waits behind the keys. Here keys beyond a budget (KEYS_PER_SECOND, with a burst of KEY_BURST) are dropped
in the input thread before they reach the loop, and the app is told how many (`KeysDropped`).
"""

from __future__ import annotations

import os
import termios
import time

from textual import events
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

from tideborn.tui.messages import KeysDropped

KEYS_PER_SECOND = 100.0
"""Well above typing or a key's auto-repeat (30 to 50 a second); well below what the app can handle."""
KEY_BURST = 200.0
DROP_NOTICE_SECONDS = 2.0
"""The app hears about dropped keys at most this often."""
RESTORE_SEQUENCES = ("\x1b[?2004l\x1b[?7h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1015l"
                     "\x1b[<u\x1b[?1049l\x1b[?25h\x1b[?1004l")
"""What Textual's stop_application_mode writes (bracketed paste and mouse off, line wrap on, the kitty keyboard
protocol popped, the main screen back, the cursor shown, focus events off), all at once."""


class KeyBudget:
    """A token bucket: `rate` keys a second, up to `burst` at once."""

    def __init__(self, rate: float = KEYS_PER_SECOND, burst: float = KEY_BURST) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.updated: float | None = None

    def take(self, now: float) -> bool:
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class BoundedInputDriver(LinuxDriver):
    """Textual's Linux driver; keys past the budget are dropped in the input thread (counted, and reported)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.budget = KeyBudget()
        self.dropped_keys = 0
        self._reported = 0
        self._last_notice = 0.0

    def process_message(self, message: Message) -> None:
        # Runs in the input thread
        if isinstance(message, events.Key):
            now = time.monotonic()
            if not self.budget.take(now):
                self.dropped_keys += 1
                if now - self._last_notice >= DROP_NOTICE_SECONDS:
                    self._last_notice = now
                    self.send_message(KeysDropped(self.dropped_keys - self._reported))
                    self._reported = self.dropped_keys
                return
        super().process_message(message)

    def restore_now(self) -> None:
        """Put the terminal back as it was before the app, from any thread, without the event loop: the last
        thing done before the process ends when the orderly exit has not finished in time."""
        try:
            os.write(self._file.fileno(), RESTORE_SEQUENCES.encode())
        except (OSError, ValueError):  # the terminal is gone (or its stream closed): there is nothing to restore
            return
        if self.attrs_before is not None:
            try:
                termios.tcsetattr(self.fileno, termios.TCSANOW, self.attrs_before)
            except termios.error:  # revoked between the write and this: the terminal is gone too
                return
