"""A run's status report in words: what `train_run status` and `watch` print, and the last eval as the monitor's
checkpoint screen shows it too (`eval_text`). Renders `status.RunStatus` (what `state.RunTracker.status()`
returns) and events; no torch."""

from __future__ import annotations

import math
import typing
from pathlib import Path

from tideborn.humanize import clock, compact, duration, number, percent
from tideborn.rundir.anomaly import EVENTS_GONE, Anomaly
from tideborn.rundir.kinds import DataWindow, Eval, RunEnded, StopRequested, as_float
from tideborn.rundir.layout import EVENTS_FILE
from tideborn.rundir.status import CheckpointOnDisk, EloPoint, Rebaseline, RunStatus


def status_text(status: RunStatus) -> str:
    """The status in words, a line a part: where and who, how far, how it trains, what it saved and measured,
    how it ended, and what looks wrong."""
    s = status
    who = f" (pid {s.pid} on {s.host})" if s.pid is not None else ""
    lines = [f"run dir     {s.run_dir}",
             f"state       {s.state}{' (waiting for data)' if s.waiting_for_data else ''}{who}"]
    if s.stop_requested is not None:
        lines.append(_stopping_line(s.stop_requested))
    lines.append(_step_line(s))
    lines += _training_lines(s)
    lines.append(_checkpoint_line(s.last_checkpoint))
    if s.resume_from:
        lines.append(f"resume      {s.resume_from} (the newest healthy checkpoint; train resumes from it)")
    lines.append("eval        " + (eval_text(s.last_eval) if s.last_eval is not None else "none"))
    lines += _match_lines(s.elo_curve, s.elo_rebaselines)
    if s.warnings.count:
        lines.append(f"warnings    {s.warnings.count} (last: {s.warnings.last})")
    if s.terminal is not None:
        lines.append(_ended_line(s.terminal))
    lines += _reading_notes(s)
    lines += _anomaly_lines(s.anomalies, s.log_error_counts)
    return "\n".join(lines)


def _stopping_line(asked: StopRequested) -> str:
    when = asked.since()
    return (f"stopping    {asked.signal or 'a stop signal'} at {clock(when) if when else '?'}: "
            "finishing its step, then a checkpoint and run_stopped (stop again waits for it)")


def _step_line(s: RunStatus) -> str:
    """How far the run is, or why that is unknown."""
    unknown = _step_unknown(s)
    if unknown is not None:
        return f"step        {unknown}"
    progress = f" ({s.progress * 100:.1f}%)" if s.progress is not None else ""
    max_steps = f"{s.max_steps:,}" if s.max_steps is not None else "?"
    timing = f"  elapsed {duration(s.elapsed_seconds)}"
    if s.eta_seconds is not None:
        timing += f"  ETA {duration(s.eta_seconds)}"
    return f"step        {s.step:,} / {max_steps}{progress}{timing}"


def _step_unknown(s: RunStatus) -> str | None:
    """Why the step cannot be told: events.jsonl unreadable or moved away, or a launch that has not written its
    run_started; None where it can."""
    unreadable = any(a.rule == "run_file" and a.evidence.get("file") == EVENTS_FILE for a in s.anomalies)
    moved = any(a.rule == EVENTS_GONE for a in s.anomalies)
    if (unreadable or moved) and not s.events_read:
        why = "was moved away under the run" if moved else "cannot be read"
        return f"unknown: {EVENTS_FILE} {why} (see anomalies)"
    if s.pid is not None and not s.launch_started and s.state in ("running", "stalled", "vanished"):
        return (f"no run_started from pid {s.pid}" + (" yet" if s.state != "vanished" else "")
                + (f" (the run before reached step {s.step:,})" if s.step else ""))
    return None


