"""A run's curves and x-axis markers, folded from its events; and the loader that reads a long
events.jsonl from the start in a worker while the tail is already on screen. No textual here.

Only what the plot needs is kept: steps and losses in numpy arrays (tideborn.tui.series), eval figures, and the
steps of checkpoints, resumes and anomalies. A two-million-step run fits in about 150 MB.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import stat
import typing
from pathlib import Path

import numpy as np

from tideborn.rundir.anomaly import Anomaly, nonfinite_loss
from tideborn.rundir.events import loads_bounded
from tideborn.rundir.files import first_event
from tideborn.rundir.kinds import as_float
from tideborn.safefile import open_regular
from tideborn.tui.plotting import Band, Marker
from tideborn.tui.series import Column, ColumnSpec, Series, StepTable

STEP_SERIES = ("loss", "policy_loss", "value_loss")
STEP_METRICS = ("grad_norm", "lr", "positions_per_second", "data_wait_fraction")
"""From `step` events too: data_wait_fraction is data_wait_seconds / (data_wait_seconds + compute_seconds)."""
STEP_COLUMNS = (ColumnSpec("loss"), ColumnSpec("policy_loss"), ColumnSpec("value_loss"), ColumnSpec("grad_norm"),
                ColumnSpec("lr", smoothed=False), ColumnSpec("positions_per_second"), ColumnSpec("data_wait_fraction"))
"""The learning rate is a schedule, not a noisy measurement: it is never smoothed."""
COLUMN_NAMES = tuple(spec.name for spec in STEP_COLUMNS)
EVAL_SERIES = ("policy_loss", "value_loss", "policy_accuracy", "value_accuracy", "policy_accuracy_legal")
SERIES_NAMES = COLUMN_NAMES + tuple(f"eval_{name}" for name in EVAL_SERIES)
ELO_SERIES = "elo"
"""The `match` events' Elo against the reference: a Series, with its 95% interval in `RunHistory.elo_interval`."""
SERIES_NAMES += (ELO_SERIES,)
_WANTED = (b'"kind":"step"', b'"kind":"eval"', b'"kind":"run_started"', b'"kind":"checkpoint_saved"',
           b'"kind":"match"')
CHUNK_BYTES = 1024 * 1024
"""Small enough that the loader, holding the GIL in one regex pass, never stalls the UI for long."""


def wait_fraction(event: dict) -> float | None:
    """The share of a step window's wall time spent waiting for data; None without both figures."""
    wait, compute = as_float(event.get("data_wait_seconds")), as_float(event.get("compute_seconds"))
    if wait is None or compute is None or not math.isfinite(wait + compute) or wait + compute <= 0:
        return None
    return wait / (wait + compute)


def _time(event: dict) -> float:
    value = as_float(event.get("time"))
    return math.nan if value is None else value


