"""Resolve settings from their layers. Precedence lives here and only here:

    defaults < network preset < tideborn.toml < --config FILE < --set key=value (and --type/--network/--mode)

`tideborn.toml` is the project file: `$TIDEBORN_PROJECT_FILE` names it, else `./tideborn.toml` is used
when present. Paths under its `[paths]` section resolve against the file's own directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import sys
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

from tideborn.config.presets import NETWORKS
from tideborn.config.schema import SECTIONS, SettingError, Settings
from tideborn.errors import UserError
from tideborn.humanize import clipped, shortened

PROJECT_FILE_ENV = "TIDEBORN_PROJECT_FILE"
PROJECT_FILE_NAME = "tideborn.toml"
DEFAULTS_SOURCE = "the defaults"
TOO_MANY_DIGITS = f"an integer has more than {sys.get_int_max_str_digits():,} digits; no setting takes one that large"


@dataclass(frozen=True)
class Layer:
    """One source of settings: `values[section][key]`, and a label for each key's origin."""

    values: dict[str, dict[str, object]]
    sources: dict[str, str]


@dataclass(frozen=True)
class Resolved:
    settings: Settings
    sources: dict[str, str]
    """Dotted key -> where its value came from (file path, `--set ...`, preset, or the defaults)."""
    project_file: Path | None


