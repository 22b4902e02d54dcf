"""Stopping a run with signals: one SIGTERM finishes the step, checkpoints and stops cleanly; a second
Ctrl-C outside a save ends the process at once. (A repeated signal during a save, and a repeated
SIGTERM at any time: tests/e2e/test_reliability_stop.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.helpers.common import REPO_ROOT, events_of, settings_args, step_events, terminal_events, wait_until
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir.layout import list_checkpoints

LONG_RUN = ("runtime.max_steps=100000", "runtime.log_every=1", "runtime.checkpoint_every=100000",
            "runtime.progress=plain")


def test_sigterm_checkpoints_the_step_it_stopped_on_and_exits_0(tmp_path: Path, start_trainer) -> None:
    run_dir = tmp_path / "run"
    trainer = start_trainer("train", *settings_args(run_dir, *LONG_RUN, "optim.batch_size=16"))
    wait_until(lambda: step_events(events_of(run_dir)), trainer, "the first step event")

    trainer.send(signal.SIGTERM)

    assert trainer.wait() == 0, trainer.output()
    events = events_of(run_dir)
    last = events[-1]
    assert last["kind"] == "run_stopped" and last["reason"] == "SIGTERM"
    assert terminal_events(events) == [last]
    stopped_at = last["step"]
    assert step_events(events)[-1]["step"] == stopped_at  # the stop step is logged too
    checkpoint = run_dir / f"step-{stopped_at:09d}.pt"
    assert last["checkpoint"] == str(checkpoint)
    assert list_checkpoints(run_dir) == [(stopped_at, checkpoint)]
    assert load_checkpoint(checkpoint)["step"] == stopped_at
    assert f"stopped (SIGTERM) at step {stopped_at}" in trainer.stdout_path.read_text()


CTRL_C_SITE = r'''
"""Test-only (tests/e2e/test_signals.py), loaded through PYTHONPATH: a real SIGINT to this process at the
calls of the trainer's policy loss (one a micro-batch) that TIDEBORN_SIGINT_AT_CALLS lists, as Ctrl-C pressed
then. The trainer's module imports the function by name, so it is wrapped as its module loads."""
import importlib.machinery
import os
import signal
import sys

_at = {int(n) for n in os.environ.get("TIDEBORN_SIGINT_AT_CALLS", "").split(",") if n}
_calls = [0]


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "tideborn.trainer.losses":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            real = module.policy_loss

            def policy_loss(*args, **kwargs):
                _calls[0] += 1
                if _calls[0] in _at:
                    os.kill(os.getpid(), signal.SIGINT)
                return real(*args, **kwargs)

            module.policy_loss = policy_loss

        spec.loader.exec_module = patched
        return spec


if _at:
    sys.meta_path.insert(0, _Finder())
'''


def test_a_second_ctrl_c_outside_a_save_ends_the_run_at_once(tmp_path: Path, start_trainer) -> None:
    run_dir = tmp_path / "run"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CTRL_C_SITE)
    # 8 micro-batches a step: step 1 is calls 1-8 of the loss, step 2 calls 9-16. Both Ctrl-Cs land inside step 2,
    # one micro-batch apart, wherever the machine's load puts them in time: a graceful stop would have to finish
    # step 2, log it and checkpoint, so cutting it short is visible in what the run leaves behind.
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)]), "TIDEBORN_SIGINT_AT_CALLS": "12,13"}
    trainer = start_trainer("train", *settings_args(run_dir, *LONG_RUN, "optim.batch_size=64",
                                                    "optim.accumulation_steps=8"), env=env)

    assert trainer.wait() == -signal.SIGINT, trainer.output()
    events = events_of(run_dir)
    assert [e["kind"] for e in events if e["kind"] in ("stop_requested", "warning")] == ["stop_requested"]
    assert terminal_events(events) == []
    assert [e["step"] for e in step_events(events)] == [1]  # the step in progress was not finished
    assert list_checkpoints(run_dir) == []
