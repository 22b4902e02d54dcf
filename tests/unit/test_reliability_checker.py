"""The reliability tests' history checker (tests/helpers/reliability.py): a checker that cannot fail is a
defect, so these feed it histories it must refuse."""

from __future__ import annotations

import json

import pytest

from tests.helpers.reliability import check_attempts
from tideborn.rundir.events import encode_event


def _history(*items: tuple[str, int]) -> list[dict]:
    return [json.loads(encode_event(kind, {"step": step})) for kind, step in items]


def test_the_checker_accepts_a_killed_then_resumed_history():
    events = _history(("run_started", 0), ("step", 1), ("step", 2), ("checkpoint_saved", 2), ("step", 3),
                      ("run_started", 2), ("step", 3), ("run_finished", 3))
    attempts = check_attempts(events, [False, True])
    assert [len(a) for a in attempts] == [5, 3]


@pytest.mark.parametrize("events, ended, message", [
    (_history(("run_started", 0), ("step", 2), ("step", 1)), None, "steps go backwards"),
    (_history(("run_started", 0), ("step", 1), ("step", 1)), None, "logged twice"),
    (_history(("run_started", 4), ("step", 4)), None, "at or before its start"),
    (_history(("run_started", 0), ("run_stopped", 0), ("run_failed", 0)), None, "2 terminal events"),
    (_history(("run_started", 0), ("run_stopped", 1), ("step", 1)), None, "after its terminal"),
    (_history(("run_started", 0), ("step", 1)), [True], "without a terminal event"),
    (_history(("step", 1), ("run_started", 0)), None, "before any run_started"),
])
def test_the_checker_refuses_a_broken_history(events, ended, message):
    with pytest.raises(AssertionError, match=message):
        check_attempts(events, ended)


