"""The monitoring side never pays for torch; the headless side never imports textual; a test session of
monitor tests pays for no torch either.

Each module is imported in a fresh interpreter and `sys.modules` is inspected afterwards.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH_FREE = ["tideborn.config.load", "tideborn.errors", "tideborn.cli", "tideborn.cliparser", "tideborn.humanize",
              "tideborn.safefile", "tideborn.outputs", "tideborn.rundir.layout", "tideborn.rundir.access",
              "tideborn.rundir.events", "tideborn.rundir.anomaly", "tideborn.rundir.files",
              "tideborn.rundir.lock", "tideborn.rundir.report", "tideborn.rundir.state",
              "tideborn.trainer.cli", "tideborn.trainer.options", "tideborn.trainer.preflight",
              "tideborn.trainer.signals", "tideborn.trainer.rank",
              "tideborn.tools.control", "tideborn.tools.train_run",
              "tideborn.tui.driver", "tideborn.tui.app", "tideborn.tui.screens.dashboard",
              "tideborn.tui.screens.override_editor", "tideborn.tui.screens.run_picker", "tideborn.tui.follow",
              "tideborn.tui.history", "tideborn.tui.plotting", "tideborn.tui.overrides"]
HEADLESS = ["tideborn.trainer.loop", "tideborn.trainer.cli", "tideborn.config.load", "tideborn.rundir.events",
            "benchmarks.monitor"]


def imported_after(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("module", TORCH_FREE)
def test_monitoring_modules_do_not_import_torch(module):
    assert "torch" not in imported_after(module)


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_modules_do_not_import_textual(module):
    assert "textual" not in imported_after(module)


def test_a_session_of_monitor_tests_does_not_import_torch():
    """What every test session imports before its test files, the conftest and the helpers it imports, brings in no
    torch (the conftest sets torch's threads only where a test file brought it in): a session of monitor tests (the
    TUI's, the run directory's) starts without paying for it."""
    assert "torch" not in imported_after("tests.conftest")
