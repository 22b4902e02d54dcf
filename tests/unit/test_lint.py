"""The code passes ruff with the project's settings (pyproject.toml [tool.ruff]), and radon grades no function of
the package or its benchmarks F (a cyclomatic complexity above 40), as xenon, radon's threshold checker, reads it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "tideborn", "tests", "benchmarks"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_function_is_graded_f():
    # --max-absolute E: every block graded E or better; module and average grades are not held
    result = subprocess.run([sys.executable, "-m", "xenon", "--max-absolute", "E", "--max-modules", "F",
                             "--max-average", "F", "tideborn", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