class RunHistory:
    """Curves by name (see SERIES_NAMES) and markers, fed with events in order. The step metrics are
    columns of one StepTable (`steps`); eval figures are Series of their own, never smoothed."""

    def __init__(self, weight: float = 0.9):
        self.weight = weight
        self.steps = StepTable(STEP_COLUMNS, weight)
        self.series: dict[str, Series | Column] = dict(self.steps.columns)
        for name in EVAL_SERIES:
            self.series[f"eval_{name}"] = Series(f"eval_{name}", weight, smoothed=False)
        self.series[ELO_SERIES] = Series(ELO_SERIES, weight, smoothed=False)
        self.elo_interval = Interval()
        self.markers: list[Marker] = []
        self.sessions = 0
        self.last_step: int | None = None
        self.read_to = 0
        """Where the complete lines `load_history` folded end (a follower goes on from there)."""
        self._rows: list[tuple[int, float, list[float | None]]] = []
        self._pending: dict[str, tuple[list[float], list[float], list[float]]] = {}

    def add(self, events: typing.Iterable[dict]) -> bool:
        """Fold events in; True if anything the plot shows changed."""
        changed = False
        for event in events:
            kind = event.get("kind")
            step = event.get("step")
            if kind == "step" and isinstance(step, int):
                if self.last_step is not None and step < self.last_step:
                    self._flush()
                    self.markers.append(Marker(float(step), "resume", _time(event)))
                values = [as_float(event.get(name)) for name in COLUMN_NAMES[:-1]] + [wait_fraction(event)]
                self._rows.append((step, _time(event), values))
                self.last_step = step
                changed = True
            elif kind == "eval" and isinstance(step, int):
                for name in EVAL_SERIES:
                    self._queue(f"eval_{name}", step, event.get(name), _time(event))
                changed = True
            elif kind == "run_started":
                self._flush()
                self.sessions += 1
                self.steps.break_segment()
                for series in self.series.values():
                    if isinstance(series, Series):
                        series.break_segment()
                start = step if isinstance(step, int) else 0
                if event.get("resumed_from") or (self.last_step is not None and start <= self.last_step):
                    self.markers.append(Marker(float(start), "resume", _time(event)))
                self.last_step = start
                changed = True
            elif kind == "match" and isinstance(step, int):
                self._queue(ELO_SERIES, step, event.get("elo"), _time(event))
                bounds = [as_float(event.get(name)) for name in ("elo_low", "elo_high")]
                self.elo_interval.add(step, _time(event), *(math.nan if b is None else b for b in bounds))
                changed = True
            elif kind == "checkpoint_saved" and isinstance(step, int):
                self.markers.append(Marker(float(step), "checkpoint", _time(event)))
                changed = True
        self._flush()
        return changed

    def add_steps(self, steps: np.ndarray, values: dict[str, np.ndarray | tuple[np.ndarray, np.ndarray]],
                  times: np.ndarray | None = None) -> None:
        """Many step events at once (the history loader's fast path), as `add` would fold them. `values`:
        name -> values (all present) or (values, present mask)."""
        if steps.size == 0:
            return
        self._flush()
        previous = np.concatenate(([self.last_step], steps[:-1])) if self.last_step is not None else None
        backwards = np.flatnonzero(steps < previous) if previous is not None else np.flatnonzero(np.diff(steps) < 0) + 1
        self.markers += [Marker(float(steps[i]), "resume", None if times is None else float(times[i]))
                         for i in backwards]
        columns = {name: column if isinstance(column, tuple) else (column, None) for name, column in values.items()}
        self.steps.extend(steps.astype(np.float64), times, columns)
        self.last_step = int(steps[-1])

    def add_anomaly(self, step: object, time: float | None = None) -> None:
        if isinstance(step, int):
            self.markers.append(Marker(float(step), "anomaly", time))

    def _queue(self, name: str, step: int, raw: object, time: float) -> None:
        value = as_float(raw)
        if value is None:
            return  # absent (an older writer, or a figure this run does not have): nothing to draw
        steps, values, times = self._pending.setdefault(name, ([], [], []))
        steps.append(float(step))
        values.append(value)
        times.append(time)

    def _flush(self) -> None:
        if self._rows:
            matrix = np.array([[math.nan if v is None else v for v in values] for _s, _t, values in self._rows],
                              dtype=np.float64)
            present = np.array([[v is not None for v in values] for _s, _t, values in self._rows], dtype=bool)
            self.steps.extend([float(s) for s, _t, _v in self._rows], [t for _s, t, _v in self._rows],
                              {name: (matrix[:, i], present[:, i]) for i, name in enumerate(COLUMN_NAMES)})
            self._rows.clear()
        for name, (steps, values, times) in self._pending.items():
            self.series[name].extend(steps, values, times=times)
        self._pending.clear()

    def prepend(self, earlier: RunHistory, continues: bool) -> None:
        self.steps.prepend(earlier.steps, continues)
        for name, series in self.series.items():
            if isinstance(series, Series):
                series.prepend(earlier.series[name], continues)
        self.markers = earlier.markers + self.markers
        self.elo_interval.prepend(earlier.elo_interval)
        self.sessions += earlier.sessions

    def set_weight(self, weight: float) -> None:
        self.weight = weight
        self.steps.set_weight(weight)
        for series in self.series.values():
            if isinstance(series, Series):
                series.set_weight(weight)

    @property
    def nbytes(self) -> int:
        return self.steps.nbytes + sum(s.nbytes for s in self.series.values() if isinstance(s, Series))

    def points(self) -> int:
        return len(self.series["loss"])

    def nonfinite_anomalies(self, limit: int = 100) -> list[Anomaly]:
        """A `nonfinite_loss` anomaly for the first step of each streak of non-finite losses (as `status`
        reports a streak once), the latest `limit` of them: for the history read before the tail."""
        bad: dict[int, dict[str, str]] = {}
        for name in STEP_SERIES:
            column = self.steps.columns[name]
            rows = column.bad_at.view.astype(np.int64)
            first = np.concatenate(([True], np.diff(rows) != 1)) if rows.size else np.empty(0, dtype=bool)
            steps = self.steps.x.view[rows[first]].astype(np.int64).tolist()
            for step, sign in zip(steps, column.bad_sign.view[first].tolist()):
                bad.setdefault(step, {})[name] = {0: "nan", 1: "inf", -1: "-inf"}.get(int(sign), "nan")
        found = [nonfinite_loss({"kind": "step", "step": step, **values}) for step, values in sorted(bad.items())]
        return [a for a in found if a is not None][-limit:]


