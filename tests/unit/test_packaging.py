"""What the distribution declares matches the code: one top-level package, every package the code imports is
a declared dependency, the console scripts point at modules that exist, and the data files ship."""

import ast
import importlib
import importlib.metadata as md
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE = ROOT / "tideborn"
SHIPPED = sorted({pattern.split(".")[0].rstrip("*")
                  for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]})


def requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0]
    for stop in "<>=!~[ ":
        name = name.split(stop)[0]
    return name.strip().lower().replace("_", "-")


def imported_top_levels() -> dict[str, str]:
    """Every top-level module the shipped packages import (absolute imports only), with one file that does."""
    found: dict[str, str] = {}
    for path in sorted(p for package in SHIPPED for p in (ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_the_only_top_level_package_is_tideborn() -> None:
    includes = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert includes and all(pattern == "tideborn" or pattern.startswith("tideborn.") or pattern == "tideborn*"
                            for pattern in includes), includes
    assert not (ROOT / "tui").exists(), "the monitor is tideborn.tui, not a top-level tui package"
    assert sorted(PYPROJECT["tool"]["setuptools"]["package-data"]) == ["tideborn"]


def test_every_imported_distribution_is_declared() -> None:
    declared = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra in PYPROJECT["project"].get("optional-dependencies", {}).values():
        declared |= {requirement_name(r) for r in extra}
    providers = md.packages_distributions()
    missing = {}
    for module, where in imported_top_levels().items():
        if module in sys.stdlib_module_names or module == "__future__" or (ROOT / module).is_dir():
            continue  # the standard library, or this repository's own packages
        dists = providers.get(module)
        assert dists, f"{where} imports {module!r}, which no installed distribution provides"
        if not any(requirement_name(d) in declared for d in dists):
            missing[module] = (dists, where)
    assert not missing, f"imported but not declared in pyproject.toml [project] dependencies: {missing}"


@pytest.mark.parametrize("script", ["tideborn", "tideborn-tui"])
def test_console_scripts_point_into_the_package(script: str) -> None:
    target = PYPROJECT["project"]["scripts"][script]
    module, _, function = target.partition(":")
    assert module.startswith("tideborn."), target
    assert callable(getattr(importlib.import_module(module), function))
    installed = {ep.name: ep.value for ep in md.entry_points(group="console_scripts")}
    assert installed.get(script) == target, "the venv is stale: run ./scripts/setup.sh"


def test_package_data_covers_every_data_file() -> None:
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["tideborn"]
    data_files = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
                  if p.is_file() and p.suffix in {".tcss", ".sfen"}]
    assert any(f.endswith(".tcss") for f in data_files)
    for name in data_files:
        assert any(fnmatch(name, pattern) for pattern in patterns), f"tideborn/{name} is not shipped"
