"""The override editor: every setting by section with its value, docstring and origin; edits checked as
you type by the `--set` parser and the settings' own validation; the difference from the base config;
launch with the edits, or save them as a TOML file that keeps the base file's comments."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Static

from tideborn.errors import UserError
from tui.overrides import OverrideModel, SettingRow
from tui.plan import LaunchPlan

SOURCE_STYLES = {"override": "bold yellow", "config": "cyan", "tideborn.toml": "green", "preset": "magenta",
                 "default": "dim"}


class OverrideEditorScreen(Screen[tuple[str, LaunchPlan] | None]):
    """Dismissed with ("launch", plan), ("keep", plan) or None (edits dropped)."""

    HELP = ("Enter edits the highlighted setting; Enter again applies it (a value equal to the base config's "
            "drops the override), Esc cancels the edit. d drops an override. Values are TOML, as for "
            "--set: strings may be bare words. Saved files keep the base file's comments and layout.")
    BINDINGS = [
        Binding("ctrl+r", "launch", "Launch"),
        Binding("ctrl+o", "save", "Save TOML"),
        Binding("d", "drop", "Drop override"),
        Binding("escape", "back", "Back"),
        Binding("ctrl+x", "discard", "Discard edits", show=False),
    ]

    def __init__(self, plan: LaunchPlan, ascii: bool = False) -> None:
        super().__init__()
        self.model = OverrideModel(plan)  # raises UserError for a base config that does not load
        self.ascii = ascii
        self.editing: str | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="editor-main"):
            table: DataTable = DataTable(id="settings", cursor_type="row", zebra_stripes=False)
            yield table
            with Vertical(id="detail"):
                yield Static(id="doc")
                yield Input(id="value", placeholder="Enter on a setting to edit it")
                yield Static(id="error")
                yield Static(id="diff")
        yield Footer()

    def on_mount(self) -> None:
        base = self.model.plan.config or "defaults"
        self.sub_title = f"overrides for {base}"
        table = self.query_one("#settings", DataTable)
        table.border_title = f"settings ({base})"
        table.add_column("setting", key="setting")
        table.add_column("from", key="from")
        table.add_column("value", key="value")
        self._fill()
        self.query_one("#value", Input).disabled = True
        table.focus()
        self._show_diff()

    def _fill(self) -> None:
        table = self.query_one("#settings", DataTable)
        cursor = table.cursor_row
        table.clear()
        section = None
        for row in self.model.rows():
            if row.section != section:
                section = row.section
                table.add_row(Text(f"[{section}]", style="bold"), "", "", key=f"[{section}]")
            value = Text(row.text, style="bold yellow" if row.changed else "")
            table.add_row(f"  {row.name}", Text(row.source, style=SOURCE_STYLES.get(row.source, "")), value,
                          key=row.key)
        if cursor:
            table.move_cursor(row=min(cursor, table.row_count - 1))

    def _row(self, key: str | None) -> SettingRow | None:
        for row in self.model.rows():
            if row.key == key:
                return row
        return None

    def _highlighted_key(self) -> str | None:
        table = self.query_one("#settings", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return None if key is None or key.startswith("[") else key

    @on(DataTable.RowHighlighted, "#settings")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_doc(self._row(event.row_key.value))

    def _show_doc(self, row: SettingRow | None) -> None:
        doc = self.query_one("#doc", Static)
        if row is None:
            doc.update("")
            return
        text = Text()
        text.append(row.key, style="bold")
        text.append(f"  ({row.type_name})\n")
        text.append(row.doc + "\n", style="italic")
        text.append(f"from: {row.source_detail}\n", style=SOURCE_STYLES.get(row.source, ""))
        if row.changed:
            text.append(f"base config: {row.base_text}\n", style="dim")
        doc.update(text)

    @on(DataTable.RowSelected, "#settings")
    def _selected(self, event: DataTable.RowSelected) -> None:
        row = self._row(event.row_key.value)
        if row is None:
            return
        self.editing = row.key
        value = self.query_one("#value", Input)
        value.disabled = False
        value.value = self.model.plan.override_of(row.key) or row.text
        value.border_title = f"edit {row.key}"
        value.focus()
        self._check(value.value)

    @on(Input.Changed, "#value")
    def _changed(self, event: Input.Changed) -> None:
        if self.editing is not None:
            self._check(event.value)

    def _check(self, text: str) -> bool:
        assert self.editing is not None
        problem = self.model.check(self.editing, text)
        error = self.query_one("#error", Static)
        value = self.query_one("#value", Input)
        value.set_class(problem is not None, "-invalid")
        error.update(Text(problem or "ok", style="bold red" if problem else "green"))
        return problem is None

    @on(Input.Submitted, "#value")
    def _submitted(self, event: Input.Submitted) -> None:
        if self.editing is None:
            return
        problem = self.model.apply(self.editing, event.value)
        if problem is not None:
            self.query_one("#error", Static).update(Text(problem, style="bold red"))
            return  # stay in the field: the value is not taken
        self._end_edit()
        self._fill()
        self._show_diff()

    def _end_edit(self) -> None:
        self.editing = None
        value = self.query_one("#value", Input)
        value.value = ""
        value.border_title = ""
        value.remove_class("-invalid")
        value.disabled = True
        self.query_one("#error", Static).update("")
        self.query_one("#settings", DataTable).focus()

    def _show_diff(self) -> None:
        diff = self.model.diff()
        text = Text()
        text.append(f"against {self.model.plan.config or 'the defaults'}: ", style="bold")
        if not diff:
            text.append("no changes")
        for key, base, new in diff:
            text.append(f"\n{key}: ", style="bold")
            text.append(base, style="red")
            text.append(" -> " if self.ascii else " → ")
            text.append(new, style="green")
        self.query_one("#diff", Static).update(text)

    # -- actions --------------------------------------------------------------------------------------
    def action_back(self) -> None:
        if self.editing is not None:
            self._end_edit()
            return
        self.dismiss(("keep", self.model.plan))

    def action_discard(self) -> None:
        self.dismiss(None)

    def action_launch(self) -> None:
        if self.editing is not None:
            self.notify("finish the edit first (Enter applies, Esc cancels)", severity="warning")
            return
        self.dismiss(("launch", self.model.plan))

    def action_drop(self) -> None:
        key = self._highlighted_key()
        if key is None or self.editing is not None:
            return
        self.model.reset(key)
        self._fill()
        self._show_diff()
        self._show_doc(self._row(key))

    def action_save(self) -> None:
        base = Path(self.model.plan.config or "tideborn-run.toml")
        suggestion = base.with_name(f"{base.stem}-edited.toml")
        self.app.push_screen(SaveScreen(self.model, str(suggestion)))


class SaveScreen(ModalScreen[Path | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, model: OverrideModel, suggestion: str) -> None:
        super().__init__()
        self.model = model
        self.suggestion = suggestion

    def compose(self) -> ComposeResult:
        with Vertical(id="save-box"):
            yield Static("Save the settings as TOML (the base file's comments and layout are kept):")
            yield Input(self.suggestion, id="save-path")
            yield Static(id="save-error")

    def on_mount(self) -> None:
        self.query_one("#save-path", Input).focus()

    @on(Input.Submitted, "#save-path")
    def _save(self, event: Input.Submitted) -> None:
        try:
            path = self.model.save(Path(event.value.strip()))
        except UserError as exc:
            self.query_one("#save-error", Static).update(Text(str(exc), style="bold red"))
            return
        self.notify(f"saved {path}", title="overrides")
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)
