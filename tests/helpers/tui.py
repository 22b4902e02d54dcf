"""The monitor built for a Pilot test (on a run directory, with the fixture clock and no GPU probe), and what its
screens offer."""

from __future__ import annotations

from pathlib import Path

from textual.notifications import Notify

from tests.helpers.common import until
from tideborn.tui.app import create_app
from tideborn.tui.options import TuiOptions
from tideborn.tui.screens.compare import CompareScreen
from tideborn.tui.screens.dashboard import DashboardScreen
from tideborn.tui.testing import FIXTURE_NOW


def app_for(run_dir: Path | None = None, **changes):
    options = TuiOptions(run_dir=run_dir, clock=lambda: FIXTURE_NOW, use_nvml=False, follow=False)
    for name, value in changes.items():
        setattr(options, name, value)
    return create_app(options)


async def attached(pilot) -> DashboardScreen:
    screen = pilot.app.screen
    assert isinstance(screen, DashboardScreen), screen
    await until(pilot, screen.ready.is_set, "the dashboard to read the run")
    await pilot.pause()
    return screen


def options(**changes) -> TuiOptions:
    made = TuiOptions(clock=lambda: FIXTURE_NOW, use_nvml=False, follow=False)
    for name, value in changes.items():
        setattr(made, name, value)
    return made


def notices(messages: list) -> list[Notify]:
    return [m for m in messages if isinstance(m, Notify)]


def footer(screen) -> dict[str, str]:
    """What the footer offers: key -> action, for the bindings it shows."""
    return {key: active.binding.action for key, active in screen.active_bindings.items()
            if active.binding.show and active.enabled}


async def dashboard(pilot) -> DashboardScreen:
    screen = pilot.app.screen
    assert isinstance(screen, DashboardScreen)
    await until(pilot, screen.ready.is_set, "the dashboard to read the run")
    await until(pilot, lambda: screen.status is not None, "the run's status")
    await pilot.pause()
    return screen


async def compared(pilot, count: int):
    """The first `count` runs of the picker marked and compared, their histories read: the CompareScreen."""
    picker = pilot.app.screen
    await until(pilot, picker.ready.is_set, "the runs")
    for row in range(count):
        await pilot.press("space", *(["down"] if row < count - 1 else []))
    await pilot.press("c")
    screen = pilot.app.screen
    assert isinstance(screen, CompareScreen)
    await until(pilot, lambda: screen.ready, "the runs' histories")
    await pilot.pause()
    return screen