class Interval:
    """The Elo's 95% interval at each `match` (few points: plain lists). A bound stays +-inf where the
    score was 100% or 0% (the chart draws the band to its edge); NaN where the event lacks it."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.times: list[float] = []
        self.low: list[float] = []
        self.high: list[float] = []

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, time: float, low: float, high: float) -> None:
        self.steps.append(float(step))
        self.times.append(time)
        self.low.append(low)
        self.high.append(high)

    def band(self) -> Band:
        return Band(np.array(self.steps), np.array(self.times), np.array(self.low), np.array(self.high))

    def prepend(self, earlier: Interval) -> None:
        self.steps[:0], self.times[:0] = earlier.steps, earlier.times
        self.low[:0], self.high[:0] = earlier.low, earlier.high


def starts_a_new_run(first: dict) -> bool:
    """Does a file read again from the top (replaced or truncated) that begins with `first` hold a run
    of its own from its start? Yes for a `run_started` that is not a resume (--fresh, a new run, or the
    same run's file replaced whole): the curves start over from it. No otherwise (log rotation under a
    run: the new file begins mid-run, or with a resumed session's `run_started`): the curves go on."""
    return first.get("kind") == "run_started" and (bool(first.get("fresh")) or not first.get("resumed_from"))


ROTATED_SUFFIX = ".1"
"""logrotate's name for the file it rotated away (events.jsonl.1); a compressed one (.1.gz) is not read."""


def rotated_away(events_path: Path) -> Path | None:
    """events.jsonl.1 beside `events_path` when it holds the same run's earlier events, to be read before
    it (a monitor opened after a rotation then shows the whole curve); else None. Only when all of these
    hold: it is a regular file, not a symlink; events.jsonl does not hold the run whole from its start
    (`starts_a_new_run`); events.jsonl.1 begins with `run_started` naming this very directory (`run_dir`,
    an absolute path the trainer writes); and it began no later than events.jsonl. The two are taken to be
    disjoint, as logrotate makes them (copytruncate or create): nothing is deduplicated between them."""
    previous = events_path.with_name(events_path.name + ROTATED_SUFFIX)
    try:
        if not stat.S_ISREG(os.lstat(previous).st_mode):
            return None  # a symlink, a FIFO, a directory: not followed
    except OSError:
        return None  # none there (the usual case), or not readable
    current = first_event(events_path)
    if current is None or starts_a_new_run(current):
        return None
    head = first_event(previous)
    if head is None or head.get("kind") != "run_started" or not isinstance(head.get("run_dir"), str):
        return None
    try:
        same_run_dir = os.path.samefile(head["run_dir"], events_path.parent)
    except OSError:  # that directory is gone, or another machine's path: another run
        return None
    began, now = as_float(head.get("time")), as_float(current.get("time"))
    if not same_run_dir or began is None or now is None or began > now:
        return None
    return previous


class SeenEvents:
    """Which events a rotated events.jsonl repeats. The boundary is the latest event time read before the
    rotation (with the (kind, step) pairs read at that very time): after a rotation, events up to it are
    ones already folded (a replaced file holding the old events and new ones) and are dropped, until the
    first later one; from then on all pass. Time, not step, is the key because a resume makes steps go
    back while the trainer's event times only go forward. An event without a time falls back to its
    step: dropped while its step is not past the last one read."""

    def __init__(self) -> None:
        self.last_time: float | None = None
        self.last_step: int | None = None
        self._at_last: set[tuple[object, object]] = set()
        self._boundary: tuple[float | None, int | None, frozenset] | None = None

    def hold_back(self) -> None:
        """The file was rotated: drop what repeats events read so far."""
        if self.last_time is not None or self.last_step is not None:
            self._boundary = (self.last_time, self.last_step, frozenset(self._at_last))

    def unseen(self, events: list[dict]) -> list[dict]:
        kept = []
        for event in events:
            key = (event.get("kind"), event.get("step"))
            when, step = as_float(event.get("time")), event.get("step")
            if self._boundary is not None:
                last_time, last_step, at_last = self._boundary
                if when is not None and last_time is not None:
                    repeated = when < last_time or (when == last_time and key in at_last)
                else:
                    repeated = isinstance(step, int) and last_step is not None and step <= last_step
                if repeated:
                    continue
                self._boundary = None
            kept.append(event)
            if when is not None and (self.last_time is None or when >= self.last_time):
                if when != self.last_time:
                    self._at_last = set()
                self.last_time = when
                self._at_last.add(key)
            if isinstance(step, int):
                self.last_step = step
        return kept


# The trainer writes step events as compact JSON with these fields first, in this order; lines in that
# form are read with one regex pass over a chunk instead of json.loads per line (ten times faster on a
# two-million-step run). Any other form falls back to json.loads.
_NUMBER = rb'([^,}]*)'
"""Anything up to the next field (fast to match); numpy's parser then refuses what is not a number."""
_FAST_FIELDS = ("loss", "policy_loss", "value_loss", "grad_norm", "lr", "positions_per_second",
                "data_wait_seconds", "compute_seconds")
_FAST_STEP = re.compile(rb'"time":' + _NUMBER + rb',"kind":"step","step":(\d+)'
                        + b"".join(b',"' + name.encode() + b'":' + _NUMBER for name in _FAST_FIELDS) + rb'[,}]')
_OTHER_WANTED = re.compile(rb'"kind":"(?:run_started|eval|checkpoint_saved|match)"')


def _parse_lines(data: bytes) -> list[dict]:
    events = []
    for line in data.split(b"\n"):
        if not line.strip() or (b'"kind":"' in line and not any(needle in line for needle in _WANTED)):
            continue  # compact JSON of a kind the plot does not draw: not worth parsing
        try:
            event = loads_bounded(line)
        except ValueError:
            continue  # a malformed line (or one nested too deeply): EventReader counts those; the plot skips it
        if isinstance(event, dict):
            events.append(event)
    return events


def _add_steps(history: RunHistory, data: bytes) -> None:
    """Step lines (and lines the plot does not draw) in the trainer's own form, else parsed one by one."""
    found = _FAST_STEP.findall(data)
    if len(found) != data.count(b'"kind":"step"'):
        history.add(_parse_lines(data))
        return
    if found:
        # one C parse of every figure ("nan", "inf" and "-inf" as the trainer writes them, quoted or not)
        flat = b" ".join(itertools.chain.from_iterable(found)).replace(b'"', b"")
        width = len(found[0])
        try:
            numbers = np.fromstring(flat, sep=" ")
        except ValueError:  # something there is not a number (true, null, a typo): parse line by line
            numbers = np.empty(0)
        if numbers.size != len(found) * width:
            history.add(_parse_lines(data))
            return
        columns = numbers.reshape(-1, width).T
        figures = {name: columns[i + 2] for i, name in enumerate(_FAST_FIELDS)}
        wait, compute = figures.pop("data_wait_seconds"), figures.pop("compute_seconds")
        with np.errstate(divide="ignore", invalid="ignore"):
            total = wait + compute
            fraction = np.where(np.isfinite(total) & (total > 0), wait / total, np.nan)
        figures["data_wait_fraction"] = (fraction, np.isfinite(fraction))  # NaN here: not known, not bad
        history.add_steps(columns[1].astype(np.int64), figures, times=columns[0])


def _add_chunk(history: RunHistory, data: bytes) -> None:
    position = 0
    for match in _OTHER_WANTED.finditer(data):
        if match.start() < position:
            continue  # a second needle on a line already handled
        line_start = data.rfind(b"\n", 0, match.start()) + 1
        line_end = data.find(b"\n", match.end())
        line_end = len(data) if line_end < 0 else line_end + 1
        _add_steps(history, data[position:line_start])
        history.add(_parse_lines(data[line_start:line_end]))
        position = line_end
    _add_steps(history, data[position:])


def load_history(path: Path, end: int, weight: float,
                 progress: typing.Callable[[float], None] | None = None,
                 cancelled: typing.Callable[[], bool] = lambda: False) -> RunHistory | None:
    """Fold events.jsonl's bytes [0, end) into a RunHistory, chunk by chunk (never the whole file in
    memory, never a dict per event kept). Lines of kinds the plot does not draw are skipped unparsed.
    None if cancelled. A file that is no longer a regular file gives no history (the follower reports it)."""
    history = RunHistory(weight)
    offset = 0
    try:
        handle = open_regular(path)
    except OSError:
        return history
    with handle:
        carry = b""
        while offset < end:
            if cancelled():
                return None
            chunk = handle.read(min(CHUNK_BYTES, end - offset))
            if not chunk:
                break
            offset += len(chunk)
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            _add_chunk(history, data[:cut])
            history.read_to = offset - len(carry)
            if progress is not None:
                progress(offset / end if end else 1.0)
    return history
