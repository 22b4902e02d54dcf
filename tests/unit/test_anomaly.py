"""The anomaly rules as pure functions: events, log lines and process facts in, anomalies out."""

from __future__ import annotations

import pytest

from tideborn.rundir.anomaly import (
    CUDA_ERROR,
    CUDA_OOM,
    DIVERGENCE,
    NCCL_ERROR,
    NONFINITE_LOSS,
    STALLED,
    TRACEBACK,
    VANISHED,
    AnomalyThresholds,
    LogScanner,
    LossWatch,
    ProcessFacts,
    match_log_line,
    nonfinite_loss,
    run_failed,
    same_process,
    shift_lines,
    stalled,
    vanished,
)


def step(n: int, loss: object, time: float = 1000.0) -> dict:
    return {"v": 1, "kind": "step", "step": n, "time": time + n, "loss": loss, "policy_loss": 1.0, "value_loss": 0.5}


def feed(watch: LossWatch, events: list[dict]) -> list:
    found = []
    for event in events:
        found += watch.observe(event)
    return found


# -- losses -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nonfinite_loss_is_flagged_with_its_step_and_values(value):
    anomaly = nonfinite_loss(step(120, value))
    assert anomaly is not None and anomaly.rule == NONFINITE_LOSS
    assert anomaly.evidence["step"] == 120 and anomaly.evidence["loss"] == value
    assert "step 120" in anomaly.message and anomaly.time == 1120.0


def test_finite_losses_and_other_kinds_are_not_flagged():
    assert nonfinite_loss(step(5, 2.5)) is None
    assert nonfinite_loss({"kind": "eval", "step": 5, "loss": "nan"}) is None


def test_a_streak_of_nan_steps_is_reported_once_and_stays_current_until_a_new_session():
    watch = LossWatch()
    found = feed(watch, [step(1, 3.0), step(2, "nan"), step(3, "nan"), step(4, "nan")])
    assert [a.rule for a in found] == [NONFINITE_LOSS]
    assert found[0].evidence["step"] == 2
    assert watch.nonfinite_count == 3
    assert [a.evidence["step"] for a in watch.current()] == [4]
    watch.new_session()
    assert watch.current() == []


def falling_then(rise_to: float, rise_at: int, steps: int, every: int = 10) -> list[dict]:
    events = []
    for n in range(every, steps + 1, every):
        loss = max(2.0, 8.0 - n / 100) if n < rise_at else rise_to
        events.append(step(n, loss))
    return events


def test_divergence_is_flagged_once_when_the_smoothed_loss_rises_far_above_its_best():
    watch = LossWatch(AnomalyThresholds(divergence_factor=1.5, divergence_warmup_steps=1000))
    found = feed(watch, falling_then(rise_to=6.0, rise_at=1500, steps=2500))
    assert [a.rule for a in found] == [DIVERGENCE]
    evidence = found[0].evidence
    assert evidence["step"] > 1500 and evidence["smoothed_loss"] > 1.5 * evidence["best_smoothed_loss"]
    assert evidence["best_step"] < 1500
    assert "1.5x" in found[0].message
    assert [a.rule for a in watch.current()] == [DIVERGENCE]


def test_no_divergence_before_warm_up_or_below_the_factor():
    early = LossWatch(AnomalyThresholds(divergence_warmup_steps=10_000))
    assert feed(early, falling_then(rise_to=6.0, rise_at=1500, steps=2500)) == []
    lenient = LossWatch(AnomalyThresholds(divergence_factor=4.0, divergence_warmup_steps=100))
    assert feed(lenient, falling_then(rise_to=6.0, rise_at=1500, steps=2500)) == []
    steady = LossWatch(AnomalyThresholds(divergence_warmup_steps=100))
    assert feed(steady, falling_then(rise_to=2.1, rise_at=1500, steps=2500)) == []


def test_divergence_clears_when_the_loss_comes_back():
    watch = LossWatch(AnomalyThresholds(divergence_warmup_steps=100, smoothing=0.5))
    feed(watch, falling_then(rise_to=6.0, rise_at=1500, steps=1700))
    assert watch.divergence is not None
    feed(watch, [step(1700 + 10 * i, 2.0) for i in range(1, 20)])
    assert watch.current() == []


