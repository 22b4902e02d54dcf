"""The monitoring side never pays for torch; the headless side never imports textual.

Each module is imported in a fresh interpreter and `sys.modules` is inspected afterwards.
"""

import json
import subprocess
import sys

import pytest

TORCH_FREE = ["tideborn.config", "tideborn.errors", "tideborn.cli", "tideborn.cliparser", "tideborn.humanize",
              "tideborn.rundir", "tideborn.rundir.events", "tideborn.rundir.anomaly", "tideborn.rundir.files",
              "tideborn.rundir.lock", "tideborn.rundir.report", "tideborn.rundir.state",
              "tideborn.trainer.cli", "tideborn.trainer.options", "tideborn.trainer.preflight",
              "tideborn.trainer.signals", "tideborn.trainer.rank",
              "tideborn.tools.control", "tideborn.tools.train_run",
              "tideborn.tui.driver", "tideborn.tui.app", "tideborn.tui.screens.dashboard",
              "tideborn.tui.screens.override_editor", "tideborn.tui.screens.run_picker", "tideborn.tui.follow",
              "tideborn.tui.history", "tideborn.tui.plotting", "tideborn.tui.overrides"]
HEADLESS = ["tideborn.trainer.loop", "tideborn.trainer.cli", "tideborn.config", "tideborn.rundir.events",
            "tideborn.bench.monitor"]


def imported_after(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("module", TORCH_FREE)
def test_monitoring_modules_do_not_import_torch(module):
    assert "torch" not in imported_after(module)


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_modules_do_not_import_textual(module):
    assert "textual" not in imported_after(module)
