"""The comparison's default x range: where one run is far longer than the others, the view ends where they
end, so that short runs beside a long one are readable rather than squashed into its first few percent (the
long run is cut there, and the chart says so). No textual here."""

from __future__ import annotations

from tideborn.tui.plotting import format_x

CUT_RATIO = 4.0
"""The default view is cut only where some run spans more than this many times the shortest: runs of similar
lengths are shown whole, as they read well that way."""


def framed_range(extents: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The x range the default view shows for runs of these extents: that of the runs no longer than
    CUT_RATIO times the shortest, the longer ones cut there; None (show all) where no run is that long, and
    for fewer than two runs. So the shortest run fills at least a quarter of the axis, whatever the others'
    lengths (60 steps beside 1,500 and 1,600, or beside 1,500 and 7,000: the first 60 shown).

    By spans, not by where runs end: by step every run starts near step 0, so the two are the same; by wall
    time runs that ran at different times are not cut for that alone, as their durations, not their
    distance, decide. A run of one point (no span) is shown, and no measure of the others. A cut never leaves
    a run out of view: by wall time, where a long run ran wholly before or after the others, all are shown."""
    if len(extents) < 2:
        return None
    spans = [hi - lo for lo, hi in extents]
    lengths = [span for span in spans if span > 0]
    if not lengths:
        return None
    limit = CUT_RATIO * min(lengths)
    shown = [extent for extent, span in zip(extents, spans) if span <= limit]
    cut = [extent for extent, span in zip(extents, spans) if span > limit]
    if not cut:
        return None
    lo, hi = min(lo for lo, _hi in shown), max(hi for _lo, hi in shown)
    if any(cut_hi < lo or cut_lo > hi for cut_lo, cut_hi in cut):
        return None
    return (lo - 1, hi + 1) if hi <= lo else (lo, hi)  # the shown runs a single point each: room around it


def cut_label(shown: tuple[float, float], full_end: float, wall_time: bool) -> str:
    """What the chart's legend says of a cut view: what it shows, where the data ends, and the key for all."""
    width = shown[1] - shown[0]
    return (f"cut {format_x(shown[0], width, wall_time)}-{format_x(shown[1], width, wall_time)}"
            f" of {format_x(full_end, full_end - shown[0], wall_time)}, 0: all")