@pytest.mark.parametrize("kwargs, pattern", [
    ({"divergence_factor": 1.0}, "divergence factor must be > 1"),
    ({"smoothing": 0.0}, r"smoothing must be in \(0, 1\]"),
    ({"stall_seconds": 0}, "stall seconds must be > 0"),
    ({"divergence_warmup_steps": -1}, "warm-up steps must be >= 0"),
])
def test_bad_thresholds_are_refused(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        AnomalyThresholds(**kwargs)


def test_run_failed_carries_the_error():
    anomaly = run_failed({"kind": "run_failed", "step": 7, "error": "RuntimeError: boom\nmore", "time": 5.0})
    assert anomaly is not None and anomaly.message == "run failed at step 7: RuntimeError: boom"
    assert run_failed({"kind": "run_stopped", "step": 7}) is None


# -- the log ----------------------------------------------------------------------------------------

LOG = """\
training 2x32 on cuda:0
step 10/100 | loss 7.1
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
RuntimeError: CUDA error: an illegal memory access was encountered
[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error
Traceback (most recent call last):
  File "/x/loop.py", line 10, in run
    self._loop()
ValueError: bad value
During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/cli.py", line 3, in main
RuntimeError: wrapped
step 20/100 | loss 6.9
"""


def scan(text: str) -> list:
    scanner = LogScanner()
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        found += scanner.feed(number, line, time=42.0)
    return found + scanner.flush(42.0)


def test_log_errors_are_flagged_with_line_number_and_text():
    found = scan(LOG)
    by_rule = {a.rule: a for a in found}
    assert [a.rule for a in found] == [CUDA_OOM, CUDA_ERROR, NCCL_ERROR, TRACEBACK]
    assert by_rule[CUDA_OOM].evidence == {"line": 3, "text": LOG.splitlines()[2]}
    assert by_rule[CUDA_ERROR].evidence["line"] == 4
    assert by_rule[NCCL_ERROR].evidence["line"] == 5 and "NCCL error" in by_rule[NCCL_ERROR].evidence["text"]
    traceback = by_rule[TRACEBACK]  # the chained traceback counts once
    assert traceback.evidence == {"line": 6, "text": "Traceback (most recent call last):", "exception_line": 9,
                                  "exception": "ValueError: bad value"}
    assert "line 6" in traceback.message and traceback.time == 42.0


def test_a_traceback_the_log_ends_inside_is_reported_by_flush_only():
    scanner = LogScanner()
    assert scanner.feed(1, "Traceback (most recent call last):") == []
    assert scanner.feed(2, '  File "x.py", line 1, in <module>') == []
    flushed = scanner.flush()
    assert [a.rule for a in flushed] == [TRACEBACK] and flushed[0].evidence["exception"] is None
    assert scanner.flush() == []


def test_torchrun_prefixed_traceback_and_plain_lines():
    found = scan("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"a.py\", line 1\n"
                 "[rank0]: KeyError: 'x'\n")
    assert [(a.rule, a.evidence["exception"]) for a in found] == [(TRACEBACK, "KeyError: 'x'")]
    assert match_log_line("step 10 | loss 2.0 | all good") is None
    assert match_log_line("RuntimeError: CUDA error: out of memory") == CUDA_OOM


def test_shift_lines_moves_line_numbers_and_message():
    anomaly = scan("x\nCUDA error: boom\n")[0]
    moved = shift_lines(anomaly, 100)
    assert moved.evidence["line"] == 102 and "line 102" in moved.message


# -- the process ------------------------------------------------------------------------------------

def test_same_process_compares_start_times():
    facts = ProcessFacts(pid=10, running=True, create_time=1000.0, name="python")
    assert same_process(facts, start_time=1000.4)
    assert not same_process(facts, start_time=900.0)
    assert same_process(facts, started_by=1005.0)
    assert not same_process(facts, started_by=990.0)  # started after the run it should have written
    assert not same_process(ProcessFacts(pid=10, running=False), start_time=1000.0)


def test_vanished_when_gone_or_reused_and_not_when_ended():
    gone = vanished(ProcessFacts(pid=10, running=False), ended=False, now=5.0, start_time=1000.0,
                    last_event={"kind": "step", "step": 30, "time": 4.0})
    assert gone is not None and gone.rule == VANISHED and "is gone" in gone.message
    assert gone.evidence["last_step"] == 30
    reused = vanished(ProcessFacts(pid=10, running=True, create_time=2000.0, name="sshd"), ended=False, now=5.0,
                      start_time=1000.0)
    assert reused is not None and "reused" in reused.message and reused.evidence["actual_start_time"] == 2000.0
    assert vanished(ProcessFacts(pid=10, running=False), ended=True, now=5.0, start_time=1000.0) is None
    alive = ProcessFacts(pid=10, running=True, create_time=1000.0)
    assert vanished(alive, ended=False, now=5.0, start_time=1000.0) is None


def test_stalled_after_the_threshold_while_alive():
    facts = ProcessFacts(pid=10, running=True, create_time=1.0)
    limits = AnomalyThresholds(stall_seconds=60)
    quiet = stalled(facts, alive=True, ended=False, last_output_time=100.0, now=200.0, thresholds=limits)
    assert quiet is not None and quiet.rule == STALLED and quiet.evidence["quiet_seconds"] == 100.0
    assert stalled(facts, alive=True, ended=False, last_output_time=190.0, now=200.0, thresholds=limits) is None
    assert stalled(facts, alive=False, ended=False, last_output_time=0.0, now=200.0, thresholds=limits) is None
    assert stalled(facts, alive=True, ended=True, last_output_time=0.0, now=200.0, thresholds=limits) is None
