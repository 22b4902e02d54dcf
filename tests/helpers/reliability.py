"""Helpers for the reliability tests (tests/e2e/test_reliability_*.py); tests/unit/test_reliability_checker.py
tests the checker.

- `check_attempts`: the invariants every run history must keep (an attempt is the events from one
  `run_started` to the next): steps never go backwards within an attempt, at most one terminal event and
  nothing after it, and exactly one for an attempt whose process ended on its own.
- `assert_same_weights`: two checkpoints hold bit-identical model and optimizer state.
- `fault_env`: a `sitecustomize.py` that makes a real trainer process fail a write with ENOSPC.
- `write_hostile_checkpoint`: a checkpoint-shaped file whose unpickling would create a marker file.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from tests.helpers.common import SMOKE_CONFIG, assert_same_tensors, out_dir_set
from tideborn.rundir.events import EventReader
from tideborn.rundir.kinds import TERMINAL_KINDS
from tideborn.rundir.layout import EVENTS_FILE

RELIABILITY_SEED = int(os.environ.get("TIDEBORN_RELIABILITY_SEED", "20260601"))
"""Seed of the random choices (kill moments, cycle lengths); set the variable to replay another sequence."""


# -- run histories --------------------------------------------------------------------------------

def read_history(run_dir: Path) -> tuple[list[dict], int]:
    """Every complete event of the run, and how many complete lines were malformed."""
    reader = EventReader(run_dir / EVENTS_FILE)
    events: list[dict] = []
    while batch := reader.read_new():
        events.extend(batch)
    return events, reader.malformed


def split_attempts(events: list[dict]) -> list[list[dict]]:
    """The attempts: each from a `run_started` up to the next. Nothing may come before the first."""
    attempts: list[list[dict]] = []
    for event in events:
        if event["kind"] == "run_started":
            attempts.append([])
        elif not attempts:
            raise AssertionError(f"{event['kind']} event before any run_started: {event}")
        attempts[-1].append(event)
    return attempts


def check_attempts(events: list[dict], ended_on_their_own: typing.Sequence[bool] | None = None) -> list[list[dict]]:
    """Assert the invariants of a run history; returns its attempts.

    `ended_on_their_own[i]`: attempt i's process exited by itself (it must have exactly one terminal
    event); False: it was killed (it may have none, or one if it ended just before the kill)."""
    attempts = split_attempts(events)
    for index, attempt in enumerate(attempts):
        where = f"attempt {index} (started at step {attempt[0].get('step')})"
        steps = [e["step"] for e in attempt if "step" in e]
        assert all(isinstance(s, int) for s in steps), f"{where}: a non-integer step: {steps}"
        assert steps == sorted(steps), f"{where}: steps go backwards: {steps}"
        logged = [e["step"] for e in attempt if e["kind"] == "step"]
        assert len(logged) == len(set(logged)), f"{where}: a step logged twice: {logged}"
        assert all(s > attempt[0]["step"] for s in logged), f"{where}: a step at or before its start: {logged}"
        terminals = [i for i, e in enumerate(attempt) if e["kind"] in TERMINAL_KINDS]
        assert len(terminals) <= 1, f"{where}: {len(terminals)} terminal events"
        if terminals:
            assert terminals[0] == len(attempt) - 1, f"{where}: events after its terminal event"
        if ended_on_their_own is not None and ended_on_their_own[index]:
            assert len(terminals) == 1, f"{where} ended on its own without a terminal event"
    if ended_on_their_own is not None:
        assert len(attempts) == len(ended_on_their_own), (len(attempts), list(ended_on_their_own))
    return attempts


def last_logged_step(events: list[dict]) -> int:
    """The highest step any step event reached (0 if none)."""
    return max((e["step"] for e in events if e["kind"] == "step"), default=0)


def toml_string(text: str) -> str:
    """`text` as a TOML basic string (control characters escaped, everything else as is)."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


# -- weights ----------------------------------------------------------------------------------------

def assert_same_weights(a_path: Path, b_path: Path) -> None:
    """The two checkpoints hold the same step, bit-identical weights, optimizer state and data cursor."""
    from tideborn.network.checkpoint import load_checkpoint

    a, b = load_checkpoint(a_path), load_checkpoint(b_path)
    assert a["step"] == b["step"], (a_path, b_path)
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"]["state"], b["optimizer"]["state"], "optimizer.state")
    assert a["data_cursor"] == b["data_cursor"]


# -- fault injection in a real process ------------------------------------------------------------------