def _training_lines(s: RunStatus) -> list[str]:
    """The newest losses and rates, torchrun's restarts, and the watched data's window."""
    lines = []
    if s.loss:
        loss = s.loss  # the losses the newest step event has: any of the three may be missing
        lines.append(f"loss        {compact(loss.get('loss'))} (policy {compact(loss.get('policy_loss'))}, "
                     f"value {compact(loss.get('value_loss'))}) at step {s.loss_step}; lr {number(s.lr, '.2e')}; "
                     f"{number(s.positions_per_second, ',.0f')} pos/s")
    if s.restarts:
        lines.append(f"restarts    {s.restarts} by torchrun's elastic agent; now at world size {s.world_size} "
                     "(each restart is listed under anomalies)")
    if s.data_window is not None:
        lines.append("data        " + data_window_text(s.data_window, s.waiting_for_data))
    return lines


def _checkpoint_line(ck: CheckpointOnDisk | None) -> str:
    if ck is None:
        return "checkpoint  none yet"
    text = f"checkpoint  {Path(ck.path).name} (step {ck.step}), {duration(ck.age_seconds)} ago"
    if ck.changed_since_saved:
        text += (f"; CHANGED since it was saved ({ck.bytes:,} bytes, saved as {ck.saved_bytes:,}): "
                 "the next train skips it if it does not load")
    return text


def _match_lines(curve: typing.Sequence[EloPoint], rebaselines: typing.Sequence[Rebaseline]) -> list[str]:
    """The newest match, the Elo curve's last points, and where its origin last moved."""
    lines = []
    if curve:
        lines.append("match       " + match_text(curve[-1]))
        if len(curve) > 1:
            lines.append("elo curve   " + " ".join(f"{point.step}:{elo_number(point.elo)}"
                                                   for point in curve[-ELO_CURVE_SHOWN:]))
    if rebaselines:
        lines.append("elo origin  " + rebaseline_text(rebaselines[-1]) + "; Elo before and after it are not "
                     "comparable")
    return lines


def _ended_line(terminal: RunEnded) -> str:
    detail = terminal.reason or terminal.error or terminal.checkpoint or ""
    return f"ended       {terminal.kind} at step {terminal.step}" + (f": {detail}" if detail else "")


def _reading_notes(s: RunStatus) -> list[str]:
    """What the reader could not see: the part of a long events.jsonl before its tail, or a part rotated away."""
    lines = []
    if s.tail_only:
        lines.append("note        events.jsonl is long: losses and anomalies are from its tail")
    if s.events_rotated:
        lines.append("note        events.jsonl does not begin with run_started: it was truncated or rotated under "
                     "the run" + ("; the session's run_started (settings, max_steps) went with the old part"
                                  if s.run_started_missing else ""))
    return lines


def _anomaly_lines(anomalies: typing.Sequence[Anomaly], log_error_counts: typing.Mapping[str, int]) -> list[str]:
    """Each anomaly, and how many more train.log lines each log rule matched than are listed."""
    lines = [f"anomalies   {len(anomalies) or 'none'}"]
    lines += [f"  ! {a.rule}: {a.message}" for a in anomalies]
    for rule, count in log_error_counts.items():
        shown = sum(1 for a in anomalies if a.rule == rule)
        if count > shown:
            lines.append(f"  ({count - shown} earlier {rule} lines in train.log not shown)")
    return lines


def data_window_text(window: DataWindow, waiting: bool) -> str:
    """`data.watch`'s window in words, as status and the monitor say it: "window 12,000 positions in 8 files;
    arriving 40,000 positions/h; newest file 3m old", with "waiting for data (N needed)" first while it waits."""
    positions = f"{window.positions:,}" if window.positions is not None else "?"
    files = f" in {window.files:,} file(s)" if window.files is not None else ""
    parts = [f"window {positions} positions{files}"]
    if waiting:
        parts.insert(0, f"waiting for data ({max(1, window.min_positions or 0):,} positions needed)")
    if window.arrival_positions_per_hour is not None:
        parts.append(f"arriving {window.arrival_positions_per_hour:,.0f} positions/h")
    if window.newest_age_seconds is not None:
        parts.append(f"newest file {duration(window.newest_age_seconds)} old")
    return "; ".join(parts)


