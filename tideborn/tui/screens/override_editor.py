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
from tideborn.tui.overrides import OverrideModel, SettingRow
from tideborn.tui.plan import LaunchPlan
from tideborn.tui.screens.confirm import ConfirmScreen

SOURCE_STYLES = {"override": "bold yellow", "config": "cyan", "tideborn.toml": "green", "preset": "magenta",
                 "default": "dim"}


class OverrideEditorScreen(Screen[tuple[str, LaunchPlan] | None]):
    """Dismissed with ("launch", plan), ("keep", plan) or None (edits dropped)."""

    HELP = ("Enter edits the highlighted setting; Enter again applies it (a value equal to the base config's "
            "drops the override), Esc cancels the edit. d drops an override. / finds a setting by its key "
            "(/ and Enter again: the next match). Values are TOML, as for --set: strings may be bare words. "
            "Saved files keep the base file's comments and layout. q asks before quitting with edits "
            "that are neither saved nor launched.")
    BINDINGS = [
        Binding("ctrl+r", "launch", "Launch"),
        Binding("ctrl+o", "save", "Save TOML"),
        Binding("d", "drop", "Drop override"),
        Binding("slash", "search", "Find"),
        Binding("escape", "back", "Back"),
        Binding("ctrl+x", "discard", "Discard edits", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, plan: LaunchPlan, ascii: bool = False) -> None:
        super().__init__()
        self.model = OverrideModel(plan)  # raises UserError for a base config that does not load
        self.ascii = ascii
        self.editing: str | None = None
        self._rows: dict[str, SettingRow] = {}
        """The rows by key, as last drawn: a cursor move looks its row up here (rows() resolves every
        setting: too slow for each key press, and keys queued meanwhile would act on the wrong row)."""
        self._saved_diff: list | None = None
        """The edits as last saved to a file: quitting with these asks nothing."""
        self._search = ""

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
        table.border_title = Text(f"settings ({base})")  # the base file's path comes from launch.json
        table.add_column("setting", key="setting")
        table.add_column("from", key="from")
        table.add_column("value", key="value")
        self._fill()
        self.query_one("#value", Input).disabled = True
        table.focus()
        self._show_diff()

    def _fill(self) -> None:
        """Draw the table once; after an edit only the cells that changed are updated (`_refresh`)."""
        table = self.query_one("#settings", DataTable)
        section = None
        for row in self.model.rows():
            if row.section != section:
                section = row.section
                table.add_row(Text(f"[{section}]", style="bold"), "", "", key=f"[{section}]")
            table.add_row(f"  {row.name}", *self._cells(row), key=row.key)
            self._rows[row.key] = row

    @staticmethod
    def _cells(row: SettingRow) -> tuple[Text, Text]:
        return (Text(row.source, style=SOURCE_STYLES.get(row.source, "")),
                Text(row.text, style="bold yellow" if row.changed else ""))

    def _refresh(self) -> None:
        """After an edit: the changed cells in place, so the cursor and the scroll stay where they were."""
        table = self.query_one("#settings", DataTable)
        for row in self.model.rows():
            if row != self._rows.get(row.key):
                source, value = self._cells(row)
                table.update_cell(row.key, "from", source)
                table.update_cell(row.key, "value", value)
                self._rows[row.key] = row

    def _row(self, key: str | None) -> SettingRow | None:
        return self._rows.get(key) if key is not None else None

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
        self._refresh()
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
        self._refresh()
        self._show_diff()
        self._show_doc(self._row(key))

    def action_save(self) -> None:
        base = Path(self.model.plan.config or "tideborn-run.toml")
        suggestion = base.with_name(f"{base.stem}-edited.toml")

        def saved(path: Path | None) -> None:
            if path is not None:
                self._saved_diff = self.model.diff()

        self.app.push_screen(SaveScreen(self.model, str(suggestion)), saved)

    def action_quit(self) -> None:
        """q quits the app, as everywhere, but asks first when edits would be lost (neither saved nor
        launched)."""
        diff = self.model.diff()
        if not diff or diff == self._saved_diff:
            self.app.exit()
            return
        keys = ", ".join(key for key, _base, _new in diff)
        question = (f"Quit tideborn-tui and lose {len(diff)} edit(s) not saved to a file?\n\n{keys}\n\n"
                    "n stays in the editor (Ctrl+O saves them).")
        self.app.push_screen(ConfirmScreen(question), lambda yes: self.app.exit() if yes else None)

    def action_search(self) -> None:
        if self.editing is not None:
            return
        self.app.push_screen(SearchScreen(self._search), self._find)

    def _find(self, text: str | None) -> None:
        """The next setting after the cursor whose key holds `text` (case-insensitive), wrapping round."""
        if not text:
            return
        self._search = text
        table = self.query_one("#settings", DataTable)
        keys = [key.value for key in table.rows]
        start = table.cursor_row
        order = keys[start + 1:] + keys[:start + 1]
        found = next((k for k in order if k and not k.startswith("[") and text.lower() in k.lower()), None)
        if found is None:
            self.notify(f"no setting matches {text!r}", severity="warning", timeout=3)
            return
        table.move_cursor(row=table.get_row_index(found))
        table.focus()


class SearchScreen(ModalScreen[str | None]):
    """/ in the editor: a part of a setting's key to find; Enter finds it, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, last: str) -> None:
        super().__init__()
        self.last = last

    def compose(self) -> ComposeResult:
        with Vertical(id="save-box"):
            yield Static("Find a setting by its key (a part of it: lr, runtime.max):")
            yield Input(self.last, id="search")

    def on_mount(self) -> None:
        self.query_one("#search", Input).focus()

    @on(Input.Submitted, "#search")
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


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