SITECUSTOMIZE = r'''
"""Test-only fault injection (tests/helpers/reliability.py): fail writes with ENOSPC, as a full disk does.

TIDEBORN_FAULT_EVENTS="N[,sticky]": the N-th write to events.jsonl writes half its bytes (a short write,
as a disk filling up gives), and the write of the rest fails with ENOSPC; with `sticky` every later
write to events.jsonl fails too (the disk stays full), else they succeed (space came back).
TIDEBORN_FAULT_CHECKPOINT="K,BYTES": the K-th torch.save writes BYTES bytes, then fails with ENOSPC.
"""
import errno
import importlib.abc
import importlib.machinery
import os
import sys

_ENOSPC = lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _events_fault():
    spec = os.environ.get("TIDEBORN_FAULT_EVENTS")
    if not spec:
        return
    parts = spec.split(",")
    nth, sticky = int(parts[0]), "sticky" in parts[1:]
    real_write = os.write
    state = {"calls": 0, "failing": False}

    def is_events(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}").endswith("/events.jsonl")
        except OSError:
            return False

    def write(fd, data):
        if not is_events(fd):
            return real_write(fd, data)
        if state["failing"]:
            if not sticky:
                state["failing"] = False
            raise _ENOSPC()
        state["calls"] += 1
        if state["calls"] == nth:
            state["failing"] = True
            half = max(1, len(data) // 2)
            return real_write(fd, bytes(data[:half]))
        if sticky and state["calls"] > nth:
            raise _ENOSPC()
        return real_write(fd, data)

    os.write = write


class _Cut:
    def __init__(self, handle, limit):
        self.handle, self.limit, self.written = handle, limit, 0

    def write(self, data):
        room = self.limit - self.written
        if len(data) > room:
            if room > 0:
                self.handle.write(bytes(memoryview(data)[:room]))
                self.handle.flush()
                self.written = self.limit
            raise _ENOSPC()
        self.written += len(data)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)


def _patch_torch_save(torch):
    spec = os.environ.get("TIDEBORN_FAULT_CHECKPOINT")
    if not spec:
        return
    nth, limit = (int(x) for x in spec.split(","))
    real_save = torch.save
    calls = {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == nth and hasattr(f, "write"):
            return real_save(obj, _Cut(f, limit), *args, **kwargs)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Patch torch.save once torch is imported (the trainer imports it late, after parsing)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            _patch_torch_save(module)

        spec.loader.exec_module = patched
        return spec


_events_fault()
if os.environ.get("TIDEBORN_FAULT_CHECKPOINT"):
    sys.meta_path.insert(0, _AfterTorch())
'''


def fault_env(tmp_path: Path, *, events: str | None = None, checkpoint: str | None = None) -> dict[str, str]:
    """Environment for a trainer process with ENOSPC injected (see SITECUSTOMIZE)."""
    site = tmp_path / "fault-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH")]))}
    if events is not None:
        env["TIDEBORN_FAULT_EVENTS"] = events
    if checkpoint is not None:
        env["TIDEBORN_FAULT_CHECKPOINT"] = checkpoint
    return env


# -- runs started through train_run --------------------------------------------------------------------------

TOOL = [sys.executable, "-m", "tideborn.tools.train_run"]
WAIT_SECONDS = 600  # a hung run fails the test instead of hanging the suite; not a performance threshold


def tool(*args: str, cwd: Path | None = None, umask: int | None = None,
         timeout: float = WAIT_SECONDS) -> subprocess.CompletedProcess:
    """`python -m tideborn.tools.train_run ARGS` as a real process (one CPU thread for its trainer)."""
    from tests.helpers.common import REPO_ROOT, child_env

    kwargs = {} if umask is None else {"umask": umask}
    return subprocess.run([*TOOL, *args], cwd=cwd or REPO_ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


def wait_for(condition: typing.Callable[[], object], what: str, timeout: float = WAIT_SECONDS,
             interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(interval)
    pytest.fail(f"timed out waiting for {what}")


def trainer_pid(run_dir: Path) -> int:
    from tideborn.rundir.files import read_pid_record

    record = read_pid_record(run_dir)
    assert record is not None, f"no train.pid in {run_dir}"
    return record.pid


def process_gone(pid: int) -> bool:
    from tideborn.rundir.files import process_facts

    return not process_facts(pid).running


def launched_runs() -> typing.Iterator[list[Path]]:
    """For a fixture: run dirs whose trainers a test starts through train_run; any still alive at the end
    are SIGKILLed."""
    from tideborn.rundir.anomaly import same_process
    from tideborn.rundir.files import process_facts, read_pid_record

    run_dirs: list[Path] = []
    yield run_dirs
    for run_dir in run_dirs:
        try:
            record = read_pid_record(run_dir) if run_dir.is_dir() else None
        except Exception:  # noqa: BLE001 - cleanup must go on to the next directory
            record = None
        if record is not None and same_process(process_facts(record.pid), **record.identity()):
            os.kill(record.pid, signal.SIGKILL)


# -- a checkpoint that would run code --------------------------------------------------------------------

class CreatesFile:
    """Unpickling this creates `marker`: what a hostile "checkpoint" would do, minus the harm."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def write_hostile_checkpoint(path: Path, marker: Path, settings: dict | None = None) -> Path:
    import torch

    from tideborn.network.checkpoint import FORMAT, FORMAT_VERSION

    torch.save({"format": FORMAT, "format_version": FORMAT_VERSION, "step": 2, "settings": settings or {},
                "model": {"w": torch.zeros(2)}, "optimizer": {}, "scheduler": {}, "rng": {}, "data_cursor": {},
                "payload": CreatesFile(marker)}, path)
    return path


@contextlib.contextmanager
def tmpfs(mount_point: Path, *options: str):
    """A real tmpfs at `mount_point`; skipped where mounting is not permitted."""
    mount_point.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    tried = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("mode=0755", *options)), "tmpfs",
                            str(mount_point)], capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({tried.stderr.strip()})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def write_launch_file(run_dir: Path, *sets: str) -> None:
    """launch.json as `train_run start` would have written it for the template run."""
    overrides = [*sets, out_dir_set(run_dir)]
    (run_dir / "launch.json").write_text(json.dumps({
        "v": 1, "config": str(SMOKE_CONFIG), "config_path": str(SMOKE_CONFIG), "overrides": overrides,
        "flags": {}, "trainer_args": [], "nproc_per_node": 1, "cwd": str(run_dir.parent),
        "argv": [], "started_at": time.time(), "run_dir": str(run_dir)}))
