"""Plain `pytest`, from the repository or from tests/, collects the same tests as `python -m pytest` (what
scripts/test.sh runs): a newcomer's first command does not stop on import errors."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import order

REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def collection(command: tuple[str, ...], cwd: Path, *args: str) -> tuple[str, str]:
    """`COMMAND --collect-only -q ARGS` in `cwd`: its summary line without the time ("970/972 tests collected
    (2 deselected)") and the listing. Cached: the tests of this file share each collection of the suite."""
    result = subprocess.run([*command, "--collect-only", "-q", "-p", "no:cacheprovider", *args], cwd=cwd,
                            capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"{command} in {cwd}: exit {result.returncode}\n{result.stdout[-3000:]}"
    assert re.search(r"\d+(/\d+)? tests? collected", last), last
    return last.split(" in ")[0], result.stdout


def collected(command: list[str], cwd: Path, *args: str) -> str:
    return collection(tuple(command), cwd, *args)[0]


def test_plain_pytest_collects_what_the_test_script_collects() -> None:
    plain = str(Path(sys.executable).with_name("pytest"))
    module = collected([sys.executable, "-m", "pytest"], REPO_ROOT)
    assert collected([plain], REPO_ROOT) == module
    assert collected([plain], REPO_ROOT / "tests") == module


TESTS = REPO_ROOT / "tests"


def test_every_test_file_is_a_unit_or_an_end_to_end_test_with_a_name_of_its_own() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert files
    misplaced = [str(f.relative_to(TESTS)) for f in files if f.parent not in (TESTS / "unit", TESTS / "e2e")]
    assert not misplaced, f"test files outside tests/unit and tests/e2e (tests/README.md says which): {misplaced}"
    names = [f.name for f in files]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_no_test_file_imports_another_test_file_or_the_conftest() -> None:
    """What two files share lives in tests/helpers, so each test file can move or go without breaking another."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for module in modules:
                last = module.rsplit(".", 1)[-1]
                if last == "conftest" or last.startswith("test_") or module.startswith(("unit", "e2e")):
                    found.append(f"{path.relative_to(TESTS)}:{node.lineno}: {module}")
    assert not found, found


def test_the_slow_marker_follows_the_folder() -> None:
    """`-m "not slow"` collects exactly the unit tests, so every end-to-end test is marked slow."""
    listing = collection((sys.executable, "-m", "pytest"), REPO_ROOT, "-m", "not slow")[1]
    fast = [line for line in listing.splitlines() if "::" in line]
    assert fast and all(item.startswith("tests/unit/") for item in fast), [
        item for item in fast if not item.startswith("tests/unit/")]
    unit_files = {str(path.relative_to(REPO_ROOT)) for path in (TESTS / "unit").glob("test_*.py")}
    assert {item.split("::")[0] for item in fast} == unit_files


def test_the_files_are_handed_out_longest_first_by_the_recorded_seconds(tmp_path: Path) -> None:
    """scripts/test.sh's workers take the files in collection order (xdist's reordering off): the files with the
    most recorded seconds first, a file with none recorded before them all (tests/helpers/order.py)."""
    seconds = order.recorded_seconds()
    assert seconds, "tests/file_seconds.json is missing: ./scripts/test.sh --write-file-seconds writes it"
    listing = collection((sys.executable, "-m", "pytest"), REPO_ROOT)[1]
    files = list(dict.fromkeys(line.split("::")[0] for line in listing.splitlines() if "::" in line))
    assert files == order.longest_first(files, seconds)
    assert "--no-loadscope-reorder" in (REPO_ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    # the rule itself, and the record's round trip
    assert order.longest_first(["a", "b", "new", "c", "b"], {"a": 1.0, "b": 5.0, "c": 5.0}) == ["new", "b", "c", "a"]
    record = tmp_path / "seconds.json"
    order.record({"x": 2.04, "y": 10.0}, record)
    assert order.recorded_seconds(record) == {"x": 2.0, "y": 10.0}
    order.record({"y": 3.0, "z": 1.0}, record)  # a run of some files updates theirs, keeps the others'
    assert order.recorded_seconds(record) == {"x": 2.0, "y": 3.0, "z": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seconds.json"]  # no temp file left
    assert order.recorded_seconds(tmp_path / "none.json") == {}
    record.write_text('{"seconds": [1, 2]}')
    with pytest.raises(order.DamagedRecord, match=r"seconds.json: not a record of seconds per test file .*"
                                                  r"--write-file-seconds"):
        order.recorded_seconds(record)