EVAL_SHOWN_APART = {"step", "seconds", "skipped_records"}
"""Eval fields `eval_text` does not phrase as figures: the step leads the text, the timing and a zero count of
skipped records say nothing about the network."""


def eval_text(last_eval: Eval) -> str:
    """An `eval` event in the trainer's words, the one phrasing `status` and the monitor show: "step 400: policy
    top-1 21.5% (legal 23.3%), value accuracy 70.0%, policy loss 2.01, value loss 0.541 (8,192 positions)";
    fields this reader does not know follow as `name value`."""
    figures = dict(last_eval.figures())
    step = figures.get("step")
    parts = _figures_text(figures)
    positions = figures.get("positions")
    if isinstance(positions, int) and not isinstance(positions, bool):
        parts[-1:] = [f"{parts[-1]} ({positions:,} positions)"] if parts else [f"{positions:,} positions"]
    skipped = figures.get("skipped_records")
    if isinstance(skipped, int) and not isinstance(skipped, bool) and skipped:
        parts.append(f"{skipped:,} records skipped")
    ema = figures.get("ema")
    text = ", ".join(parts) or "no figures"
    if isinstance(ema, dict) and ema:
        text += "; EMA " + ", ".join(_figures_text(ema))
    return (f"step {step:,}: " if isinstance(step, int) and not isinstance(step, bool) else "") + text


def _figures_text(figures: dict) -> list[str]:
    parts = []
    if "policy_accuracy" in figures:
        legal = figures.get("policy_accuracy_legal")
        parts.append(f"policy top-1 {percent(figures['policy_accuracy'])}"
                     + (f" (legal {percent(legal)})" if legal is not None else ""))
    if "value_accuracy" in figures:
        value = figures["value_accuracy"]
        parts.append(f"value accuracy {'n/a' if value is None else percent(value)}")  # None: every position a draw
    for key, words in (("policy_loss", "policy loss"), ("value_loss", "value loss"),
                       ("policy_entropy", "policy entropy"), ("value_entropy", "value entropy")):
        if key in figures:
            parts.append(f"{words} {compact(figures[key])}")
    known = {"policy_accuracy", "policy_accuracy_legal", "value_accuracy", "policy_loss", "value_loss",
             "policy_entropy", "value_entropy", "positions", "ema", *EVAL_SHOWN_APART}
    for key, value in figures.items():
        if key not in known:
            shown = compact(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            parts.append(f"{key} {shown}")
    return parts


ELO_CURVE_SHOWN = 10
"""The newest match results status shows on its `elo curve` line (status --json has them all)."""


def elo_number(elo: float | None) -> str:
    if elo is None:
        return "?"
    return f"{elo + 0.0:+.0f}" if math.isfinite(elo) else ("+inf" if elo > 0 else "-inf")


def match_text(point: EloPoint) -> str:
    """A match result in words: "step 30 vs step 20: Elo +36 [+1, ?] (95%)" (? where the event had no number)."""
    return _match_words(point.step, point.elo, point.elo_low, point.elo_high, point.reference_step)


def _match_words(step: object, elo: float | None, low: float | None, high: float | None, reference: object) -> str:
    return f"step {step} vs step {reference}: Elo {elo_number(elo)} [{elo_number(low)}, {elo_number(high)}] (95%)"


def rebaseline_text(point: Rebaseline) -> str:
    """A `match_rebaseline` warning in words."""
    return (f"MOVED at step {point.step}: the match reference (step {point.old_reference_step}) was lost, matches "
            f"now play step {point.reference_step}")


def event_text(event: dict) -> str:
    when = clock(event.get("time") or 0)
    kind = event.get("kind")
    if kind == "match":
        # any event as read (`watch`): its fields as written, the Elo's figures as numbers where they are
        return (f"{when} match " + _match_words(event.get("step"), as_float(event.get("elo")),
                                                as_float(event.get("elo_low")), as_float(event.get("elo_high")),
                                                event.get("reference_step"))
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
