"""Entry point of `tideborn-tui`: a Textual monitor for tideborn runs (no torch).

`create_app(options)` builds the app (tests use it); `main` parses the command line. The screens do the
work: a run's dashboard, the picker for a folder of runs, the override editor, help. See docs/tui.md.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import termios
import threading
import typing

from textual.app import App
from textual.binding import Binding

from tideborn.errors import UserError
from tideborn.tui.driver import KEYS_PER_SECOND, BoundedInputDriver
from tideborn.tui.messages import KeysDropped
from tideborn.tui.options import TuiOptions, main_error, parse_options
from tideborn.tui.plan import LaunchPlan

TERMINAL_GONE = 129
"""The exit status when the terminal went away (as for SIGHUP)."""
EXIT_GRACE_SECONDS = 5.0


class TidebornApp(App[None]):
    CSS_PATH = "tideborn.tcss"
    TITLE = "tideborn"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark,f1", "help", "Help"),
    ]
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, options: TuiOptions) -> None:
        if options.ascii and "NO_COLOR" not in os.environ:
            # Textual turns colour off for NO_COLOR when the app is made; ASCII mode means no colour too
            os.environ["NO_COLOR"] = "1"
            try:
                super().__init__(driver_class=BoundedInputDriver)
            finally:
                del os.environ["NO_COLOR"]
        else:
            super().__init__(driver_class=BoundedInputDriver)
        self.options = options
        self._exiting = False
        self._watchdog_started = False
        self.plan: LaunchPlan | None = options.plan
        self.exports: list = []
        """`tideborn export` jobs started from the checkpoint screen (tideborn.tui.screens.checkpoints.ExportJob)
        still running: quitting asks first, and every way out stops them."""
        """What the start key launches; the override editor replaces it."""
        if options.ascii:
            self.add_class("-ascii")

    def on_mount(self) -> None:
        from tideborn.tui.screens.dashboard import DashboardScreen
        if not self.is_headless:
            self._watch_terminal()
        from tideborn.tui.screens.run_picker import RunPickerScreen

        if self.options.runs_folder is not None:
            self.push_screen(RunPickerScreen(self.options.runs_folder, self.options))
        else:
            assert self.options.run_dir is not None
            self.push_screen(DashboardScreen(self.options.run_dir, self.options))

    def _watch_terminal(self) -> None:
        """Exit, restoring the terminal, on SIGTERM or SIGHUP, and when the terminal goes away.

        Textual's input thread reads a hung-up terminal's end of file again and again (a core at 40-50%
        forever once the window is closed and SIGHUP is ignored), so the terminal is checked every second:
        a hung-up tty refuses tcgetattr (EIO). A SIGHUP ignored from the start (nohup) stays ignored; the
        check still ends the app when its terminal is gone.
        """
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, functools.partial(self._on_signal, loop))
        self.set_interval(1.0, self._check_terminal)

    def _on_signal(self, loop: asyncio.AbstractEventLoop, signum: int, _frame: object) -> None:
        """A plain signal handler, not the event loop's: Python runs it in the main thread whatever the loop is
        doing, so a loop kept busy (by a flood of input, say) cannot hold the exit back. It only stands the
        watchdog by and asks the loop for the orderly exit, which restores the terminal."""
        self._start_watchdog(128 + signum)
        loop.call_soon_threadsafe(self._signalled, signum)

    def _signalled(self, signum: int) -> None:
        if terminal_present():  # Textual's driver restores the terminal on the way out
            self._start_watchdog(128 + signum)
            self.exit(return_code=128 + signum)
        else:
            self._terminal_gone(128 + signum)

    def _check_terminal(self) -> None:
        if not terminal_present():
            self._terminal_gone(TERMINAL_GONE)

    def _terminal_gone(self, status: int) -> None:
        """Exit with no terminal to restore. Textual's writes to a hung-up tty fail (EIO) and can stall
        its shutdown, so output goes to /dev/null from here on, and the watchdog stands by."""
        if self._exiting:
            return
        self._exiting = True
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        self._start_watchdog(status)
        self.exit(return_code=status)

    def _start_watchdog(self, status: int) -> None:
        """End the process if the orderly exit has not finished after EXIT_GRACE_SECONDS (a terminal
        that went away mid-shutdown, a loop that does not get to it), putting the terminal back first where
        there is one; quitting never stops a run, so nothing of a run is lost."""
        if self._watchdog_started:
            return
        self._watchdog_started = True
        watchdog = threading.Timer(EXIT_GRACE_SECONDS, self._give_up, (status,))
        watchdog.daemon = True
        watchdog.start()

    def _give_up(self, status: int) -> None:
        driver = self._driver
        if isinstance(driver, BoundedInputDriver) and not self._exiting:
            driver.restore_now()
        os._exit(status)

    def on_keys_dropped(self, message: KeysDropped) -> None:
        self.notify(f"keys are arriving faster than {KEYS_PER_SECOND:g} a second: {message.count:,} ignored",
                    severity="warning", timeout=3)

    async def action_quit(self) -> None:
        """Quit; while an export runs, ask first (quitting stops it: nothing would be left to report it)."""
        from tideborn.tui.screens.confirm import ConfirmScreen

        running = [job for job in self.exports if job.running()]
        if not running:
            self.exit()
            return
        if isinstance(self.screen, ConfirmScreen):
            return  # a question is already open
        names = ", ".join(str(job.out) for job in running)
        what = "an export is" if len(running) == 1 else f"{len(running)} exports are"

        def answer(yes: bool | None) -> None:
            if yes:
                self.exit()

        self.push_screen(ConfirmScreen(f"{what} running ({names}): quit and stop it? Its file is not written."),
                         answer)

    def exit(self, result: None = None, return_code: int = 0, message: typing.Any = None) -> None:
        """Every way out (the quit key, SIGTERM, SIGHUP, the terminal gone) stops the exports still running
        first, so that none goes on alone or leaves a partial file (ExportJob.stop)."""
        for job in list(self.exports):
            job.stop()
        self.exports.clear()
        super().exit(result, return_code, message)

    def notify(self, message: str, *, title: str = "", severity: typing.Any = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Every notification as plain text: they quote run files (a traceback's "[/batch]" would stop the app
        with a MarkupError, and "[watchdog]" would vanish), and none of ours is written in markup."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def action_help(self) -> None:
        from tideborn.tui.screens.help import TextScreen, help_text

        if isinstance(self.screen, TextScreen):
            return
        self.push_screen(TextScreen("help", help_text(self.screen)))


def create_app(options: TuiOptions) -> TidebornApp:
    return TidebornApp(options)


def main(argv: typing.Sequence[str] | None = None) -> int:
    try:
        options = parse_options(argv)
    except UserError as exc:
        return main_error(exc)
    if not interactive():
        return main_error(UserError("standard input and standard error must be a terminal: tideborn-tui is "
                                    "interactive (train_run status or watch report a run without one)"))
    app = create_app(options)
    app.run()
    return app.return_code or 0


def terminal_present() -> bool:
    """Is the terminal the keys come from still there? A hung-up tty (its window closed) refuses tcgetattr
    with EIO."""
    try:
        termios.tcgetattr(sys.__stdin__.fileno())
    except (termios.error, OSError, ValueError):  # hung up, revoked or closed
        return False
    return True


def interactive() -> bool:
    """Keys come from standard input and Textual draws on standard error: both must be a terminal (on a
    pipe or /dev/null the input thread would read end of file forever)."""
    try:
        return os.isatty(sys.__stdin__.fileno()) and os.isatty(sys.__stderr__.fileno())
    except (AttributeError, ValueError, OSError):  # closed or missing (None) standard streams
        return False


if __name__ == "__main__":
    sys.exit(main())
