"""Shared fixtures: a clean working directory, trainers started in the background, a template run, a small
filesystem, UTC; and the `slow` marker, which follows the folder (tests/README.md: unit/ and e2e/).

The functions the tests share are in tests/helpers/, never here: a test file imports them from there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import order
from tests.helpers.common import TEMPLATE_SETS, Trainer, train

E2E = Path(__file__).resolve().parent / "e2e"

# A suite started in the background by a shell without job control (`nohup ... &` in a script, some CI runners)
# inherits SIGINT ignored, and so would every process it starts: the Ctrl-C tests would then see their commands
# shrug the signal off and exit 0. The tests start their processes as a terminal does, with SIGINT's default
# (a handler here is reset to the default in an exec'd child; an ignored signal stays ignored). Here, at import,
# so that it holds in each pytest-xdist worker as well.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # One compute thread in the test process, as in the trainer processes the tests start (`child_env`): pytest-xdist
    # runs one test process per core, and torch's default of a thread per core in each would oversubscribe the
    # cores, where idle OpenMP threads spin; the in-process tests took twice the CPU time that way. Set before each
    # test once torch is in the process (a collected test file imported it, or an earlier test), never by importing
    # it here: a session of monitor tests pays for no torch (tests/unit/test_import_hygiene.py).
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture
def start_trainer(tmp_path: Path):
    """Start trainers in the background; any still running when the test ends are killed."""
    started: list[Trainer] = []

    def start(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Trainer:
        trainer = Trainer(args, cwd or tmp_path, tmp_path / "logs", env)
        started.append(trainer)
        return trainer

    yield start
    for trainer in started:
        trainer.kill()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory with no project file in sight (neither ./tideborn.toml nor the env)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("TIDEBORN_PROJECT_FILE", raising=False)
    return work


@pytest.fixture(scope="session")
def template_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step smoke run (checkpoints at steps 2 and 4); copy it with `copy_run`, never modify it."""
    base = tmp_path_factory.mktemp("template")
    run_dir = base / "run"
    train(run_dir, *TEMPLATE_SETS, cwd=base)
    return run_dir


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--write-file-seconds", action="store_true",
                     help="record each test file's seconds in tests/file_seconds.json (run the whole suite)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # End-to-end tests are marked `slow` by where they live, so `pytest -m "not slow"` (the unit tests) needs
    # no list of file names to keep up to date.
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.slow)
    # The longest files first (tests/helpers/order.py); within a file, the tests keep their order.
    try:
        seconds = order.recorded_seconds()
    except order.DamagedRecord as exc:
        raise pytest.UsageError(str(exc)) from None
    rank = {name: i for i, name in enumerate(order.longest_first((item.nodeid.split("::")[0] for item in items),
                                                                   seconds))}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist this runs in the controlling process too, with every worker's reports.
    name = report.nodeid.split("::")[0]
    _file_seconds[name] = _file_seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Only from a run whose every test passed: an interrupted or failing run's files took what they took so far.
    if (session.config.getoption("--write-file-seconds") and not hasattr(session.config, "workerinput")
            and exitstatus == pytest.ExitCode.OK):
        try:
            order.record(_file_seconds)
        except (OSError, order.DamagedRecord) as exc:  # a full disk, a damaged record: it stays as it was
            print(f"--write-file-seconds: {order.SECONDS_FILE} not written: {exc}", file=sys.stderr)


@pytest.fixture
def small_filesystem(tmp_path: Path):
    """Mount a tmpfs and yield (mount point, resize function); skip where mounting is not permitted."""
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the injected-ENOSPC tests cover this case")
    tried = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                           capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({tried.stderr.strip()}); the injected-ENOSPC tests cover this")

    def resize(size_bytes: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size_bytes}", str(mount_point)], check=True)

    try:
        yield mount_point, resize
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def utc(monkeypatch):
    """Local time is UTC for the test (the monitor's clock times in pictures and texts)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
