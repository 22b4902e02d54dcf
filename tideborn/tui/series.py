"""Curves kept as compact numpy arrays (not Python dicts), so a run of millions of logged steps stays
small, with TensorBoard's debiased moving average maintained as points arrive. No textual here.

A series is a list of segments: a segment is a run of points whose steps never go backwards. A resume
(a new `run_started`, or a step lower than the last) opens a new segment; the average restarts there.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field

import numpy as np

_EMA_BLOCK = 32
BLOCK = 256
"""Points per block of the block extremes a long series keeps for fast decimation (tideborn.tui.decimate)."""


FLOAT32_MAX = float(np.finfo(np.float32).max)


def segment_starts(steps: np.ndarray, last_x: float | None, forced: bool) -> tuple[set[int], list[int]]:
    """Where the `steps` appended after `last_x` (None: nothing yet) begin new segments, and the cut points
    (0 and the end included): where the step goes backwards (a resume the events did not announce), and at 0
    when `forced`, when nothing came before, or when the first step is below the last one."""
    starts = {int(i) for i in np.flatnonzero(np.diff(steps) < 0) + 1}
    if forced or last_x is None or steps[0] < last_x:
        starts.add(0)
    return starts, sorted(starts | {0, steps.size})


class Growable:
    """A float array that grows by doubling (amortised O(1) appends; a view of the filled part). float32
    for figures shown to a few digits (learning rate, throughput): half the memory on a long run; values
    beyond float32's range are clipped to it rather than turned into infinities."""

    def __init__(self, capacity: int = 256, dtype: type = np.float64):
        self._data = np.empty(max(capacity, 16), dtype=dtype)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def view(self) -> np.ndarray:
        return self._data[: self._size]

    def extend(self, values: np.ndarray | list[float]) -> None:
        values = np.asarray(values, dtype=np.float64)
        if self._data.dtype == np.float32:
            values = np.clip(values, -FLOAT32_MAX, FLOAT32_MAX)  # NaN stays NaN
        need = self._size + values.size
        if need > self._data.size:
            grown = np.empty(max(need, self._data.size * 2), dtype=self._data.dtype)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size: need] = values
        self._size = need

    def truncate(self, size: int) -> None:
        self._size = min(self._size, max(size, 0))

    @property
    def nbytes(self) -> int:
        return self._data.nbytes


