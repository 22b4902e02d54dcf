"""The override editor's model: every setting with its value, docstring and origin; edits checked by
the same parser as `--set` and the same validation as `train`; the difference from the base config;
saving the result as TOML that keeps the base file's comments and layout (tomlkit). No textual.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from tideborn.config.load import DEFAULTS_SOURCE, Resolved, load_settings, override_layer
from tideborn.config.reference import field_docstrings
from tideborn.config.schema import SECTIONS
from tideborn.errors import UserError
from tideborn.safefile import write_atomically
from tideborn.tui.plan import LaunchPlan


@dataclass(frozen=True)
class SettingRow:
    key: str
    section: str
    name: str
    text: str
    """The value as TOML."""
    base_text: str
    """Its value in the base config (the file and defaults, without overrides)."""
    doc: str
    source: str
    """default, preset, tideborn.toml, config or override."""
    source_detail: str
    type_name: str

    @property
    def changed(self) -> bool:
        return self.text != self.base_text


def toml_text(value: object) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return tomlkit.item(value).as_string()


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


class OverrideModel:
    """Holds the launch plan being edited; `plan` is what launching or saving uses."""

    def __init__(self, plan: LaunchPlan, environ: typing.Mapping[str, str] | None = None):
        self.environ = os.environ if environ is None else environ
        self.plan = plan
        self.base = self._load(())
        self.current = self._load(plan.overrides)

    def _load(self, overrides: typing.Sequence[str]) -> Resolved:
        return load_settings(self.plan.config, overrides, self.plan.flags, environ=self.environ, cwd=self.plan.cwd)

    def _source(self, key: str) -> tuple[str, str]:
        label = self.current.sources.get(key, DEFAULTS_SOURCE)
        project = str(self.current.project_file) if self.current.project_file else None
        if label == DEFAULTS_SOURCE:
            return "default", label
        if label.startswith("network preset"):
            return "preset", label
        if label.startswith("--"):
            return "override", label
        if project is not None and label == project:
            return "tideborn.toml", label
        return "config", label

    def rows(self) -> list[SettingRow]:
        rows = []
        for section, cls in SECTIONS.items():
            docs = field_docstrings(cls)
            hints = typing.get_type_hints(cls)
            current, base = getattr(self.current.settings, section), getattr(self.base.settings, section)
            for f in dataclasses.fields(cls):
                key = f"{section}.{f.name}"
                source, detail = self._source(key)
                rows.append(SettingRow(key, section, f.name, toml_text(getattr(current, f.name)),
                                       toml_text(getattr(base, f.name)), docs.get(f.name, ""), source, detail,
                                       _type_name(hints[f.name])))
        return rows

    def check(self, key: str, text: str) -> str | None:
        """Why `key = text` cannot be used (one line), or None if it can: parsed as `--set` parses it,
        then the whole settings resolved and validated as `train` would."""
        item = f"{key}={text}"
        try:
            override_layer(item)
            self._load(self.plan.with_override(item).overrides)
        except UserError as exc:
            return str(exc)
        return None

    def apply(self, key: str, text: str) -> str | None:
        """Use `key = text` (the override is dropped when it equals the base value); the error, if any."""
        problem = self.check(key, text)
        if problem is not None:
            return problem
        item = f"{key}={text}"
        plan = self.plan.with_override(item)
        section, name = key.split(".", 1)
        resolved = load_settings(self.plan.config, plan.overrides, self.plan.flags, environ=self.environ,
                                 cwd=self.plan.cwd)
        if toml_text(getattr(getattr(resolved.settings, section), name)) == toml_text(
                getattr(getattr(self.base.settings, section), name)):
            plan = self.plan.without_override(key)
        self._set_plan(plan)
        return None

    def reset(self, key: str) -> None:
        self._set_plan(self.plan.without_override(key))

    def _set_plan(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.current = self._load(plan.overrides)

    def diff(self) -> list[tuple[str, str, str]]:
        """(key, base value, new value) for every setting the overrides change."""
        return [(row.key, row.base_text, row.text) for row in self.rows() if row.changed]

    def toml(self) -> str:
        """The base file with the changed settings written in (comments and layout kept)."""
        if self.plan.config is not None:
            path = Path(self.plan.config)
            path = path if path.is_absolute() else self.plan.cwd / path
            document = tomlkit.parse(path.read_text(encoding="utf-8"))
        else:
            document = tomlkit.document()
        changed = {key for key, _base, _new in self.diff()}
        changed |= {f"run.{name}" for name, value in self.plan.flags.items() if value is not None}
        for key in sorted(changed, key=lambda k: list(SECTIONS).index(k.split(".")[0])):
            section, name = key.split(".", 1)
            value = getattr(getattr(self.current.settings, section), name)
            if section not in document:
                document.add(section, tomlkit.table())
            document[section][name] = _plain(value)
        return tomlkit.dumps(document)

    def save(self, path: Path) -> Path:
        """Write `toml()` to `path` (relative to the plan's directory), whole or not at all, checked first: the
        file must load. A symbolic link at `path` is refused: the user named a file to write, and replacing a link
        (or writing through it) would change something they did not name."""
        path = path if path.is_absolute() else self.plan.cwd / path
        data = self.toml().encode("utf-8")
        if path.is_dir() and not path.is_symlink():
            raise UserError(f"{path}: is a directory")
        try:
            write_atomically(path, lambda handle: handle.write(data), refuse_link=True,
                             check=lambda temp: load_settings(temp, (), {}, environ=self.environ, cwd=self.plan.cwd))
        except OSError as exc:
            raise UserError(f"{path}: cannot write: {exc.strerror or exc}") from None
        return path


def _type_name(hint: object) -> str:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "list"
    return getattr(hint, "__name__", str(hint))
