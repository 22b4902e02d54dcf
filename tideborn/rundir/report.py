"""A run's status report in words: what `train_run status` and `watch` print, and the figures the monitor's
eval table shows (`eval_figures`). Renders `status.RunStatus` (what `state.RunTracker.status()` returns) and
events; no torch."""

from __future__ import annotations

import math
from pathlib import Path

from tideborn.humanize import clock, duration, number
from tideborn.rundir import EVENTS_FILE
from tideborn.rundir.anomaly import EVENTS_GONE
from tideborn.rundir.events import as_float
from tideborn.rundir.kinds import Eval
from tideborn.rundir.status import RunStatus


def status_text(status: RunStatus) -> str:
    s = status
    lines = [f"run dir     {s.run_dir}"]
    who = f" (pid {s.pid} on {s.host})" if s.pid is not None else ""
    lines.append(f"state       {s.state}{who}")
    if s.stop_requested is not None:
        asked = s.stop_requested
        when = asked.since()
        lines.append(f"stopping    {asked.signal or 'a stop signal'} at {clock(when) if when else '?'}: "
                     "finishing its step, then a checkpoint and run_stopped (stop again waits for it)")
    progress = f" ({s.progress * 100:.1f}%)" if s.progress is not None else ""
    max_steps = f"{s.max_steps:,}" if s.max_steps is not None else "?"
    timing = f"  elapsed {duration(s.elapsed_seconds)}"
    if s.eta_seconds is not None:
        timing += f"  ETA {duration(s.eta_seconds)}"
    unreadable = any(a.rule == "run_file" and a.evidence.get("file") == EVENTS_FILE for a in s.anomalies)
    moved = any(a.rule == EVENTS_GONE for a in s.anomalies)
    if (unreadable or moved) and not s.events_read:
        why = "was moved away under the run" if moved else "cannot be read"
        lines.append(f"step        unknown: {EVENTS_FILE} {why} (see anomalies)")
    elif s.pid is not None and not s.launch_started and s.state in ("running", "stalled", "vanished"):
        lines.append(f"step        no run_started from pid {s.pid}" + (" yet" if s.state != "vanished" else "")
                     + (f" (the run before reached step {s.step:,})" if s.step else ""))
    else:
        lines.append(f"step        {s.step:,} / {max_steps}{progress}{timing}")
    if s.loss:
        loss = s.loss
        lines.append(f"loss        {number(loss.get('loss'))} (policy {number(loss.get('policy_loss'))}, "
                     f"value {number(loss.get('value_loss'))}) at step {s.loss_step}; lr {number(s.lr, '.2e')}; "
                     f"{number(s.positions_per_second, ',.0f')} pos/s")
    ck = s.last_checkpoint
    lines.append(f"checkpoint  {Path(ck.path).name} (step {ck.step}), {duration(ck.age_seconds)} ago"
                 if ck else "checkpoint  none yet")
    if ck and ck.changed_since_saved:
        lines[-1] += (f"; CHANGED since it was saved ({ck.bytes:,} bytes, saved as {ck.saved_bytes:,}): "
                      "the next train skips it if it does not load")
    if s.resume_from:
        lines.append(f"resume      {s.resume_from} (the newest healthy checkpoint; train resumes from it)")
    if s.last_eval is not None:
        lines.append("eval        " + " ".join(f"{k} {v}" for k, v in eval_figures(s.last_eval)))
    else:
        lines.append("eval        none")
    if s.elo_curve:
        lines.append("match       " + match_text(s.elo_curve[-1].as_list()))
        if len(s.elo_curve) > 1:
            lines.append("elo curve   " + " ".join(f"{point.step}:{elo_number(point.elo)}"
                                                   for point in s.elo_curve[-ELO_CURVE_SHOWN:]))
    if s.elo_rebaselines:
        lines.append("elo origin  " + rebaseline_text(s.elo_rebaselines[-1].as_list()) + "; Elo before and after it "
                     "are not comparable")
    if s.warnings.count:
        lines.append(f"warnings    {s.warnings.count} (last: {s.warnings.last})")
    if s.terminal is not None:
        t = s.terminal
        detail = t.reason or t.error or t.checkpoint or ""
        lines.append(f"ended       {t.kind} at step {t.step}" + (f": {detail}" if detail else ""))
    if s.tail_only:
        lines.append("note        events.jsonl is long: losses and anomalies are from its tail")
    if s.events_rotated:
        lines.append("note        events.jsonl does not begin with run_started: it was truncated or rotated under "
                     "the run" + ("; the session's run_started (settings, max_steps) went with the old part"
                                  if s.run_started_missing else ""))
    anomalies = s.anomalies
    lines.append(f"anomalies   {len(anomalies) or 'none'}")
    lines += [f"  ! {a.rule}: {a.message}" for a in anomalies]
    for rule, count in s.log_error_counts.items():
        shown = sum(1 for a in anomalies if a.rule == rule)
        if count > shown:
            lines.append(f"  ({count - shown} earlier {rule} lines in train.log not shown)")
    return "\n".join(lines)


def eval_figures(last_eval: Eval) -> list[tuple[str, str]]:
    """The figures of an `eval` event as status prints them, (name, text) in the event's order; the TUI's eval
    table shows the same."""
    return [(k, number(v, '.4g')) for k, v in last_eval.figures().items()]


ELO_CURVE_SHOWN = 10
"""The newest match results status shows on its `elo curve` line (status --json has them all)."""


def elo_number(value: object) -> str:
    elo = as_float(value)
    if elo is None:
        return "?"
    return f"{elo + 0.0:+.0f}" if math.isfinite(elo) else ("+inf" if elo > 0 else "-inf")


def match_text(point: list) -> str:
    """`[step, elo, elo_low, elo_high, reference_step]` from a `match` event, in words."""
    step, elo, low, high, reference = (list(point) + [None] * 5)[:5]
    return f"step {step} vs step {reference}: Elo {elo_number(elo)} [{elo_number(low)}, {elo_number(high)}] (95%)"


def rebaseline_text(point: list) -> str:
    """`[step, old reference step, new reference step]` of a `match_rebaseline` warning, in words."""
    step, old, new = (list(point) + [None] * 3)[:3]
    return f"MOVED at step {step}: the match reference (step {old}) was lost, matches now play step {new}"


def event_text(event: dict) -> str:
    when = clock(event.get("time") or 0)
    kind = event.get("kind")
    if kind == "match":
        return (f"{when} match " + match_text([event.get("step"), event.get("elo"), event.get("elo_low"),
                                               event.get("elo_high"), event.get("reference_step")])
                + f", score {number(event.get('score'), '.3f')} over {event.get('games')} games")
    if kind == "anomaly":
        return f"{when} ANOMALY {event.get('rule')}: {event.get('message')}"
    if kind == "step":
        return (f"{when} step {event.get('step')} loss {number(event.get('loss'))} (policy "
                f"{number(event.get('policy_loss'))}, value {number(event.get('value_loss'))}) lr "
                f"{number(event.get('lr'), '.2e')} {number(event.get('positions_per_second'), ',.0f')} pos/s")
    fields = " ".join(f"{k}={v}" for k, v in event.items()
                      if k not in ("v", "time", "kind") and not isinstance(v, (dict, list)))
    return f"{when} {kind} {fields}".rstrip()
