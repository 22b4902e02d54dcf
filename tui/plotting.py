"""Drawing curves into terminal cells: per-column min/max decimation, linear / log / symmetric-log
scales, and a braille (2x4 dots a cell) or ASCII (one glyph a cell) canvas. No textual here: the
`LossPlot` widget calls `render_plot` and shows the `rich.text.Text` it returns.

Why min/max: a column of the plot stands for many steps; drawing the span from the lowest to the
highest value in it (and joining it to its neighbours) keeps every spike visible however many points
there are, at the cost of two `reduceat` passes over the visible part of each series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from rich.text import Text

from tui.decimate import Columns, decimate
from tui.series import Series

BRAILLE_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.uint16)
Y_LABEL_WIDTH = 9
MARKER_GLYPHS = {  # kind: (unicode, ascii, style); a later kind wins a shared column
    "checkpoint": ("┼", "+", "cyan"),
    "resume": ("◀", "<", "bold magenta"),
    "anomaly": ("!", "!", "bold red"),
}


@dataclass(frozen=True)
class Curve:
    series: Series
    label: str
    style: str
    glyph: str
    """Drawn with this character in ASCII mode (where colour may be missing)."""


@dataclass(frozen=True)
class Marker:
    step: float
    kind: str
    """checkpoint, resume or anomaly."""


@dataclass(frozen=True)
class PlotOptions:
    smooth: bool = True
    log: bool = False
    window: int | None = None
    """Show the last `window` steps; None: everything."""
    ascii: bool = False
    colour: bool = True


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

    def fill(self, columns: np.ndarray, top: np.ndarray, bottom: np.ndarray, layer: int) -> None:
        """Set dots rows top..bottom (0 is the top) in each dot column."""
        dh, dw = self.dot_height, self.dot_width
        keep = (columns >= 0) & (columns < dw)
        columns, top, bottom = columns[keep], np.clip(top[keep], 0, dh - 1), np.clip(bottom[keep], 0, dh - 1)
        if columns.size == 0:
            return
        mask = np.zeros((dh, dw), dtype=bool)
        rows = np.arange(dh)[:, None]
        mask[:, columns] = (rows >= top[None, :]) & (rows <= bottom[None, :])
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


def x_range(curves: list[Curve], window: int | None) -> tuple[float, float] | None:
    lows, highs = [], []
    for curve in curves:
        s = curve.series
        for begin, end in s.segment_bounds():
            if end > begin:
                lows.append(s.x.view[begin])
                highs.append(s.x.view[end - 1])
        if s.nonfinite:
            lows.append(float(s.bad_x.view.min()))
            highs.append(float(s.bad_x.view.max()))
    if not lows:
        return None
    lo, hi = float(min(lows)), float(max(highs))
    if window is not None:
        lo = max(lo, hi - window)
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    return lo, hi


def format_value(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    text = f"{value:.3g}"
    return text.replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")


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
    legend = _legend(curves, options, width, title)
    if height < 5 or width < Y_LABEL_WIDTH + 8:
        return legend
    plot_w, plot_h = width - Y_LABEL_WIDTH, height - 3
    span = x_range(curves, options.window)
    if span is None:
        body = Text("\n" * (plot_h // 2) + "no step events yet".center(width).rstrip(), no_wrap=True)
        return Text("\n").join([legend, body])
    x_lo, x_hi = span
    canvas = Canvas(plot_w, plot_h, braille=not options.ascii)
    layers: list[tuple[Curve, bool, list[tuple[Columns, np.ndarray]]]] = []
    lows, highs = [], []
    for curve in curves:
        s = curve.series
        parts = [(s.y.view, s.y_blocks, True)]
        if options.smooth:
            parts = [(s.y.view, s.y_blocks, False), (s.smooth.view, s.smooth_blocks, True)]
        for values, blocks, bold in parts:
            decimated = []
            for begin, end in s.segment_bounds():
                x = s.x.view[begin:end]
                cols = decimate(x, values[begin:end], x_lo, x_hi, canvas.dot_width, blocks, base=begin)
                if len(cols):
                    decimated.append((cols, x))
                    lows.append(cols.low)
                    highs.append(cols.high)
            layers.append((curve, bold, decimated))
    scale = YScale.fit(lows, highs, options.log)
    styles, glyphs = [], []
    for number, (curve, bold, decimated) in enumerate(layers):
        styles.append((curve.style if bold else f"dim {curve.style}") if options.colour else ("" if bold else "dim"))
        glyphs.append(curve.glyph if bold else ".")
        for cols, _x in decimated:
            stacked = np.stack((cols.low, cols.high, cols.first, cols.last))
            rows = (1.0 - scale.fraction(stacked)) * (canvas.dot_height - 1)
            rows = np.nan_to_num(rows, nan=0.0, posinf=canvas.dot_height - 1, neginf=0.0)
            all_c, top, bottom = column_spans(cols, rows)
            canvas.fill(all_c, np.rint(top).astype(np.int64), np.rint(bottom).astype(np.int64), number)
    lines = canvas.rows(styles, glyphs)
    _nonfinite_markers(lines, curves, x_lo, x_hi, plot_w, options)
    labelled = _with_y_labels(lines, scale, options)
    axis, ticks = _x_axis(markers, x_lo, x_hi, plot_w, options)
    return Text("\n").join([legend, *labelled, axis, ticks])


def _legend(curves: list[Curve], options: PlotOptions, width: int, title: str) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis")
    if title:
        line.append(title + " ", style="bold")
    for curve in curves:
        mark = curve.glyph if options.ascii else "━"
        line.append(mark, style=curve.style if options.colour else "")
        line.append(curve.label + " ")
    flags = []
    if options.smooth:
        weights = {c.series.weight for c in curves}
        flags.append("EMA " + "/".join(f"{w:g}" for w in sorted(weights)) if weights else "EMA")
    if options.log:
        flags.append("log")
    flags.append("all" if options.window is None else f"last {format_step(options.window)}")
    bad = sum(c.series.nonfinite for c in curves)
    if bad:
        flags.append(f"{bad} non-finite")
    right = Text(" [" + " | ".join(flags) + "]", style="bold red" if bad and options.colour else "")
    room = width - right.cell_len
    if line.cell_len > room:
        line.truncate(max(room, 0), overflow="ellipsis")
    return Text.assemble(line, Text(" " * max(room - line.cell_len, 0)), right)


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
    count = len(lines)
    label_rows = {0: 1.0, count - 1: 0.0}
    if count >= 5:
        label_rows[(count - 1) // 2] = 1.0 - ((count - 1) // 2) / (count - 1)
    if count >= 11:
        for quarter in (1, 3):
            row = round((count - 1) * quarter / 4)
            label_rows[row] = 1.0 - row / (count - 1)
    edge = "|" if options.ascii else "┤"
    plain_edge = "|" if options.ascii else "│"
    out = []
    for row, line in enumerate(lines):
        if row in label_rows:
            label = format_value(scale.value_at(label_rows[row]))[: Y_LABEL_WIDTH - 1].rjust(Y_LABEL_WIDTH - 1)
            prefix = Text(label + edge, style="dim" if options.colour else "")
        else:
            prefix = Text(" " * (Y_LABEL_WIDTH - 1) + plain_edge, style="dim" if options.colour else "")
        out.append(Text.assemble(prefix, line, no_wrap=True, overflow="crop"))
    return out


def _x_axis(markers: list[Marker], x_lo: float, x_hi: float, plot_w: int,
            options: PlotOptions) -> tuple[Text, Text]:
    corner, rule = ("+", "-") if options.ascii else ("└", "─")
    cells: list[tuple[str, str]] = [(rule, "dim" if options.colour else "")] * plot_w
    order = list(MARKER_GLYPHS)
    placed: dict[int, str] = {}
    span = x_hi - x_lo
    for marker in markers:
        if not x_lo <= marker.step <= x_hi or marker.kind not in MARKER_GLYPHS:
            continue
        column = min(int((marker.step - x_lo) / span * plot_w), plot_w - 1)
        if column not in placed or order.index(marker.kind) > order.index(placed[column]):
            placed[column] = marker.kind
    for column, kind in placed.items():
        glyph, ascii_glyph, style = MARKER_GLYPHS[kind]
        cells[column] = (ascii_glyph if options.ascii else glyph, style if options.colour else "")
    axis = Text(" " * (Y_LABEL_WIDTH - 1) + corner, style="dim" if options.colour else "", no_wrap=True)
    for glyph, style in cells:
        axis.append(glyph, style=style)
    left, right = format_step(x_lo), format_step(x_hi)
    middle = format_step((x_lo + x_hi) / 2)
    ticks = [" "] * plot_w
    for text, at in ((left, 0), (middle, plot_w // 2 - len(middle) // 2), (right, plot_w - len(right))):
        if at < 0 or at + len(text) > plot_w:
            continue
        if any(c != " " for c in ticks[max(at - 1, 0): at + len(text) + 1]):
            continue
        ticks[at: at + len(text)] = list(text)
    label = Text(" " * Y_LABEL_WIDTH + "".join(ticks), style="dim" if options.colour else "", no_wrap=True)
    return axis, label
