"""Drawing curves into terminal cells: per-column min/max decimation, linear / log / symmetric-log
scales, and a braille (2x4 dots a cell) or ASCII (one glyph a cell) canvas. No textual here: the
`LossPlot` widget calls `render_plot` and shows the `rich.text.Text` it returns.

Why min/max: a column of the plot stands for many steps; drawing the span from the lowest to the
highest value in it (and joining it to its neighbours) keeps every spike visible however many points
there are, at the cost of two `reduceat` passes over the visible part of each series.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from rich.text import Text

from tideborn.humanize import compact
from tideborn.tui.decimate import Columns, column_bounds, decimate
from tideborn.tui.series import Series

BRAILLE_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.uint16)
Y_LABEL_WIDTH = 9
POINT_GLYPH = "●"
"""A sparse curve's points (eval, match): a braille dot is too small to find on a line; in ASCII mode every
cell is a glyph already."""
BAND_SHADE = "dim"
MARKER_GLYPHS = {  # kind: (unicode, ascii, style); a later kind wins a shared column
    "checkpoint": ("┼", "+", "cyan"),
    "resume": ("◀", "<", "bold magenta"),
    "anomaly": ("!", "!", "bold red"),
}


@dataclass(frozen=True)
class Band:
    """An interval drawn as a shaded band behind a curve (the Elo's 95% interval): per point its step,
    wall time, low and high bound (+-inf: to the chart's edge; NaN: no band there)."""

    x: np.ndarray
    t: np.ndarray
    low: np.ndarray
    high: np.ndarray


@dataclass(frozen=True)
class Curve:
    series: Series
    label: str
    style: str
    glyph: str
    """Drawn with this character in ASCII mode (where colour may be missing)."""
    points: bool = False
    """Mark each point with POINT_GLYPH (sparse eval and match points), where few enough are in view."""
    band: Band | None = None


@dataclass(frozen=True)
class Marker:
    step: float
    kind: str
    """checkpoint, resume or anomaly."""
    time: float | None = None
    """Wall time, for the wall-time axis (None: not drawn there)."""


@dataclass(frozen=True)
class PlotOptions:
    smooth: bool = True
    """Smooth the curves that take it (train curves; eval points never are)."""
    log: bool = False
    window: int | None = None
    """Show the last `window` steps; None: everything."""
    ascii: bool = False
    colour: bool = True
    x_range: tuple[float, float] | None = None
    """The x range shown (zoom and pan, or a range shared by several charts); None: from the data and
    `window`."""
    wall_time: bool = False
    """x is the events' wall time (seconds since the epoch) instead of the step."""
    cursor: float | None = None
    """An x where each curve's value is read out in the legend, marked by a vertical line."""
    view_label: str | None = None
    """What the legend says of the x range (a zoom); None: "all" or "last N"."""


@dataclass(frozen=True)
class Chart:
    """One chart of a grid: a title and its curves, drawn with a y axis of its own."""

    title: str
    curves: list[Curve]


def x_values(series: Series, wall_time: bool) -> np.ndarray | None:
    """The x of each point: its step, or its wall time (None where the series has no times)."""
    if not wall_time:
        return series.x.view
    return series.t.view if len(series.t) == len(series.x) else None


def smoothed(curve: Curve, options: PlotOptions) -> bool:
    """Is this curve drawn smoothed? Only train curves, and only while smoothing is on."""
    return options.smooth and getattr(curve.series, "smoothed", True) and curve.series.weight > 0


@dataclass(frozen=True)
class YScale:
    """Maps values to [0, 1]: linear, log10 (all values > 0), or symmetric log (some values <= 0:
    sign(v) * log10(1 + |v| / c), linear within about c of zero)."""

    kind: str
    lo: float
    hi: float
    threshold: float = 1.0

    @staticmethod
    def fit(lows: list[np.ndarray], highs: list[np.ndarray], log: bool) -> YScale:
        lo_values = np.concatenate(lows) if lows else np.empty(0)
        hi_values = np.concatenate(highs) if highs else np.empty(0)
        if lo_values.size == 0:
            return YScale("linear", 0.0, 1.0)
        vmin, vmax = float(lo_values.min()), float(hi_values.max())
        kind, threshold = "linear", 1.0
        if log:
            if vmin > 0:
                kind = "log"
            else:
                kind = "symlog"
                magnitudes = np.abs(np.concatenate((lo_values, hi_values)))
                nonzero = magnitudes[magnitudes > 0]
                biggest = float(nonzero.max()) if nonzero.size else 1.0
                threshold = max(float(nonzero.min()) if nonzero.size else 1.0, biggest * 1e-6)
        scale = YScale(kind, 0.0, 1.0, threshold)
        lo, hi = scale.forward(np.array([vmin]))[0], scale.forward(np.array([vmax]))[0]
        if not hi > lo:  # a constant series: give it some room, centred
            pad = abs(lo) * 0.05 if lo != 0 else 1.0
            lo, hi = lo - pad, hi + pad
        return YScale(kind, float(lo), float(hi), threshold)

    def forward(self, values: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.kind == "log":
                return np.log10(values)
            if self.kind == "symlog":
                return np.sign(values) * np.log10(1.0 + np.abs(values) / self.threshold)
        return values

    def inverse(self, t: float) -> float:
        if self.kind == "log":
            return 10.0 ** t if t < 308 else math.inf
        if self.kind == "symlog":
            return math.copysign(self.threshold * (10.0 ** min(abs(t), 308) - 1.0), t)
        return t

    def fraction(self, values: np.ndarray) -> np.ndarray:
        """Where transformed values fall in [lo, hi], halved first so huge ranges do not overflow."""
        t = self.forward(values)
        with np.errstate(over="ignore", invalid="ignore"):
            return (t * 0.5 - self.lo * 0.5) / (self.hi * 0.5 - self.lo * 0.5)

    def value_at(self, fraction: float) -> float:
        return self.inverse(self.lo * (1.0 - fraction) + self.hi * fraction)


def column_spans(cols: Columns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a decimated segment in dot-row coordinates (rows: low, high, first, last stacked), the span of
    dot rows to fill in every dot column from its first to its last, joining neighbours by straight lines
    across empty columns. Returns (columns, top row, bottom row)."""
    low, high, first, last = rows
    cs = cols.index
    all_c = np.arange(cs[0], cs[-1] + 1)
    k = np.searchsorted(cs, all_c, "right") - 1
    nxt = np.minimum(k + 1, cs.size - 1)
    gap = np.maximum(cs[nxt] - cs[k], 1)
    line = last[k] + (first[nxt] - last[k]) * ((all_c - cs[k]) / gap)
    incoming = np.concatenate(([first[0]], line[:-1]))
    is_data = cs[k] == all_c
    lo = np.where(is_data, np.minimum(np.minimum(low[k], high[k]), incoming), np.minimum(incoming, line))
    hi = np.where(is_data, np.maximum(np.maximum(low[k], high[k]), incoming), np.maximum(incoming, line))
    return all_c, lo, hi


@dataclass
class Canvas:
    """Cells of `width` x `height`; each layer sets dots and takes the colour of the cells it touches."""

    width: int
    height: int
    braille: bool
    bits: np.ndarray = field(init=False)
    owner: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.bits = np.zeros((self.height, self.width), dtype=np.uint16)
        self.owner = np.full((self.height, self.width), -1, dtype=np.int16)

    @property
    def dot_width(self) -> int:
        return self.width * 2 if self.braille else self.width

    @property
    def dot_height(self) -> int:
        return self.height * 4 if self.braille else self.height

    def fill(self, columns: np.ndarray, top: np.ndarray, bottom: np.ndarray, layer: int, shade: bool = False) -> None:
        """Set dots rows top..bottom (0 is the top) in each dot column; `shade`: every other dot, a checker
        (a band behind a curve, which stays solid over it)."""
        dh, dw = self.dot_height, self.dot_width
        keep = (columns >= 0) & (columns < dw)
        columns, top, bottom = columns[keep], np.clip(top[keep], 0, dh - 1), np.clip(bottom[keep], 0, dh - 1)
        if columns.size == 0:
            return
        mask = np.zeros((dh, dw), dtype=bool)
        rows = np.arange(dh)[:, None]
        mask[:, columns] = (rows >= top[None, :]) & (rows <= bottom[None, :])
        if shade and self.braille:
            mask &= (rows + np.arange(dw)[None, :]) % 2 == 0
        self._merge(mask, layer)

    def _merge(self, mask: np.ndarray, layer: int) -> None:
        if self.braille:
            bits = np.zeros((self.height, self.width), dtype=np.uint16)
            for row in range(4):
                for column in range(2):
                    bits |= mask[row::4, column::2].astype(np.uint16) * np.uint16(BRAILLE_BITS[row, column])
        else:
            bits = mask.astype(np.uint16)
        self.bits |= bits
        self.owner[bits > 0] = layer

    def rows(self, styles: list[str], glyphs: list[str]) -> list[Text]:
        lines = []
        for y in range(self.height):
            owner = self.owner[y]
            if self.braille:
                chars = [chr(0x2800 + int(b)) if b else " " for b in self.bits[y]]
            else:
                chars = [glyphs[o] if o >= 0 else " " for o in owner]
            line = Text("".join(chars), no_wrap=True, overflow="crop")
            cuts = np.flatnonzero(np.diff(owner)) + 1
            for begin, end in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [self.width]))):
                o = int(owner[begin])
                if o >= 0 and styles[o]:
                    line.stylize(styles[o], int(begin), int(end))
            lines.append(line)
        return lines


def x_range(curves: list[Curve], window: int | None, wall_time: bool = False) -> tuple[float, float] | None:
    lows, highs = [], []
    for curve in curves:
        s = curve.series
        xs = x_values(s, wall_time)
        if xs is None:
            continue
        for begin, end in s.segment_bounds():
            if end > begin:
                part = xs[begin:end]
                if wall_time:
                    part = part[np.isfinite(part)]
                    if part.size == 0:
                        continue
                lows.append(part[0])
                highs.append(part[-1])
        if s.nonfinite and not wall_time:
            lows.append(float(s.bad_x.view.min()))
            highs.append(float(s.bad_x.view.max()))
    if not lows:
        return None
    lo, hi = float(min(lows)), float(max(highs))
    if window is not None and not wall_time:
        lo = max(lo, hi - window)
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    return lo, hi


def format_value(value: float) -> str:
    return compact(value)  # the axis labels and legends read as every other figure of the monitor


def format_step(step: float) -> str:
    step = round(step)
    if abs(step) < 10_000:
        return str(step)
    if abs(step) < 1_000_000:
        return f"{step / 1000:.1f}".rstrip("0").rstrip(".") + "k"
    return f"{step / 1_000_000:.2f}".rstrip("0").rstrip(".") + "M"


def render_plot(curves: list[Curve], markers: list[Marker], options: PlotOptions, width: int,
                height: int, title: str = "") -> Text:
    """The whole plot: a legend line, the canvas with y labels, the x axis with its markers, x labels."""
    return Text("\n").join(plot_lines(curves, markers, options, width, height, title))


def plot_lines(curves: list[Curve], markers: list[Marker], options: PlotOptions, width: int,
               height: int, title: str = "", bounds_cache: dict | None = None) -> list[Text]:
    """`render_plot`'s lines (at most `height`). `bounds_cache`: column bounds already found for a step
    array (the step metrics share one), kept across the charts of a grid."""
    bounds_cache = {} if bounds_cache is None else bounds_cache
    legend = _legend(curves, options, width, title)
    if height < 5 or width < Y_LABEL_WIDTH + 8:
        return [legend]
    plot_w, plot_h = width - Y_LABEL_WIDTH, height - 3
    span = options.x_range or x_range(curves, options.window, options.wall_time)
    if span is None or not curves:
        message = "no step events yet" if span is None else "nothing logged yet"
        return [legend, *(Text("") for _ in range(plot_h // 2)), Text(message.center(width).rstrip(), no_wrap=True)]
    x_lo, x_hi = span
    if not x_hi > x_lo:  # one step shown (or a range given empty): room around it, as x_range gives
        x_lo, x_hi = x_lo - 1, x_lo + 1
    canvas = Canvas(plot_w, plot_h, braille=not options.ascii)
    layers: list[tuple[Curve, bool, list[tuple[Columns, np.ndarray]]]] = []
    lows, highs = [], []
    for curve in curves:
        s = curve.series
        xs = x_values(s, options.wall_time)
        if xs is None:
            continue
        parts = [(s.y.view, s.y_blocks, True)]
        if smoothed(curve, options):
            parts = [(s.y.view, s.y_blocks, False), (s.smooth.view, s.smooth_blocks, True)]
        for values, blocks, bold in parts:
            decimated = []
            for begin, end in s.segment_bounds():
                x = xs[begin:end]
                key = (id(s.t if options.wall_time else s.x), begin, end, x_lo, x_hi, canvas.dot_width)
                if key not in bounds_cache:
                    bounds_cache[key] = column_bounds(x, x_lo, x_hi, canvas.dot_width)
                cols = decimate(x, values[begin:end], x_lo, x_hi, canvas.dot_width, blocks, base=begin,
                                bounds=bounds_cache[key])
                if len(cols):
                    decimated.append((cols, x))
                    lows.append(cols.low)
                    highs.append(cols.high)
            layers.append((curve, bold, decimated))
    bands = [curve for curve in curves if curve.band is not None and len(curve.band.x)]
    for curve in bands:  # the interval counts for the y range where it is finite and in view
        band = curve.band
        xs = band.t if options.wall_time else band.x
        inside = (xs >= x_lo) & (xs <= x_hi)
        for bound in (band.low[inside], band.high[inside]):
            finite = bound[np.isfinite(bound)]
            lows.append(finite)
            highs.append(finite)
    scale = YScale.fit(lows, highs, options.log)
    styles, glyphs = [], []
    for curve in bands:  # first, so that curves are drawn over their band
        styles.append(f"{BAND_SHADE} {curve.style}" if options.colour else BAND_SHADE)
        glyphs.append(":")
        columns, top, bottom = band_spans(curve.band, options.wall_time, x_lo, x_hi, canvas, scale)
        canvas.fill(columns, top, bottom, len(styles) - 1, shade=True)
    for curve, bold, decimated in layers:
        styles.append((curve.style if bold else f"dim {curve.style}") if options.colour else ("" if bold else "dim"))
        glyphs.append(curve.glyph if bold else ".")
        for cols, _x in decimated:
            stacked = np.stack((cols.low, cols.high, cols.first, cols.last))
            rows = (1.0 - scale.fraction(stacked)) * (canvas.dot_height - 1)
            rows = np.nan_to_num(rows, nan=0.0, posinf=canvas.dot_height - 1, neginf=0.0)
            all_c, top, bottom = column_spans(cols, rows)
            canvas.fill(all_c, np.rint(top).astype(np.int64), np.rint(bottom).astype(np.int64), len(styles) - 1)
    lines = canvas.rows(styles, glyphs)
    if not options.ascii:
        _point_markers(lines, curves, x_lo, x_hi, canvas, scale, options)
    if not options.wall_time:
        _nonfinite_markers(lines, curves, x_lo, x_hi, plot_w, options)
    cursor_column = _cursor_column(options.cursor, x_lo, x_hi, plot_w)
    if cursor_column is not None:
        _cursor_line(lines, cursor_column, options)
    labelled = _with_y_labels(lines, scale, options)
    axis, ticks = _x_axis(markers, x_lo, x_hi, plot_w, options, cursor_column)
    return [legend, *labelled, axis, ticks]


def band_spans(band: Band, wall_time: bool, x_lo: float, x_hi: float, canvas: Canvas,
               scale: YScale) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dot columns of an interval band, each with its top and bottom dot row: the bounds joined by
    straight lines from point to point (where x goes forward), an infinite bound at the chart's edge."""
    xs = band.t if wall_time else band.x
    dot_w, dot_h = canvas.dot_width, canvas.dot_height
    usable = np.flatnonzero(np.isfinite(xs) & ~np.isnan(band.low) & ~np.isnan(band.high))
    if usable.size == 0 or not x_hi > x_lo:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    column = (xs[usable] - x_lo) / (x_hi - x_lo) * (dot_w - 1)

    def rows(values: np.ndarray) -> np.ndarray:
        fraction = np.nan_to_num(scale.fraction(values), nan=0.5, posinf=1.0, neginf=0.0)
        return (1.0 - np.clip(fraction, 0.0, 1.0)) * (dot_h - 1)

    top, bottom = rows(band.high[usable]), rows(band.low[usable])
    out_c, out_t, out_b = [np.rint(column)], [top], [bottom]
    for a in range(usable.size - 1):
        left, right = column[a], column[a + 1]
        if not right > left:
            continue  # a resume: the band starts again
        between = np.arange(max(math.ceil(left), 0), min(math.floor(right), dot_w - 1) + 1)
        if between.size == 0:
            continue
        share = (between - left) / (right - left)
        out_c.append(between.astype(np.float64))
        out_t.append(top[a] + (top[a + 1] - top[a]) * share)
        out_b.append(bottom[a] + (bottom[a + 1] - bottom[a]) * share)
    columns, tops, bottoms = (np.concatenate(parts) for parts in (out_c, out_t, out_b))
    return (columns.astype(np.int64), np.rint(np.minimum(tops, bottoms)).astype(np.int64),
            np.rint(np.maximum(tops, bottoms)).astype(np.int64))


def _point_markers(lines: list[Text], curves: list[Curve], x_lo: float, x_hi: float, canvas: Canvas,
                   scale: YScale, options: PlotOptions) -> None:
    """POINT_GLYPH on each point of a sparse curve (eval, match), in its colour, where at most one point in
    two cells is in view (more would draw a solid row of them)."""
    plot_w = canvas.width
    for curve in curves:
        if not curve.points:
            continue
        xs = x_values(curve.series, options.wall_time)
        if xs is None:
            continue
        ys = curve.series.y.view
        inside = (xs >= x_lo) & (xs <= x_hi) & np.isfinite(ys) & np.isfinite(xs)
        if not inside.any() or int(inside.sum()) * 2 > plot_w:
            continue
        columns = np.minimum(((xs[inside] - x_lo) / (x_hi - x_lo) * plot_w).astype(np.int64), plot_w - 1)
        fraction = np.clip(np.nan_to_num(scale.fraction(ys[inside]), nan=0.5), 0.0, 1.0)
        cell_rows = (np.rint((1.0 - fraction) * (canvas.dot_height - 1)).astype(np.int64) * canvas.height
                     // canvas.dot_height)
        style = f"bold {curve.style}" if options.colour else "bold"
        for row, column in zip(cell_rows.tolist(), columns.tolist()):
            line = lines[row]
            lines[row] = Text.assemble(line[:column], Text(POINT_GLYPH, style=style), line[column + 1:],
                                       no_wrap=True, overflow="crop")


def grid_shape(count: int, width: int, height: int, min_width: int = 40, min_height: int = 9) -> tuple[int, int] | None:
    """Columns and rows for `count` charts of at least min_width x min_height cells, or None if they do not
    fit (then show one at a time). Prefers the shape whose charts are closest to 3:1 cells (about square
    in dots)."""
    best = None
    for columns in range(1, count + 1):
        rows = -(-count // columns)
        if columns * rows - count >= columns:  # a whole empty row
            continue
        w, h = (width - (columns - 1)) // columns, height // rows
        if w < min_width or h < min_height:
            continue
        badness = abs(math.log((w / h) / 3.0)) + (columns * rows - count)  # empty places cost
        if best is None or badness < best[0]:
            best = (badness, columns, rows)
    return None if best is None else (best[1], best[2])


def shared_x_range(charts: list[Chart], options: PlotOptions) -> tuple[float, float] | None:
    """One x range for several charts, so that a step is at the same column in each."""
    if options.x_range is not None:
        return options.x_range
    return x_range([c for chart in charts for c in chart.curves], options.window, options.wall_time)


def chart_inputs(chart: Chart) -> tuple:
    """What a chart's drawing takes from its curves, compared by identity and length: points appended, a history
    prepended (new arrays), a new smoothing weight (a new smoothed array) all change it. The arrays themselves
    are in it, not their ids, so that a freed array's id reused by a new one cannot pass for it."""
    parts: list = [chart.title]
    for curve in chart.curves:
        s = curve.series
        parts.append((id(s), s.y, s.smooth, s.t, len(s.x), len(s.y), len(s.t), s.weight, s.nonfinite,
                      len(s.segments), curve.label, curve.style, curve.glyph))
    return tuple(parts)


@dataclass
class GridCell:
    """One chart's place in a drawing (cells, from the widget's top left) and its lines."""

    chart: Chart
    x: int
    y: int
    width: int
    height: int
    lines: list[Text]


class ChartCache:
    """Each chart's lines with what they were drawn from: a chart whose data, x range, size and view are as
    they were is not drawn again (following a run, the charts without new points cost nothing)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple, list[Text]]] = {}
        self.draws: Counter[str] = Counter()
        """How often each chart (by title) was drawn: what tests count."""

    def lines(self, chart: Chart, markers: list[Marker], options: PlotOptions, width: int, height: int,
              title: str, bounds_cache: dict) -> list[Text]:
        key = (chart_inputs(chart), tuple(markers), options, width, height, title)
        entry = self._entries.get(chart.title)
        if entry is not None and entry[0] == key:
            return entry[1]
        lines = plot_lines(chart.curves, markers, options, width, height, title, bounds_cache)
        self._entries[chart.title] = (key, lines)
        self.draws[chart.title] += 1
        return lines


def grid_cells(charts: list[Chart], markers: list[Marker], options: PlotOptions, width: int, height: int,
               shape: tuple[int, int], cache: ChartCache | None = None, own_ranges: bool = False,
               chart_options: Callable[[Chart, PlotOptions], PlotOptions] | None = None) -> list[GridCell]:
    """Charts in `shape` (columns, rows), each with its own y axis, all over the same x range (with `own_ranges`
    and no range given, each over its own data's: runs of different lengths compared); `cache`: charts drawn
    before and unchanged since are taken from it; `chart_options`: a chart's own options from the grid's (the
    comparison's x range cut per chart)."""
    columns, rows = shape
    span = options.x_range if own_ranges else shared_x_range(charts, options)
    shared = replace(options, x_range=span) if span is not None else options
    cell_w = (width - (columns - 1)) // columns
    cells: list[GridCell] = []
    bounds_cache: dict = {}
    top = 0
    for row in range(rows):
        cell_h = height // rows + (1 if row < height % rows else 0)
        for column in range(columns):
            number = row * columns + column
            if number >= len(charts):
                continue
            chart = charts[number]
            own = shared if chart_options is None else chart_options(chart, shared)
            if cache is not None:
                lines = cache.lines(chart, markers, own, cell_w, cell_h, chart.title, bounds_cache)
            else:
                lines = plot_lines(chart.curves, markers, own, cell_w, cell_h, chart.title, bounds_cache)
            lines = lines[:cell_h] + [Text("") for _ in range(cell_h - len(lines))]
            for line in lines:
                line.no_wrap, line.overflow = True, "crop"
                line.set_length(cell_w)
            cells.append(GridCell(chart, column * (cell_w + 1), top, cell_w, cell_h, lines))
        top += cell_h
    return cells


def join_cells(cells: list[GridCell], width: int) -> Text:
    """The cells of a grid as one text, a space between neighbours; an empty place where a row has fewer charts."""
    by_row: dict[int, list[GridCell]] = {}
    for cell in cells:
        by_row.setdefault(cell.y, []).append(cell)
    out: list[Text] = []
    for _y, row in sorted(by_row.items()):
        row.sort(key=lambda cell: cell.x)
        width_each = row[0].width
        places = (width + 1) // (width_each + 1) if width_each > 0 else len(row)
        blanks = [[Text(" " * width_each)] * row[0].height] * max(places - len(row), 0)
        columns = [cell.lines for cell in row] + blanks
        for y in range(row[0].height):
            out.append(Text(" ").join(lines[y] for lines in columns))
    return Text("\n").join(out)


def render_grid(charts: list[Chart], markers: list[Marker], options: PlotOptions, width: int, height: int,
                shape: tuple[int, int], cache: ChartCache | None = None, own_ranges: bool = False,
                chart_options: Callable[[Chart, PlotOptions], PlotOptions] | None = None) -> Text:
    """Charts in `shape` (columns, rows), each with its own y axis, all over the same x range (see `grid_cells`)."""
    cells = grid_cells(charts, markers, options, width, height, shape, cache, own_ranges, chart_options)
    columns, _rows = shape
    cell_w = (width - (columns - 1)) // columns
    return join_cells(cells, columns * (cell_w + 1) - 1)


def value_at(curve: Curve, at: float, wall_time: bool = False) -> tuple[float, float] | None:
    """The point of `curve` nearest to x = `at` (in the newest segment that covers it, else in any):
    (its x, its raw value); None without points."""
    s = curve.series
    xs = x_values(s, wall_time)
    if xs is None or len(s.x) == 0:
        return None
    best: tuple[float, int] | None = None
    for begin, end in reversed(s.segment_bounds()):
        part = xs[begin:end]
        if part.size == 0:
            continue
        i = int(np.clip(np.searchsorted(part, at), 1, part.size - 1)) if part.size > 1 else 0
        candidates = [i - 1, i] if part.size > 1 else [0]
        y = s.y.view[begin:end]
        for j in candidates:  # nearest of the two neighbours that has a value
            if not np.isnan(y[j]):
                distance = abs(float(part[j]) - at)
                if best is None or distance < best[0]:
                    best = (distance, begin + j)
        if part[0] <= at <= part[-1] and best is not None:
            break  # the newest session that covers `at` wins over an abandoned one
    if best is None:
        return None
    return float(xs[best[1]]), float(s.y.view[best[1]])


def smoothed_at(curve: Curve, index_x: float, wall_time: bool = False) -> float | None:
    s = curve.series
    xs = x_values(s, wall_time)
    if xs is None:
        return None
    for begin, end in reversed(s.segment_bounds()):
        part = xs[begin:end]
        i = int(np.searchsorted(part, index_x))
        if i < part.size and part[i] == index_x:
            return float(s.smooth.view[begin + i])
    return None


def _cursor_column(cursor: float | None, x_lo: float, x_hi: float, plot_w: int) -> int | None:
    if cursor is None or not x_lo <= cursor <= x_hi or x_hi <= x_lo:
        return None
    return min(int((cursor - x_lo) / (x_hi - x_lo) * plot_w), plot_w - 1)


def _cursor_line(lines: list[Text], column: int, options: PlotOptions) -> None:
    """A vertical line at the cursor: on empty cells a bar, on drawn ones the cell in reverse video."""
    bar = "|" if options.ascii else "│"
    for row, line in enumerate(lines):
        if column >= len(line.plain):
            continue
        if line.plain[column] == " ":
            lines[row] = Text.assemble(line[:column], Text(bar, style="bold" if options.colour else ""),
                                       line[column + 1:], no_wrap=True, overflow="crop")
        else:
            line.stylize("reverse", column, column + 1)


def format_x(x: float, span: float, wall_time: bool) -> str:
    """A step (12.3k), or a wall time as a clock: seconds shown for short spans, the date for long ones."""
    if not wall_time:
        return format_step(x)
    if not math.isfinite(x):
        return "?"
    moment = time.localtime(x)
    if span < 180:
        return time.strftime("%H:%M:%S", moment)
    if span < 2 * 86400:
        return time.strftime("%H:%M", moment)
    return time.strftime("%m-%d %H:%M", moment)


def nice_step(span: float, count: int) -> float:
    """The smallest 1, 2 or 5 times a power of ten that cuts `span` into at most `count` parts."""
    if not span > 0 or not math.isfinite(span):
        return 0.0
    raw = span / max(count, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for multiple in (1.0, 2.0, 5.0, 10.0):
        if multiple * magnitude >= raw * (1 - 1e-9):
            return multiple * magnitude
    return 10.0 * magnitude


def y_ticks(scale: YScale, count: int) -> list[float]:
    """Round values inside the scale's range for at most `count` labels: multiples of 1, 2 or 5 times a
    power of ten (linear), powers of ten (log, symmetric log), else round values as for linear."""
    lo_value, hi_value = scale.value_at(0.0), scale.value_at(1.0)
    if scale.kind != "linear" and scale.hi - scale.lo >= 1.5:
        if scale.kind == "log":
            decades = nice_step(scale.hi - scale.lo, count)
            step = max(1, round(decades))
            first = math.ceil(scale.lo / step) * step
            return [10.0 ** e for e in range(int(first), int(math.floor(scale.hi)) + 1, step)]
        candidates = [0.0] + [sign * 10.0 ** e for e in range(-30, 31) for sign in (1.0, -1.0)]
        inside = sorted(v for v in candidates if lo_value <= v <= hi_value)
        keep = max(1, -(-len(inside) // max(count, 1)))
        return inside[::keep]
    step = nice_step(hi_value - lo_value, count)
    if step <= 0:
        return []
    first = math.ceil(lo_value / step)
    last = math.floor(hi_value / step)
    if last - first > 1000:
        return []
    return [round(k * step, 12) for k in range(int(first), int(last) + 1)]


def format_tick(value: float) -> str:
    """A round tick value, short: 0.05, 2, 40k, 1.5M, 1e-4."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e3 <= magnitude < 1e9:
        for unit, size in (("M", 1e6), ("k", 1e3)):
            if magnitude >= size:
                return f"{value / size:g}{unit}"
    return format_value(value)


def _legend(curves: list[Curve], options: PlotOptions, width: int, title: str) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis")
    if title:
        line.append(title + " ", style="bold")
    for curve in curves:
        mark = curve.glyph if options.ascii else "━"
        line.append(mark, style=curve.style if options.colour else "")
        line.append(curve.label + " ")
        if options.cursor is not None:
            line.append(_readout(curve, options) + " ", style="bold" if options.colour else "")
    flags = []
    weights = {c.series.weight for c in curves if smoothed(c, options)}
    if weights:  # only where something is smoothed: eval points and the learning rate never are
        flags.append("EMA " + "/".join(f"{w:g}" for w in sorted(weights)))
    if options.log:
        flags.append("log")
    flags.append(options.view_label or ("all" if options.window is None else f"last {format_step(options.window)}"))
    bad = sum(c.series.nonfinite for c in curves)
    if bad:
        flags.append(f"{bad} non-finite")
    right = Text(" [" + " | ".join(flags) + "]", style="bold red" if bad and options.colour else "")
    if options.cursor is not None:  # the values come first; the view's flags get what room is left
        line.append_text(right)
        _cut(line, width, options.ascii)
        line.pad_right(width - line.cell_len)
        return line
    room = width - right.cell_len
    if line.cell_len > room:
        _cut(line, room, options.ascii)
    return Text.assemble(line, Text(" " * max(room - line.cell_len, 0)), right)


def _cut(line: Text, width: int, ascii: bool) -> None:
    """Cut a line to `width` cells with an ellipsis: "..." in ASCII mode, where everything is ASCII."""
    if line.cell_len <= width:
        return
    if not ascii:
        line.truncate(max(width, 0), overflow="ellipsis")
        return
    line.truncate(max(width - 3, 0), overflow="crop")
    line.append("..."[: max(width, 0)])


def _readout(curve: Curve, options: PlotOptions) -> str:
    """A curve's value at the cursor: the raw value, then ~ and the smoothed one when smoothed, and the
    point's own x when it is not at the cursor's column (sparse eval points)."""
    assert options.cursor is not None
    found = value_at(curve, options.cursor, options.wall_time)
    if found is None:
        return "-"
    x, value = found
    text = format_value(value)
    if smoothed(curve, options):
        average = smoothed_at(curve, x, options.wall_time)
        if average is not None and math.isfinite(average):
            text += f"~{format_value(average)}"
    span = options.x_range[1] - options.x_range[0] if options.x_range else 0.0
    if x != options.cursor:  # a point of its own (eval points are sparse): say where
        text += "@" + format_x(x, span, options.wall_time)
    return text


def _nonfinite_markers(lines: list[Text], curves: list[Curve], x_lo: float, x_hi: float, plot_w: int,
                       options: PlotOptions) -> None:
    """NaN and +inf at the top row, -inf at the bottom row, in the series' colour."""
    if not lines:
        return
    nan_glyph = "x" if options.ascii else "×"
    span = x_hi - x_lo
    for curve in curves:
        s = curve.series
        if not s.nonfinite:
            continue
        xs, signs = s.bad_x.view, s.bad_sign.view
        inside = (xs >= x_lo) & (xs <= x_hi)
        for x, sign in zip(xs[inside], signs[inside]):
            column = min(int((x - x_lo) / span * plot_w), plot_w - 1)
            row = len(lines) - 1 if sign < 0 else 0
            glyph = {0: nan_glyph, 1: "^" if options.ascii else "▲", -1: "v" if options.ascii else "▼"}[int(sign)]
            line = lines[row]
            style = f"bold {curve.style}" if options.colour else "bold"
            lines[row] = Text.assemble(line[:column], Text(glyph, style=style), line[column + 1:],
                                       no_wrap=True, overflow="crop")


def _with_y_labels(lines: list[Text], scale: YScale, options: PlotOptions) -> list[Text]:
    """The range's ends on the top and bottom rows (exact: a spike's height reads there), and round
    ticks (1, 2 or 5 times a power of ten) on the rows between, at least a row apart."""
    count = len(lines)
    labels: dict[int, str] = {0: format_value(scale.value_at(1.0)), count - 1: format_value(scale.value_at(0.0))}
    if count >= 5:
        for value in y_ticks(scale, max(count // 2, 1)):
            fraction = float(scale.fraction(np.array([value]))[0])
            if not math.isfinite(fraction):
                continue
            row = round((1.0 - fraction) * (count - 1))
            if 2 <= row <= count - 3 and not any(abs(row - taken) < 2 for taken in labels):
                labels[row] = format_tick(value)
    edge = "|" if options.ascii else "┤"
    plain_edge = "|" if options.ascii else "│"
    out = []
    for row, line in enumerate(lines):
        if row in labels:
            label = labels[row][: Y_LABEL_WIDTH - 1].rjust(Y_LABEL_WIDTH - 1)
            prefix = Text(label + edge, style="dim" if options.colour else "")
        else:
            prefix = Text(" " * (Y_LABEL_WIDTH - 1) + plain_edge, style="dim" if options.colour else "")
        out.append(Text.assemble(prefix, line, no_wrap=True, overflow="crop"))
    return out


def _x_axis(markers: list[Marker], x_lo: float, x_hi: float, plot_w: int,
            options: PlotOptions, cursor_column: int | None = None) -> tuple[Text, Text]:
    corner, rule = ("+", "-") if options.ascii else ("└", "─")
    cells: list[tuple[str, str]] = [(rule, "dim" if options.colour else "")] * plot_w
    order = list(MARKER_GLYPHS)
    placed: dict[int, str] = {}
    span = x_hi - x_lo
    for marker in markers:
        at = marker.time if options.wall_time else marker.step
        if at is None or not x_lo <= at <= x_hi or marker.kind not in MARKER_GLYPHS:
            continue
        column = min(int((at - x_lo) / span * plot_w), plot_w - 1)
        if column not in placed or order.index(marker.kind) > order.index(placed[column]):
            placed[column] = marker.kind
    for column, kind in placed.items():
        glyph, ascii_glyph, style = MARKER_GLYPHS[kind]
        cells[column] = (ascii_glyph if options.ascii else glyph, style if options.colour else "")
    axis = Text(" " * (Y_LABEL_WIDTH - 1) + corner, style="dim" if options.colour else "", no_wrap=True)
    for glyph, style in cells:
        axis.append(glyph, style=style)
    left, right = format_x(x_lo, span, options.wall_time), format_x(x_hi, span, options.wall_time)
    middle = format_x((x_lo + x_hi) / 2, span, options.wall_time)
    ticks = [" "] * plot_w
    placed_texts = [(left, 0), (middle, plot_w // 2 - len(middle) // 2), (right, plot_w - len(right))]
    if cursor_column is not None and options.cursor is not None:
        # the cursor's own x, first so that it wins its place; the tick labels it would touch give way
        here = format_x(options.cursor, span, options.wall_time)
        here = ("^" if options.ascii else "↑") + here
        placed_texts.insert(0, (here, min(max(cursor_column, 0), plot_w - len(here))))
    for text, at in placed_texts:
        if at < 0 or at + len(text) > plot_w:
            continue
        if any(c != " " for c in ticks[max(at - 1, 0): at + len(text) + 1]):
            continue
        ticks[at: at + len(text)] = list(text)
    label = Text(" " * Y_LABEL_WIDTH + "".join(ticks), style="dim" if options.colour else "", no_wrap=True)
    return axis, label
