"""Entry point of `tideborn-tui`: a Textual monitor for tideborn runs (no torch).

`create_app(options)` builds the app (tests use it); `main` parses the command line. The screens do the
work: a run's dashboard, the picker for a folder of runs, the override editor, help. See docs/tui.md.
"""

from __future__ import annotations

import os
import sys
import typing

from textual.app import App
from textual.binding import Binding

from tideborn.errors import UserError
from tui.options import TuiOptions, main_error, parse_options
from tui.plan import LaunchPlan


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
                super().__init__()
            finally:
                del os.environ["NO_COLOR"]
        else:
            super().__init__()
        self.options = options
        self.plan: LaunchPlan | None = options.plan
        """What the start key launches; the override editor replaces it."""
        if options.ascii:
            self.add_class("-ascii")

    def on_mount(self) -> None:
        from tui.screens.dashboard import DashboardScreen
        from tui.screens.run_picker import RunPickerScreen

        if self.options.runs_folder is not None:
            self.push_screen(RunPickerScreen(self.options.runs_folder, self.options))
        else:
            assert self.options.run_dir is not None
            self.push_screen(DashboardScreen(self.options.run_dir, self.options))

    def action_help(self) -> None:
        from tui.screens.help import TextScreen, help_text

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
    create_app(options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
