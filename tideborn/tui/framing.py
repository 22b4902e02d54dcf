"""The comparison's default x range: where one run is far longer than the others, the view ends where they
end, so that short runs beside a long one are readable rather than squashed into its first few percent (the
long run is cut there, and the chart says so). No textual here."""

from __future__ import annotations

from tideborn.tui.plotting import format_x

CUT_RATIO = 4.0
"""The default view is cut only where the longest run spans more than this many times what the others span
together: runs of similar lengths are shown whole, as they read well that way."""


def framed_range(extents: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The x range the default view shows for runs of these extents: that of all but the longest, where
    the longest spans more than CUT_RATIO times it, and again among those (runs of 60, 1,500 and 7,000 steps
    show the first 60); None (show all) where no run is cut, and for fewer than two runs.

    The others' range, not the second-longest run's end alone: by step every run starts near step 0, so
    the two are the same; by wall time runs that ran at different times are not cut for that alone, as
    their durations, not their distance, decide. A cut never leaves the longest run out of view: by wall
    time, one that ran wholly before or after the others is shown whole beside them."""
    kept, shown = list(extents), None
    while len(kept) >= 2:
        longest = max(range(len(kept)), key=lambda i: kept[i][1] - kept[i][0])
        others = [extent for i, extent in enumerate(kept) if i != longest]
        lo, hi = min(lo for lo, _hi in others), max(hi for _lo, hi in others)
        long_lo, long_hi = kept[longest]
        if long_hi - long_lo <= CUT_RATIO * (hi - lo) or long_hi < lo or long_lo > hi:
            break
        # the others a single point each, at one x: room around it, as x_range gives
        shown, kept = ((lo - 1, hi + 1) if hi <= lo else (lo, hi)), others
    return shown


def cut_label(shown: tuple[float, float], full_end: float, wall_time: bool) -> str:
    """What the chart's legend says of a cut view: what it shows, where the data ends, and the key for all."""
    width = shown[1] - shown[0]
    return (f"cut {format_x(shown[0], width, wall_time)}-{format_x(shown[1], width, wall_time)}"
            f" of {format_x(full_end, full_end - shown[0], wall_time)}, 0: all")
