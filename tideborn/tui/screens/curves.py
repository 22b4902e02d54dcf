"""Which curves a chart shows (`h`): a list of the curves (the dashboard's series, the compared runs) with
a check each; space or Enter toggles the highlighted one, Esc closes. Textual's SelectionList does the list."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import SelectionList, Static
from textual.widgets.selection_list import Selection


class CurvePickerScreen(ModalScreen[set[str]]):
    """Dismissed with the names of the curves left unchecked (hidden)."""

    BINDINGS = [Binding("escape,h,q", "close", "Close")]

    def __init__(self, title: str, curves: list[tuple[str, str]], hidden: set[str]) -> None:
        super().__init__()
        self.title_text = title
        self.curves = curves
        """(name, label) of each curve."""
        self.hidden = set(hidden)

    def compose(self) -> ComposeResult:
        with Vertical(id="curves-box"):
            # Labels can be run directory names: Text, never markup.
            yield SelectionList[str](*(Selection(Text(label), name, name not in self.hidden)
                                       for name, label in self.curves), id="curves")
            yield Static(Text("space/Enter shows or hides a curve, Esc closes"), id="curves-keys")

    def on_mount(self) -> None:
        box = self.query_one("#curves-box")
        box.border_title = Text(self.title_text)
        self.query_one("#curves", SelectionList).focus()

    def on_selection_list_selected_changed(self, message: SelectionList.SelectedChanged) -> None:
        shown = set(message.selection_list.selected)
        self.hidden = {name for name, _label in self.curves if name not in shown}

    def action_close(self) -> None:
        self.dismiss(self.hidden)
