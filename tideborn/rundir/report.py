"""A run's status report in words: what `train_run status` and `watch` print, and the figures the monitor's
eval table shows (`eval_figures`). Reads the report of `state.RunTracker.status()` and events; no torch."""

from __future__ import annotations

import math
from pathlib import Path

from tideborn.humanize import clock, duration, number
from tideborn.rundir import EVENTS_FILE
from tideborn.rundir.anomaly import EVENTS_GONE
from tideborn.rundir.events import as_float


def status_text(report: dict) -> str:
    r = report
    lines = [f"run dir     {r['run_dir']}"]
    who = f" (pid {r['pid']} on {r['host']})" if r["pid"] is not None else ""
    lines.append(f"state       {r['state']}{who}")
    if r.get("stop_requested"):
        asked = r["stop_requested"]
        when = as_float(asked.get("requested_at")) or as_float(asked.get("time"))
        lines.append(f"stopping    {asked.get('signal') or 'a stop signal'} at {clock(when) if when else '?'}: "
                     "finishing its step, then a checkpoint and run_stopped (stop again waits for it)")
    progress = f" ({r['progress'] * 100:.1f}%)" if r["progress"] is not None else ""
    max_steps = f"{r['max_steps']:,}" if isinstance(r["max_steps"], int) else "?"
    timing = f"  elapsed {duration(r['elapsed_seconds'])}"
    if r["eta_seconds"] is not None:
        timing += f"  ETA {duration(r['eta_seconds'])}"
    unreadable = any(a["rule"] == "run_file" and a["evidence"].get("file") == EVENTS_FILE for a in r["anomalies"])
    moved = any(a["rule"] == EVENTS_GONE for a in r["anomalies"])
    if (unreadable or moved) and not r["events_read"]:
        why = "was moved away under the run" if moved else "cannot be read"
        lines.append(f"step        unknown: {EVENTS_FILE} {why} (see anomalies)")
    elif r["pid"] is not None and not r["launch_started"] and r["state"] in ("running", "stalled", "vanished"):
        lines.append(f"step        no run_started from pid {r['pid']}" + (" yet" if r["state"] != "vanished" else "")
                     + (f" (the run before reached step {r['step']:,})" if r["step"] else ""))
    else:
        lines.append(f"step        {r['step']:,} / {max_steps}{progress}{timing}")
    if r["loss"]:
        loss = r["loss"]
        lines.append(f"loss        {number(loss.get('loss'))} (policy {number(loss.get('policy_loss'))}, "
                     f"value {number(loss.get('value_loss'))}) at step {r['loss_step']}; lr {number(r['lr'], '.2e')}; "
                     f"{number(r['positions_per_second'], ',.0f')} pos/s")
    ck = r["last_checkpoint"]
    lines.append(f"checkpoint  {Path(ck['path']).name} (step {ck['step']}), {duration(ck['age_seconds'])} ago"
                 if ck else "checkpoint  none yet")
    if ck and ck.get("changed_since_saved"):
        lines[-1] += (f"; CHANGED since it was saved ({ck['bytes']:,} bytes, saved as {ck['saved_bytes']:,}): "
                      "the next train skips it if it does not load")
    if r.get("resume_from"):
        lines.append(f"resume      {r['resume_from']} (the newest healthy checkpoint; train resumes from it)")
    if r["last_eval"]:
        lines.append("eval        " + " ".join(f"{k} {v}" for k, v in eval_figures(r["last_eval"])))
    else:
        lines.append("eval        none")
    if r.get("elo_curve"):
        lines.append("match       " + match_text(r["elo_curve"][-1]))
        if len(r["elo_curve"]) > 1:
            lines.append("elo curve   " + " ".join(f"{point[0]}:{elo_number(point[1])}"
                                                   for point in r["elo_curve"][-ELO_CURVE_SHOWN:]))
    if r.get("elo_rebaselines"):
        lines.append("elo origin  " + rebaseline_text(r["elo_rebaselines"][-1]) + "; Elo before and after it are "
                     "not comparable")
    if r["warnings"]["count"]:
        lines.append(f"warnings    {r['warnings']['count']} (last: {r['warnings']['last']})")
    if r["terminal"]:
        t = r["terminal"]
        detail = t.get("reason") or t.get("error") or t.get("checkpoint") or ""
        lines.append(f"ended       {t['kind']} at step {t.get('step')}" + (f": {detail}" if detail else ""))
    if r["tail_only"]:
        lines.append("note        events.jsonl is long: losses and anomalies are from its tail")
    if r.get("events_rotated"):
        lines.append("note        events.jsonl does not begin with run_started: it was truncated or rotated under "
                     "the run" + ("; the session's run_started (settings, max_steps) went with the old part"
                                  if r.get("run_started_missing") else ""))
    anomalies = r["anomalies"]
    lines.append(f"anomalies   {len(anomalies) or 'none'}")
    lines += [f"  ! {a['rule']}: {a['message']}" for a in anomalies]
    for rule, count in r["log_error_counts"].items():
        shown = sum(1 for a in anomalies if a["rule"] == rule)
        if count > shown:
            lines.append(f"  ({count - shown} earlier {rule} lines in train.log not shown)")
    return "\n".join(lines)


def eval_figures(last_eval: dict) -> list[tuple[str, str]]:
    """The figures of a status report's `last_eval` as status prints them, (name, text) in the event's order;
    the TUI's eval table shows the same."""
    return [(k, number(v, '.4g')) for k, v in last_eval.items() if k not in ("time", "kind")]


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
