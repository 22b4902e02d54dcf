"""Resume: a run stopped and resumed is bit-identical to one that never stopped, and a corrupt newest
checkpoint is skipped (with a warning) in favour of the newest one that loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.common import (
    TEMPLATE_SETS,
    assert_same_tensors,
    copy_run,
    describe,
    events_of,
    step_events,
    terminal_events,
    train,
)
from tideborn.network.checkpoint import load_checkpoint

EXACT_SETS = ("runtime.max_steps=20", "runtime.log_every=1", "runtime.checkpoint_every=10", "optim.batch_size=32",
              "runtime.progress=plain")
COMPARED = ("loss", "policy_loss", "value_loss", "grad_norm", "lr")


@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_stopped_and_resumed_run_is_bit_identical_to_a_straight_one(
        accumulation_steps: int, tmp_path: Path) -> None:
    sets = (*EXACT_SETS, f"optim.accumulation_steps={accumulation_steps}")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"

    # All three runs in this process, one after another: each seeds its own generators, so the straight run
    # must match however much the process ran before it (a trainer process would cost its start-up again).
    train(straight, *sets, cwd=tmp_path)
    train(resumed, *sets, cwd=tmp_path, extra=["--stop-at-step", "10"])
    first_half = events_of(resumed)
    second = train(resumed, *sets, cwd=tmp_path)
    assert "resuming from" in second.stdout and "step-000000010.pt at step 10" in second.stdout

    straight_events = events_of(straight)
    second_half = events_of(resumed)[len(first_half):]
    assert [e["kind"] for e in second_half if e["kind"] == "warning"] == []
    assert [e["kind"] for e in terminal_events(first_half)] == ["run_stopped"]
    assert first_half[-1]["step"] == 10
    assert second_half[0]["kind"] == "run_started" and second_half[0]["step"] == 10
    assert second_half[0]["resumed_from"] == str(resumed / "step-000000010.pt")
    assert [e["kind"] for e in terminal_events(second_half)] == ["run_finished"]

    expected = {e["step"]: e for e in step_events(straight_events)}
    got = step_events(first_half) + step_events(second_half)
    assert sorted(expected) == [e["step"] for e in got] == list(range(1, 21))
    for event in got:
        for key in COMPARED:
            assert event[key] == expected[event["step"]][key], (event["step"], key)
    assert len({e["loss"] for e in got}) > 1  # the losses move: equal lists are not equal by accident

    a = load_checkpoint(straight / "step-000000020.pt")
    b = load_checkpoint(resumed / "step-000000020.pt")
    assert a["step"] == b["step"] == 20
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"]["state"], b["optimizer"]["state"], "optimizer.state")
    assert a["data_cursor"] == b["data_cursor"]


def test_a_corrupt_newest_checkpoint_is_skipped_for_the_one_before(template_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    newest = run_dir / "step-000000004.pt"
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # a torn write, as a full disk or a bad copy leaves it
    history = len(events_of(run_dir))

    result = train(run_dir, *TEMPLATE_SETS, "runtime.max_steps=6", cwd=tmp_path)

    run = events_of(run_dir)[history:]
    warnings = [e for e in run if e["kind"] == "warning"]
    assert len(warnings) == 1, run
    assert "step-000000004.pt" in warnings[0]["message"]
    assert "corrupt or truncated" in warnings[0]["message"]
    started = next(e for e in run if e["kind"] == "run_started")
    assert started["resumed_from"] == str(run_dir / "step-000000002.pt")
    assert started["step"] == 2
    assert [e["step"] for e in step_events(run)] == [3, 4, 5, 6]
    assert [e["kind"] for e in terminal_events(run)] == ["run_finished"]
    # The person at the terminal is told as well.
    assert "warning: skipped unusable checkpoint" in result.stdout and "step-000000004.pt" in result.stdout
    assert f"resuming from {run_dir / 'step-000000002.pt'} at step 2" in result.stdout, describe(result)
    assert load_checkpoint(newest)["step"] == 4  # written again, whole, by the resumed run


def test_a_changed_learning_rate_and_decay_take_effect_on_resume(tmp_path: Path) -> None:
    # changed_settings lists them; the resumed steps must also use them (the checkpoint's optimizer state
    # holds the old ones).
    from tideborn.config.schema import OptimSettings
    from tideborn.network.optim import lr_factor

    run = tmp_path / "run"
    sets = ("runtime.max_steps=12", "runtime.log_every=1", "optim.batch_size=16", "runtime.progress=plain")
    train(run, *sets, cwd=tmp_path, extra=["--stop-at-step", "6"])
    first = len(events_of(run))
    train(run, *sets, "optim.lr=0.01", "optim.weight_decay=0.001", cwd=tmp_path)

    resumed = events_of(run)[first:]
    assert resumed[0]["changed_settings"]["optim.lr"] == [0.05, 0.01]
    smoke = OptimSettings(lr=0.01, warmup_steps=2, schedule="cosine")  # configs/smoke.toml's, lr changed
    for event in step_events(resumed):
        # the rate of the update that made step N is lr_factor(N - 1)
        assert event["lr"] == pytest.approx(0.01 * lr_factor(event["step"] - 1, smoke, 12), rel=1e-12), event
    groups = load_checkpoint(run / "step-000000012.pt")["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.001, 0.0]
    assert all(g["initial_lr"] == 0.01 for g in groups)
