"""Plain `pytest`, from the repository or from tests/, collects the same tests as `python -m pytest` (what
scripts/test.sh runs): a newcomer's first command does not stop on import errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def collected(command: list[str], cwd: Path) -> str:
    result = subprocess.run([*command, "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=cwd,
                            capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"{command} in {cwd}: exit {result.returncode}\n{result.stdout[-3000:]}"
    assert re.search(r"\d+(/\d+)? tests? collected", last), last
    return last.split(" in ")[0]  # "970/972 tests collected (2 deselected)", without the time


def test_plain_pytest_collects_what_the_test_script_collects() -> None:
    plain = str(Path(sys.executable).with_name("pytest"))
    module = collected([sys.executable, "-m", "pytest"], REPO_ROOT)
    assert collected([plain], REPO_ROOT) == module
    assert collected([plain], REPO_ROOT / "tests") == module
