"""Graceful stop on SIGTERM/SIGINT (no torch here, so it can be installed before torch loads).

During start-up, until the trainer takes its run directory (`defer_ctrl_c`), Ctrl-C (SIGINT) ends the process at
once, as in any tool: nothing of the run has been written, nor is there anything to save, so there is nothing to
wait for (teacher-data caches built meanwhile are written whole or not at all).
The first signal after that (and a SIGTERM at any time) only sets `reason`: the loop finishes its step,
checkpoints, writes `run_stopped` and exits 0 (a Ctrl-C before the first step: `run_stopped` and exit 130, no
checkpoint). A stop is then in progress, and no later signal may cut its checkpoint short:

- a further SIGTERM (a second `train_run stop`, a second `kill`, the TUI's stop) is ignored: it is noted
  on stderr and in the events, and the stop goes on. SIGKILL is the way to end the process at once.
- a further SIGINT (Ctrl-C again, at a terminal) means "end now", but never inside a checkpoint save:
  during one (`saving()`) it is noted and the process ends as soon as that save is complete, which
  for the stop's own save is the moment it writes `run_stopped`; at any other moment it ends the
  process at once, as before (the steps since the newest checkpoint are lost).

A listener (the trainer's event writer, set once `run_started` is written) hears of each: the first
signal as `stop_requested`, so that a second `stop` or a monitor can see a stop is in progress.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import typing

from tideborn.errors import interrupt
from tideborn.rundir.kinds import EventRecord, RunWarning, StopRequested

Listener = typing.Callable[[type[EventRecord], dict], None]
"""Called from the signal handler with an event kind (`stop_requested` or `warning`) and its fields."""


class StopRequest:
    def __init__(self) -> None:
        self.reason: str | None = None
        """The first stop signal's name (`SIGTERM`, `SIGINT`), or None while no stop was asked for."""
        self.requested_at: float | None = None
        """Unix time the first stop signal arrived."""
        self.repeated: list[str] = []
        """Signals that arrived while the stop was in progress (ignored, or deferred past a save)."""
        self._saving = 0
        self._listener: Listener | None = None
        self._previous: dict[int, object] = {}
        self.ctrl_c_interrupts = False
        """Ctrl-C raises KeyboardInterrupt (`errors.interrupt`) instead of asking for a stop: start-up."""
        self._interrupted = False

    def install(self, ctrl_c_interrupts: bool = False) -> StopRequest:
        """Handle SIGTERM and SIGINT from now on; with `ctrl_c_interrupts`, SIGINT interrupts at once until
        `defer_ctrl_c` (the trainer's start-up, before it writes anything)."""
        self.ctrl_c_interrupts = ctrl_c_interrupts
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._listener = None

    def defer_ctrl_c(self) -> None:
        """The trainer takes its run directory: from now on Ctrl-C asks for a stop, which writes the attempt's
        terminal event (before the first step, the trainer then exits 130), never an interrupted write.
        A Ctrl-C of the start-up that something swallowed is raised again here, before anything is written: torch's
        module init clears a KeyboardInterrupt raised in numpy's import and goes on without numpy."""
        if self.ctrl_c_interrupts and self._interrupted:
            interrupt()
        self.ctrl_c_interrupts = False

    def listen(self, listener: Listener | None) -> None:
        """Tell `listener` about stop signals from now on; a stop asked for before is told at once."""
        self._listener = listener
        if self.reason is not None:
            self._tell(StopRequested, {"signal": self.reason, "requested_at": self.requested_at})

    @contextlib.contextmanager
    def saving(self) -> typing.Iterator[None]:
        """A checkpoint save: a repeated SIGINT waits for its end instead of ending the process inside it."""
        self._saving += 1
        try:
            yield
        finally:
            self._saving -= 1

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT and self.ctrl_c_interrupts:
            self._interrupted = True
            interrupt(signum, frame)
        name = signal.Signals(signum).name
        if self.reason is None:
            self.reason, self.requested_at = name, time.time()
            self._tell(StopRequested, {"signal": name, "requested_at": self.requested_at})
            return
        self.repeated.append(name)
        if signum == signal.SIGINT and not self._saving:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if signum == signal.SIGINT:
            text = (f"{name} again during a checkpoint save: the process ends as soon as the save is complete "
                    f"(pid {os.getpid()})")
        else:
            text = (f"{name} again while the {self.reason} stop is in progress: ignored, the stop goes on (it "
                    f"finishes the step, saves a checkpoint and exits); kill -KILL {os.getpid()} ends it at once, "
                    "losing the steps since the last checkpoint")
        _stderr(text)
        self._tell(RunWarning, {"message": text, "signal": name})

    def _tell(self, record: type[EventRecord], fields: dict) -> None:
        if self._listener is None:
            return
        # An exception must not escape a signal handler: it would be raised wherever the main thread was.
        try:
            self._listener(record, fields)
        except (OSError, ValueError) as exc:
            _stderr(f"could not write the {record.KIND} event: {exc}")


def _stderr(text: str) -> None:
    """One line on stderr (train.log) from a signal handler: a plain write(2), never the buffered
    `sys.stderr`, which the interrupted main thread may be in the middle of using."""
    try:
        os.write(2, f"{text}\n".encode())
    except OSError:
        pass  # stderr is gone or full: the event (if it could be written) still says it
