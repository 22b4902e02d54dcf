"""Curves kept as compact numpy arrays (not Python dicts), so a run of millions of logged steps stays
small, with TensorBoard's debiased moving average maintained as points arrive. No textual here.

A series is a list of segments: a segment is a run of points whose steps never go backwards. A resume
(a new `run_started`, or a step lower than the last) opens a new segment; the average restarts there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

_EMA_BLOCK = 32
BLOCK = 256
"""Points per block of the block extremes a long series keeps for fast decimation (tui.decimate)."""


class Growable:
    """A float64 array that grows by doubling (amortised O(1) appends; a view of the filled part)."""

    def __init__(self, capacity: int = 256):
        self._data = np.empty(max(capacity, 16), dtype=np.float64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def view(self) -> np.ndarray:
        return self._data[: self._size]

    def extend(self, values: np.ndarray | list[float]) -> None:
        values = np.asarray(values, dtype=np.float64)
        need = self._size + values.size
        if need > self._data.size:
            grown = np.empty(max(need, self._data.size * 2), dtype=np.float64)
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
    x: Growable = field(default_factory=Growable)
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
               new_segment: bool = False) -> None:
        steps = np.asarray(steps, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        if steps.size == 0:
            self._break_next = self._break_next or new_segment
            return
        # A new segment also where the step goes backwards (a resume the events did not announce).
        starts = {int(i) for i in np.flatnonzero(np.diff(steps) < 0) + 1}
        if new_segment or self._break_next or not self.segments or steps[0] < self.x.view[-1]:
            starts.add(0)
        self._break_next = False
        grown_from = len(self.x)
        cuts = sorted(starts | {0, steps.size})
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
        mine_x, mine_y = self.x.view.copy(), self.y.view.copy()
        bounds = list(zip(self.segments, self.segments[1:] + [mine_x.size]))
        self.x, self.y, self.smooth = earlier.x, earlier.y, earlier.smooth
        self.segments, self._ema, self._break_next = list(earlier.segments), earlier._ema, False
        self.bad_x, self.bad_sign = earlier.bad_x, earlier.bad_sign
        self.y_blocks, self.smooth_blocks = earlier.y_blocks, earlier.smooth_blocks
        for number, (begin, end) in enumerate(bounds):
            self.extend(mine_x[begin:end], mine_y[begin:end], new_segment=number > 0 or not continues)
