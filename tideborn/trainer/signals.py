"""Graceful stop on SIGTERM/SIGINT (no torch here, so it can be installed before torch loads).

The first signal only sets `reason`: the loop finishes its step, checkpoints, writes `run_stopped` and
exits 0. A second signal restores the default action and re-raises it, ending the process at once.
"""

from __future__ import annotations

import os
import signal


class StopRequest:
    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        if self.reason is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.reason = signal.Signals(signum).name
