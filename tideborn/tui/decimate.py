"""Min/max decimation: a curve of any length reduced to one (min, max, first, last) per plot column, so
that a spike is never hidden. No textual here.

A long series also keeps the min and max of every block of BLOCK points (`BlockExtremes`, updated as
points arrive); a column that covers whole blocks reads those instead of the points, so drawing two
million points touches about (columns x 2 x BLOCK + points / BLOCK) values, not two million.
Non-finite values are stored as NaN and ignored (`fmin`/`fmax`); the plot marks them separately.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tideborn.tui.series import BLOCK, BlockExtremes


@dataclass
class Columns:
    """The non-empty columns of a decimated segment and each one's min, max, first and last value."""

    index: np.ndarray
    low: np.ndarray
    high: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @staticmethod
    def empty() -> Columns:
        e = np.empty(0)
        return Columns(np.empty(0, dtype=np.int64), e, e, e, e)

    def __len__(self) -> int:
        return int(self.index.size)


def _gather(values: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            high_values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """min and max of values[starts[i]:ends[i]] for each i (NaN where empty or all NaN), reading only
    those ranges. With `high_values`, the max is of those instead (block lows and highs: one index)."""
    lengths = np.maximum(ends - starts, 0)
    low = np.full(starts.size, np.nan)
    high = np.full(starts.size, np.nan)
    keep = lengths > 0
    if not keep.any():
        return low, high
    starts, lengths = starts[keep], lengths[keep]
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    index = np.repeat(starts - offsets, lengths) + np.arange(lengths.sum())
    picked = values[index]
    low[keep] = np.fmin.reduceat(picked, offsets)
    high[keep] = np.fmax.reduceat(picked if high_values is None else high_values[index], offsets)
    return low, high


def column_bounds(x: np.ndarray, x_lo: float, x_hi: float, columns: int) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """For sorted x: each non-empty column's number and its [start, end) indices into x."""
    i0, i1 = int(np.searchsorted(x, x_lo, "left")), int(np.searchsorted(x, x_hi, "right"))
    if i1 <= i0 or columns <= 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    span = x_hi - x_lo
    if span <= 0:
        return np.array([columns // 2]), np.array([i0]), np.array([i1])
    edges = x_lo + span * (np.arange(1, columns) / columns)
    starts = np.concatenate(([i0], np.searchsorted(x[i0:i1], edges, "left") + i0))
    ends = np.concatenate((starts[1:], [i1]))
    full = ends > starts
    return np.flatnonzero(full), starts[full], ends[full]


def decimate(x: np.ndarray, y: np.ndarray, x_lo: float, x_hi: float, columns: int,
             blocks: BlockExtremes | None = None, base: int = 0,
             bounds: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Columns:
    """Bucket the points with x in [x_lo, x_hi] into `columns` equal x ranges (x sorted ascending).
    `blocks`: the block extremes of the whole array `x` and `y` are a part of, starting at index `base`.
    `bounds`: `column_bounds` of these arguments, when known already (curves sharing one step array)."""
    index, starts, ends = column_bounds(x, x_lo, x_hi, columns) if bounds is None else bounds
    if index.size == 0:
        return Columns.empty()
    if blocks is None or len(blocks.low) == 0:
        low, high = _gather(y, starts, ends)
    else:
        g_start, g_end = starts + base, ends + base
        first_block, end_block = -(-g_start // BLOCK), g_end // BLOCK
        covered = end_block > first_block
        head_end = np.where(covered, first_block * BLOCK, g_end) - base
        tail_start = np.where(covered, end_block * BLOCK, g_end) - base
        n = starts.size  # the points before and after the whole blocks, in one pass
        edge_low, edge_high = _gather(y, np.concatenate((starts, tail_start)), np.concatenate((head_end, ends)))
        block_low, block_high = _gather(blocks.low.view, np.where(covered, first_block, 0),
                                        np.where(covered, end_block, 0), blocks.high.view)
        with np.errstate(invalid="ignore"):
            low = np.fmin(np.fmin(edge_low[:n], edge_low[n:]), block_low)
            high = np.fmax(np.fmax(edge_high[:n], edge_high[n:]), block_high)
    drawn = ~np.isnan(low)  # a column of nothing but non-finite values draws nothing (its markers do)
    first, last = y[starts], y[ends - 1]
    first = np.where(np.isnan(first), low, first)
    last = np.where(np.isnan(last), high, last)
    return Columns(index[drawn], low[drawn], high[drawn], first[drawn], last[drawn])