def load_settings(
    config: str | os.PathLike | None = None,
    overrides: typing.Sequence[str] = (),
    flags: dict[str, str | None] | None = None,
    environ: typing.Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Resolved:
    """Resolve the settings a command would use. Raises `UserError` for any bad input."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    layers: list[Layer] = []
    project_file = find_project_file(environ, cwd)
    if project_file is not None:
        layers.append(_project_layer(project_file))
    if config is not None:
        layers.append(file_layer(Path(config)))
    layers.extend(override_layer(item) for item in overrides)
    for name, value in (flags or {}).items():
        if value is not None:
            layers.append(Layer({"run": {name: value}}, {f"run.{name}": f"--{name} {shortened(value)}"}))

    network = ""
    for layer in layers:
        network = typing.cast(str, layer.values.get("run", {}).get("network", network))
    if network:
        if not isinstance(network, str):
            source = next(lay.sources["run.network"] for lay in reversed(layers) if "run.network" in lay.sources)
            raise UserError(f"{source}: run.network expects a string, got {_describe(network)}")
        if network not in NETWORKS:
            hint = _suggest(network, NETWORKS)
            raise UserError(f"run.network: unknown network preset {clipped(network)}{hint}; "
                            f"known: {', '.join(NETWORKS)}")
        preset = NETWORKS[network]
        layers.insert(0, Layer(preset, {f"{s}.{k}": f"network preset {network}"
                                        for s, keys in preset.items() for k in keys}))
    return _build(layers, project_file)


def settings_from_dict(data: object, source: str) -> Settings:
    """Settings from plain data as `Settings.to_dict` writes it (a checkpoint's), checked as a config file is:
    an unknown section or key, a wrong type or an out-of-range value is a `UserError` naming `source` and the key.
    Keys it leaves out take their defaults (settings added since it was written)."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a table of sections, got {_describe(data)}")
    layer = _checked_layer(data, source)
    return _build([layer], None).settings


def find_project_file(environ: typing.Mapping[str, str], cwd: Path) -> Path | None:
    named = environ.get(PROJECT_FILE_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise UserError(f"{PROJECT_FILE_ENV}={named}: no such file")
        return path
    candidate = cwd / PROJECT_FILE_NAME
    try:
        return candidate if candidate.is_file() else None
    except OSError as exc:  # a working directory we may not look into: whether a project file is there is unknown
        raise UserError(f"{candidate}: cannot tell whether a project file is there: {exc.strerror}") from None


def file_layer(path: Path) -> Layer:
    """Read a TOML (or JSON, as `config` prints) settings file into a checked layer."""
    if not path.exists():
        raise UserError(f"config file not found: {path}")
    if not path.is_file():
        raise UserError(f"config file is not a regular file: {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors write one) is not settings
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        except RecursionError:
            raise UserError(f"{path}: malformed JSON: nested too deeply") from None
        except ValueError:  # Python's limit on the digits of an integer (JSONDecodeError is caught above)
            raise UserError(f"{path}: {TOO_MANY_DIGITS}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: malformed TOML: {exc}") from None
        except RecursionError:
            raise UserError(f"{path}: malformed TOML: nested too deeply") from None
        except ValueError:  # Python's limit on the digits of an integer (TOMLDecodeError is caught above)
            raise UserError(f"{path}: {TOO_MANY_DIGITS}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a table of sections at the top level")
    return _checked_layer(data, str(path))


def _project_layer(path: Path) -> Layer:
    layer = file_layer(path)
    paths = layer.values.get("paths")
    if paths:
        base = path.resolve().parent
        for key, value in paths.items():
            if isinstance(value, str) and value and not Path(value).is_absolute():
                paths[key] = str(base / value)
    return layer


def override_layer(item: str) -> Layer:
    """One `--set section.key=value`; the value is TOML, or a bare word for a string setting."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    # Messages name the item; a huge one (a 50 MB value) is cut, with its length, not echoed whole.
    label = f"--set {shortened(item)}"
    if not sep or not key:
        raise UserError(f"{label}: expected section.key=value")
    section, dot, name = key.partition(".")
    if not dot or not name or "." in name:
        raise UserError(f"{label}: expected a dotted key section.key (e.g. optim.lr)")
    _check_key(section, name, label)
    raw = raw.strip()
    try:
        parsed = tomllib.loads(f"v = {raw}")
        if parsed.keys() != {"v"}:  # `1\nother = 2` is more than one value: never silently half-used
            raise tomllib.TOMLDecodeError("more than one value")
        value = parsed["v"]
    except RecursionError:
        raise UserError(f"{label}: the value is nested too deeply") from None
    except tomllib.TOMLDecodeError:
        if _field_type(section, name) is str:
            value = raw  # a bare word for a string setting: `--set runtime.device=cuda`
        else:
            raise UserError(f"{label}: {clipped(raw)} is not a TOML value (strings need quotes: "
                            f"{shortened(key, 60)}=\"...\"; lists use [1, 2])") from None
    except ValueError:  # Python's limit on the digits of an integer; TOMLDecodeError, a ValueError, is above
        raise UserError(f"{label}: {TOO_MANY_DIGITS}") from None
    return Layer({section: {name: value}}, {key: label})


def _checked_layer(data: dict, source: str) -> Layer:
    values: dict[str, dict[str, object]] = {}
    for section, table in data.items():
        if section not in SECTIONS:
            raise UserError(f"{source}: unknown section [{shortened(section)}]{_suggest(section, SECTIONS)}")
        if not isinstance(table, dict):
            raise UserError(f"{source}: [{shortened(section)}] must be a table of settings, got {_describe(table)}")
        for name in table:
            _check_key(section, name, source)
        values[section] = dict(table)
    return Layer(values, {f"{s}.{k}": source for s, t in values.items() for k in t})


def _check_key(section: str, name: str, source: str) -> None:
    if section not in SECTIONS:
        raise UserError(f"{source}: unknown section {clipped(section)}{_suggest(section, SECTIONS)}")
    names = [f.name for f in dataclasses.fields(SECTIONS[section])]
    if name not in names:
        hint = _suggest(name, names, prefix=section + ".")
        raise UserError(f"{source}: unknown key {section}.{shortened(name)}{hint}")


def _suggest(word: object, choices: typing.Iterable[str], prefix: str = "") -> str:
    # A key from a checkpoint may be anything; for a very long word no setting is anything like it, and
    # difflib would take seconds to say so.
    if not isinstance(word, str) or len(word) > 100:
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _field_type(section: str, name: str) -> object:
    return typing.get_type_hints(SECTIONS[section])[name]


def _build(layers: list[Layer], project_file: Path | None) -> Resolved:
    merged: dict[str, dict[str, object]] = {}
    sources: dict[str, str] = {}
    for layer in layers:
        for section, table in layer.values.items():
            merged.setdefault(section, {}).update(table)
        sources.update(layer.sources)
    sections = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        given = merged.get(section, {})
        kwargs = {name: _coerce(value, hints[name], f"{section}.{name}", sources[f"{section}.{name}"])
                  for name, value in given.items()}
        sections[section] = _construct(cls, kwargs, sources)
    settings = _construct(Settings, sections, sources)
    for f in dataclasses.fields(Settings):
        for g in dataclasses.fields(SECTIONS[f.name]):
            sources.setdefault(f"{f.name}.{g.name}", DEFAULTS_SOURCE)
    return Resolved(settings, sources, project_file)


def _construct(cls, kwargs: dict, sources: dict[str, str]):
    try:
        return cls(**kwargs)
    except SettingError as exc:
        origin = sources.get(exc.key, DEFAULTS_SOURCE)
        raise UserError(f"{exc.key} {exc.message} (from {origin})") from None


_TYPE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}


def _describe(value: object) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table"}
    return f"{shortened(json.dumps(value, default=str))} ({kinds.get(type(value), type(value).__name__)})"


def _coerce(value: object, hint: object, key: str, source: str) -> object:
    def wrong(expected: str) -> UserError:
        return UserError(f"{source}: {key} expects {expected}, got {_describe(value)}")

    if hint is bool:
        if not isinstance(value, bool):
            raise wrong(_TYPE_NAMES[bool])
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong(_TYPE_NAMES[int])
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong(_TYPE_NAMES[float])
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float (10**400)
            raise wrong("a finite number") from None
        if not math.isfinite(number):
            raise wrong("a finite number")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise wrong(_TYPE_NAMES[str])
        if "\x00" in value:  # no path, name or device can hold one; the OS would refuse it much later
            raise UserError(f"{source}: {key} must not contain a NUL character, got {_describe(value)}")
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        variadic = len(args) == 2 and args[1] is Ellipsis
        item_type = args[0]
        expected = f"a list of {_TYPE_NAMES[item_type].removeprefix('a ').removeprefix('an ')}s"
        if not variadic:
            expected = f"a list of {len(args)} numbers"
        if not isinstance(value, (list, tuple)) or (not variadic and len(value) != len(args)):
            raise wrong(expected)
        try:
            return tuple(_coerce(v, item_type, key, source) for v in value)
        except UserError:
            raise wrong(expected) from None
    raise TypeError(f"unsupported settings type {hint!r} for {key}")  # a schema bug, not user input
