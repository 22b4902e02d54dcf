"""Help (every key of the screen it was opened from, and what the plot's marks mean) and a plain text
viewer for an anomaly's full evidence: modal screens closed with Escape, q or ?."""

from __future__ import annotations

import re

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

PLOT_NOTES = """\
The charts: losses (train and eval), accuracy (eval), learning rate, gradient norm, throughput
(positions/s) and data wait (the share of each step window spent waiting for batches), and in a run that
plays matches (runtime.match_every) the Elo against the reference, its 95% interval shaded behind the
curve; each with its own y axis: the range's ends at the top and bottom, round values (1, 2 or 5 times a
power of ten) between. Eval and match points are marked with a dot where few are in view. Where the
terminal has room (about 160x40 and up) all are shown in a grid; else one at a time, titled with its
place ("2/6 accuracy"); g shows the next (from the grid: each alone, then the grid again). z gives the
charts the whole screen, then the log, then shows everything again; h lists the curves to hide or show.
x is the training step, or with t the events' wall time. + and - zoom the x axis (about the cursor when
it is on, else the middle; the mouse wheel zooms about the pointer), [ and ] pan (sideways scrolling
too), 0 shows everything again; while zoomed the view stays put as steps arrive. v puts a cursor on a
logged step: [ and ] move it, each legend reads its curves' values there (raw~smoothed for smoothed
curves, value@step for an eval point elsewhere).
Smoothing (m on/off, < and > change the weight, 0 is off) is TensorBoard's debiased EMA and applies to
train curves only: raw values stay faint under the smoothed curve; eval points and the learning rate are
never smoothed. A column spans the lowest to the highest value of the steps it covers, so a spike always
shows. On the x axis: + / ┼ a checkpoint, < / ◀ a resume, ! an anomaly. NaN and +inf values are marked
x / × at the top, -inf v / ▼ at the bottom, and counted in the legend.
Log scale: log10 when every value shown is positive, else symmetric log (linear near zero).
Quitting (q) never stops a run; start the TUI again to reattach."""


class TextScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, title: str, body: Text | str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="text-box") as box:
            box.border_title = Text(self.title_text)  # a str title would be read as markup
            box.border_subtitle = "Esc closes"
            # An anomaly's evidence quotes train.log: "[bold]" or "[/batch]" there is text, not markup.
            yield Static(self.body, id="text-body", markup=False)

    def action_close(self) -> None:
        self.dismiss(None)


def key_name(screen: Screen, key: str) -> str:
    """A key as people write it ("?" for question_mark, "Esc" for escape), ASCII in ASCII mode."""
    shown = screen.app.get_key_display(Binding(key, ""))
    ascii_mode = screen.app.has_class("-ascii")
    return key if ascii_mode and not shown.isascii() else shown


def help_text(screen: Screen) -> Text:
    text = Text()
    text.append("Keys here\n", style="bold")
    seen = set()
    bindings = []
    for source in (screen, screen.app):
        for binding in getattr(source, "BINDINGS", []):
            # One line a key: a key with two actions (x: stop, or say a stop is in progress) is listed once.
            if isinstance(binding, Binding) and binding.action not in seen and binding.key not in seen:
                seen.update((binding.action, binding.key))
                bindings.append(binding)
    for binding in bindings:
        keys = ", ".join(key_name(screen, key.strip()) for key in binding.key.split(","))
        text.append(f"  {keys:<16}", style="bold")
        # A footer's short name ("Next") has its long form in the tooltip ("Next metric")
        text.append(f"{binding.tooltip or binding.description or binding.action}\n")
    notes = getattr(screen, "HELP", "")
    if notes and screen.app.has_class("-ascii"):  # "+ / ┼ a checkpoint": only the ASCII glyph
        notes = re.sub(r" / [^\x00-\x7f]", "", notes)
    if notes:
        text.append("\n" + notes.strip() + "\n")
    return text
