"""The import layers hold: import-linter checks the contracts in pyproject.toml ([tool.importlinter]: imports
point down the layers, no circles, no torch on the monitoring side, no textual on the headless side, the package
never imports the benchmarks beside it, command-line modules are leaves). test_import_hygiene.py checks the same at
run time, in `sys.modules`.

Every import counts, also one inside a function: a module that imports torch only when a command runs still
drags it into whatever imports that module."""

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
SETTINGS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = SETTINGS["contracts"]


def lint_imports(config: Path) -> subprocess.CompletedProcess:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: run ./scripts/setup.sh (it installs the dev group)"
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(config)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_import_contracts_hold() -> None:
    result = lint_imports(ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_cover_layers_circles_torch_textual_benchmarks_and_command_lines() -> None:
    by_id = {contract["id"]: contract for contract in CONTRACTS}
    assert set(by_id) >= {"layers", "data-floors", "no-circles", "monitoring-without-torch",
                          "headless-without-textual", "package-without-benchmarks", "cli-modules-are-leaves"}
    assert SETTINGS["root_packages"] == ["tideborn", "benchmarks"]
    layers = by_id["layers"]
    assert layers["containers"] == ["tideborn"] and layers["exhaustive"] is True
    assert layers["layers"][:2] == ["__main__", "cli"]
    assert not any("bench" in layer for layer in layers["layers"]), "the benchmarks are outside the package's layers"
    floors = by_id["data-floors"]
    assert floors["containers"] == ["tideborn.data"] and floors["exhaustive"] is True
    on_disk = {path.parent.name for path in (ROOT / "tideborn" / "data").glob("*/__init__.py")}
    assert {part.strip() for layer in floors["layers"] for part in layer.split("|")} == on_disk | {"__main__"}
    assert not list((ROOT / "tideborn" / "data").glob("[!_]*.py")), "every data module lives on a floor"
    assert by_id["no-circles"]["ancestors"] == ["tideborn", "benchmarks"]
    torch_free = by_id["monitoring-without-torch"]
    assert {"tideborn.tui", "tideborn.tools", "tideborn.rundir", "tideborn.config"} <= set(torch_free["source_modules"])
    assert torch_free["forbidden_modules"] == ["torch"] and not torch_free.get("allow_indirect_imports")
    assert "textual" in by_id["headless-without-textual"]["forbidden_modules"]
    without_benchmarks = by_id["package-without-benchmarks"]
    assert without_benchmarks["source_modules"] == ["tideborn"]
    assert without_benchmarks["forbidden_modules"] == ["benchmarks"]


BROKEN = {
    "a layer below importing one above": """
        [[tool.importlinter.contracts]]
        name = "rundir above config"
        type = "layers"
        layers = ["tideborn.config", "tideborn.rundir"]
    """,
    # the loader (training floor) reads the sources (sets floor): with the floors swapped that import runs up
    "a data floor importing one above": """
        [[tool.importlinter.contracts]]
        name = "sets above training"
        type = "layers"
        containers = ["tideborn.data"]
        layers = ["sets", "training"]
    """,
    "torch in the trainer": """
        [[tool.importlinter.contracts]]
        name = "the trainer without torch"
        type = "forbidden"
        source_modules = ["tideborn.trainer"]
        forbidden_modules = ["torch"]
    """,
    "a protected module imported by others": """
        [[tool.importlinter.contracts]]
        name = "nobody imports run_match's module"
        type = "protected"
        protected_modules = ["tideborn.match.run"]
        allowed_importers = ["tideborn.match.cli"]
    """,
    # the reverse of `package-without-benchmarks`: the checker sees imports from one root package into the other
    "the package imported by the benchmarks": """
        [[tool.importlinter.contracts]]
        name = "the benchmarks without the package"
        type = "forbidden"
        source_modules = ["benchmarks"]
        forbidden_modules = ["tideborn"]
    """,
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_contract_fails(case: str, tmp_path: Path) -> None:
    """The checker can fail: contracts that the code does break are reported, with a non-zero exit status."""
    config = tmp_path / "contracts.toml"
    config.write_text('[tool.importlinter]\nroot_packages = ["tideborn", "benchmarks"]\n'
                      'include_external_packages = true\n' + textwrap.dedent(BROKEN[case]))
    result = lint_imports(config)
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout + result.stderr


def test_a_circle_fails(tmp_path: Path) -> None:
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text("from circled import a\n")
    config = tmp_path / "contracts.toml"
    config.write_text('[tool.importlinter]\nroot_package = "circled"\n\n[[tool.importlinter.contracts]]\n'
                      'name = "no circles"\ntype = "acyclic_siblings"\nancestors = ["circled"]\n')
    result = subprocess.run([str(LINT_IMPORTS), "--no-cache", str(config)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout + result.stderr


def test_the_docs_name_every_layer_and_the_readme_every_package() -> None:
    """docs/layout.md describes each layer of the contract; the README's layout line says where each package is,
    and both place the benchmarks outside the package."""
    layers = next(contract for contract in CONTRACTS if contract["id"] == "layers")["layers"]
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    for layer in layers:
        for name in (part.strip() for part in layer.split("|")):
            named = (f"`tideborn/{name}/`", f"`tideborn/{name}.py`", f"`{name}.py`")
            assert any(form in layout for form in named), f"docs/layout.md does not place {name}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = readme[readme.index("Layout ("):].split("\n\n", 1)[0]
    packages = sorted(path.parent.name for path in (ROOT / "tideborn").glob("*/__init__.py"))
    assert packages and all(f"`{package}`" in line for package in packages), (packages, line)
    assert "`benchmarks/`" in line and "`benchmarks/`" in layout[layout.index("## Outside the package"):]
