"""A yes/no question (starting or stopping a run): y confirms, n or Escape declines."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question", markup=False)  # it names run files
            yield Static("[b]y[/b] yes    [b]n[/b] / Esc no", id="confirm-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