class BlockExtremes:
    """The NaN-ignoring min and max of each block of BLOCK consecutive values of a growing array."""

    def __init__(self) -> None:
        self.low = Growable(64)
        self.high = Growable(64)

    def update(self, values: np.ndarray, changed_from: int = 0) -> None:
        """`values` (the whole array) changed or grew from index `changed_from` on."""
        first = changed_from // BLOCK
        self.low.truncate(first)
        self.high.truncate(first)
        tail = values[first * BLOCK:]
        if tail.size == 0:
            return
        padded = np.full(-(-tail.size // BLOCK) * BLOCK, np.nan)
        padded[: tail.size] = tail
        rows = padded.reshape(-1, BLOCK)
        self.low.extend(np.fmin.reduce(rows, axis=1))
        self.high.extend(np.fmax.reduce(rows, axis=1))

    @property
    def nbytes(self) -> int:
        return self.low.nbytes + self.high.nbytes


def linear_recurrence(inputs: np.ndarray, factor: float, start: float) -> np.ndarray:
    """e[i] = factor * e[i-1] + inputs[i], e[-1] = start, vectorised: blocks of 32 are solved with one
    matrix product and the carries between blocks by the same recurrence one level up."""
    n = inputs.size
    if n == 0:
        return np.empty(0)
    blocks = -(-n // _EMA_BLOCK)
    padded = np.zeros(blocks * _EMA_BLOCK)
    padded[:n] = inputs
    lags = np.subtract.outer(np.arange(_EMA_BLOCK), np.arange(_EMA_BLOCK))
    with np.errstate(under="ignore"):
        kernel = np.where(lags >= 0, np.power(factor, np.maximum(lags, 0)), 0.0)
        carry_weights = np.power(factor, np.arange(1, _EMA_BLOCK + 1))
    within = padded.reshape(blocks, _EMA_BLOCK) @ kernel.T
    if blocks == 1:
        starts = np.array([start])
    else:
        ends = linear_recurrence(within[:-1, -1], factor ** _EMA_BLOCK, start)
        starts = np.concatenate(([start], ends))
    return (within + carry_weights[None, :] * starts[:, None]).reshape(-1)[:n]


@dataclass
class EmaState:
    last: float = 0.0
    count: int = 0


def ema_debiased(values: np.ndarray, weight: float, state: EmaState | None = None) -> tuple[np.ndarray, EmaState]:
    """TensorBoard's smoothing: last = weight * last + (1 - weight) * value over finite values, shown as
    last / (1 - weight ** count) so the start is not pulled towards zero. Non-finite values are NaN in
    the result and leave the average alone. `state` continues an earlier call."""
    state = state or EmaState()
    out = np.full(values.size, np.nan)
    finite = np.isfinite(values)
    kept = values[finite]
    if kept.size == 0:
        return out, state
    if weight <= 0:
        out[finite] = kept
        return out, EmaState(float(kept[-1]), state.count + kept.size)
    with np.errstate(over="ignore", invalid="ignore"):
        raw = linear_recurrence((1.0 - weight) * kept, weight, state.last)
        counts = state.count + np.arange(1, kept.size + 1)
        debias = -np.expm1(counts * math.log(weight))
        out[finite] = raw / debias
    return out, EmaState(float(raw[-1]), state.count + kept.size)


@dataclass
class Series:
    """One curve: steps, values (non-finite ones as NaN), smoothed values, where each segment starts,
    its non-finite points (for markers), and block extremes of values and smoothed values."""

    name: str
    weight: float = 0.9
    smoothed: bool = True
    """Drawn smoothed when the plot smooths (train curves); False: always raw (eval points)."""
    x: Growable = field(default_factory=Growable)
    t: Growable = field(default_factory=Growable)
    """Wall time of each point (when `extend` was given times; the plot's wall-time axis)."""
    y: Growable = field(default_factory=Growable)
    smooth: Growable = field(default_factory=Growable)
    segments: list[int] = field(default_factory=list)
    bad_x: Growable = field(default_factory=lambda: Growable(16))
    """Steps of non-finite values (drawn as markers, never dropped silently)."""
    bad_sign: Growable = field(default_factory=lambda: Growable(16))
    """0 for NaN, 1 for +inf, -1 for -inf."""
    y_blocks: BlockExtremes = field(default_factory=BlockExtremes)
    smooth_blocks: BlockExtremes = field(default_factory=BlockExtremes)
    _ema: EmaState = field(default_factory=EmaState)
    _break_next: bool = False

    def __len__(self) -> int:
        return len(self.x)

    @property
    def nonfinite(self) -> int:
        return len(self.bad_x)

    @property
    def nbytes(self) -> int:
        return (self.x.nbytes + self.y.nbytes + self.smooth.nbytes + self.bad_x.nbytes + self.bad_sign.nbytes
                + self.y_blocks.nbytes + self.smooth_blocks.nbytes)

    def last_step(self) -> float | None:
        return float(self.x.view[-1]) if len(self.x) else None

    def break_segment(self) -> None:
        """The next point starts a new segment (a new `run_started`)."""
        self._break_next = True

    def extend(self, steps: list[float] | np.ndarray, values: list[float] | np.ndarray,
               new_segment: bool = False, times: list[float] | np.ndarray | None = None) -> None:
        steps = np.asarray(steps, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        if times is not None:
            self.t.extend(times)
        if steps.size == 0:
            self._break_next = self._break_next or new_segment
            return
        starts, cuts = segment_starts(steps, self.x.view[-1] if self.segments else None,
                                      new_segment or self._break_next)
        self._break_next = False
        grown_from = len(self.x)
        for begin, end in zip(cuts, cuts[1:]):
            if begin in starts:
                self.segments.append(len(self.x))
                self._ema = EmaState()
            part = values[begin:end]
            smoothed, self._ema = ema_debiased(part, self.weight, self._ema)
            self.x.extend(steps[begin:end])
            bad = ~np.isfinite(part)
            if bad.any():
                self.bad_x.extend(steps[begin:end][bad])
                self.bad_sign.extend(np.nan_to_num(np.sign(part[bad]), nan=0.0))
                part = np.where(bad, np.nan, part)  # kept as markers; NaN is what decimation skips
            self.y.extend(part)
            self.smooth.extend(smoothed)
        self.y_blocks.update(self.y.view, grown_from)
        self.smooth_blocks.update(self.smooth.view, grown_from)

    def segment_bounds(self) -> list[tuple[int, int]]:
        ends = self.segments[1:] + [len(self.x)]
        return list(zip(self.segments, ends))

    def set_weight(self, weight: float) -> None:
        """Recompute the smoothed values with another weight."""
        self.weight = weight
        smoothed = np.empty(len(self.y))
        for begin, end in self.segment_bounds():
            smoothed[begin:end], self._ema = ema_debiased(self.y.view[begin:end], weight)
        self.smooth = Growable(len(smoothed))
        self.smooth.extend(smoothed)
        self.smooth_blocks = BlockExtremes()
        self.smooth_blocks.update(self.smooth.view)

    def prepend(self, earlier: Series, continues: bool) -> None:
        """Put an earlier part of the history (smoothed already, by the loader) in front of this one, the
        tail read first. `continues`: this series' first segment carries on the earlier part's last."""
        if len(earlier) == 0:
            return
        mine_x, mine_y, mine_t = self.x.view.copy(), self.y.view.copy(), self.t.view.copy()
        timed = mine_t.size == mine_x.size and len(earlier.t) == len(earlier)
        bounds = list(zip(self.segments, self.segments[1:] + [mine_x.size]))
        self.x, self.y, self.smooth, self.t = earlier.x, earlier.y, earlier.smooth, earlier.t
        self.segments, self._ema, self._break_next = list(earlier.segments), earlier._ema, False
        self.bad_x, self.bad_sign = earlier.bad_x, earlier.bad_sign
        self.y_blocks, self.smooth_blocks = earlier.y_blocks, earlier.smooth_blocks
        for number, (begin, end) in enumerate(bounds):
            self.extend(mine_x[begin:end], mine_y[begin:end], new_segment=number > 0 or not continues,
                        times=mine_t[begin:end] if timed else None)


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    dtype: type = np.float32
    """Values are drawn and read out to three or four digits: float32 halves a long run's memory (the
    steps and times stay float64; non-finite values are noted before they are stored)."""
    smoothed: bool = True


class StepTable:
    """The metrics of `step` events as columns over one shared step array and one wall-time array (not
    one step array per metric: seven curves of two million points would not fit in the memory budget).
    A metric an event lacks is NaN in its column and not counted as non-finite."""

    def __init__(self, specs: typing.Iterable[ColumnSpec], weight: float = 0.9):
        self.x = Growable()
        self.t = Growable()
        self.segments: list[int] = []
        self._break_next = False
        self.columns = {spec.name: Column(self, spec, weight) for spec in specs}

    def __len__(self) -> int:
        return len(self.x)

    def break_segment(self) -> None:
        self._break_next = True

    def segment_bounds(self) -> list[tuple[int, int]]:
        ends = self.segments[1:] + [len(self.x)]
        return list(zip(self.segments, ends))

    def extend(self, steps: np.ndarray | list[float], times: np.ndarray | list[float] | None,
               values: dict[str, tuple[np.ndarray, np.ndarray | None]], new_segment: bool = False) -> None:
        """Append rows. `values`: column name -> (values, present mask or None for all present); a column
        not named is absent in these rows. `times`: None for unknown (NaN)."""
        steps = np.asarray(steps, dtype=np.float64)
        if steps.size == 0:
            self._break_next = self._break_next or new_segment
            return
        times = np.full(steps.size, np.nan) if times is None else np.asarray(times, dtype=np.float64)
        starts, cuts = segment_starts(steps, self.x.view[-1] if self.segments else None,
                                      new_segment or self._break_next)
        self._break_next = False
        grown_from = len(self.x)
        absent = np.full(steps.size, np.nan)
        for begin, end in zip(cuts, cuts[1:]):
            if begin in starts:
                self.segments.append(len(self.x))
            self.x.extend(steps[begin:end])
            self.t.extend(times[begin:end])
            for name, column in self.columns.items():
                column_values, present = values.get(name, (absent, np.zeros(steps.size, dtype=bool)))
                column.append(steps[begin:end], np.asarray(column_values[begin:end], dtype=np.float64),
                              None if present is None else present[begin:end], begin in starts)
        for column in self.columns.values():
            column.update_blocks(grown_from)

    def rows(self, begin: int, end: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Rows [begin, end) as `extend` takes them: non-finite values as they came, absent ones masked."""
        return {name: column.raw(begin, end) for name, column in self.columns.items()}

    def prepend(self, earlier: StepTable, continues: bool) -> None:
        """As `Series.prepend`, for every column at once."""
        if len(earlier) == 0:
            return
        bounds = self.segment_bounds()
        mine = [(self.x.view[b:e].copy(), self.t.view[b:e].copy(), self.rows(b, e)) for b, e in bounds]
        self.x, self.t, self.segments, self._break_next = earlier.x, earlier.t, list(earlier.segments), False
        for name, column in self.columns.items():
            column.adopt(earlier.columns[name])
        for number, (steps, times, rows) in enumerate(mine):
            self.extend(steps, times, rows, new_segment=number > 0 or not continues)

    def set_weight(self, weight: float) -> None:
        for column in self.columns.values():
            column.set_weight(weight)

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + self.t.nbytes + sum(c.nbytes for c in self.columns.values())


class Column:
    """One metric of a StepTable, with the same reading interface as a Series (x, t, y, smooth, segments,
    block extremes, non-finite points), so the plot draws either."""

    def __init__(self, table: StepTable, spec: ColumnSpec, weight: float):
        self.table = table
        self.name = spec.name
        self.weight = weight
        self.smoothed = spec.smoothed
        self.dtype = spec.dtype
        self.y = Growable(dtype=spec.dtype)
        # the smoothed values are only drawn, never read out exactly: float32 is plenty
        self.smooth = Growable(dtype=np.float32) if spec.smoothed else self.y
        self.bad_x = Growable(16)
        self.bad_sign = Growable(16)
        self.bad_at = Growable(16)
        """Row of each non-finite value (to give it back as it came when the rows move)."""
        self.y_blocks = BlockExtremes()
        self.smooth_blocks = BlockExtremes() if spec.smoothed else self.y_blocks
        self.count = 0
        """Rows where the metric is present."""
        self._ema = EmaState()

    @property
    def x(self) -> Growable:
        return self.table.x

    @property
    def t(self) -> Growable:
        return self.table.t

    @property
    def segments(self) -> list[int]:
        return self.table.segments

    def segment_bounds(self) -> list[tuple[int, int]]:
        return self.table.segment_bounds()

    def __len__(self) -> int:
        return self.count

    @property
    def nonfinite(self) -> int:
        return len(self.bad_x)

    def last_step(self) -> float | None:
        return float(self.x.view[len(self.y) - 1]) if len(self.y) else None

    def append(self, steps: np.ndarray, values: np.ndarray, present: np.ndarray | None, new_segment: bool) -> None:
        if new_segment:
            self._ema = EmaState()
        finite = np.isfinite(values)
        bad = ~finite if present is None else present & ~finite
        if bad.any():
            self.bad_x.extend(steps[bad])
            self.bad_sign.extend(np.nan_to_num(np.sign(values[bad]), nan=0.0))
            self.bad_at.extend(len(self.y) + np.flatnonzero(bad))
        stored = np.where(finite, values, np.nan)
        self.count += int(values.size if present is None else present.sum())
        if self.smoothed:
            smoothed, self._ema = ema_debiased(stored, self.weight, self._ema)
            self.smooth.extend(smoothed)
        self.y.extend(stored)

    def update_blocks(self, grown_from: int) -> None:
        self.y_blocks.update(self.y.view, grown_from)
        if self.smoothed:
            self.smooth_blocks.update(self.smooth.view, grown_from)

    def raw(self, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        values = self.y.view[begin:end].astype(np.float64)
        present = ~np.isnan(values)
        at = self.bad_at.view.astype(np.int64)
        inside = (at >= begin) & (at < end)
        signs = self.bad_sign.view[inside]
        values[at[inside] - begin] = np.where(signs > 0, np.inf, np.where(signs < 0, -np.inf, np.nan))
        present[at[inside] - begin] = True
        return values, present

    def adopt(self, earlier: Column) -> None:
        """Take the earlier part's arrays (the table re-appends this column's own rows after)."""
        self.y, self.smooth, self._ema, self.count = earlier.y, earlier.smooth, earlier._ema, earlier.count
        self.bad_x, self.bad_sign, self.bad_at = earlier.bad_x, earlier.bad_sign, earlier.bad_at
        self.y_blocks, self.smooth_blocks = earlier.y_blocks, earlier.smooth_blocks

    def set_weight(self, weight: float) -> None:
        self.weight = weight
        if not self.smoothed:
            return
        smoothed = np.empty(len(self.y))
        for begin, end in self.segment_bounds():
            smoothed[begin:end], self._ema = ema_debiased(self.y.view[begin:end].astype(np.float64), weight)
        self.smooth = Growable(len(smoothed), dtype=np.float32)
        self.smooth.extend(smoothed)
        self.smooth_blocks = BlockExtremes()
        self.smooth_blocks.update(self.smooth.view)

    @property
    def nbytes(self) -> int:
        own = self.y.nbytes + self.bad_x.nbytes + self.bad_sign.nbytes + self.bad_at.nbytes + self.y_blocks.nbytes
        if self.smoothed:
            own += self.smooth.nbytes + self.smooth_blocks.nbytes
        return own
