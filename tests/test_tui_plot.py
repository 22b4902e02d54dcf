"""The loss plot's drawing (no app needed): decimation that keeps spikes, TensorBoard's debiased EMA,
scales that cope with values <= 0 and huge ranges, non-finite markers, resumes, ASCII mode."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tui.decimate import decimate
from tui.history import RunHistory
from tui.plotting import Curve, Marker, PlotOptions, YScale, format_step, format_value, render_plot
from tui.series import Series, ema_debiased

BRAILLE = range(0x2800, 0x2900)


def curve(steps, values, name="loss", weight=0.9) -> Curve:
    series = Series(name, weight)
    series.extend(steps, values)
    return Curve(series, name, "red", "#")


def draw(curves, markers=(), width=60, height=14, **options) -> list[str]:
    text = render_plot(list(curves), list(markers), PlotOptions(**options), width, height)
    lines = text.plain.split("\n")
    assert len(lines) == height, text.plain
    return lines


def dots(lines: list[str]) -> int:
    """Braille dots drawn in the canvas rows (not the legend or the axes)."""
    return sum(bin(ord(c) - 0x2800).count("1") for line in lines[1:-2] for c in line if ord(c) in BRAILLE)


def tensorboard_smoothing(values, weight):
    """TensorBoard's own loop (vz_line_chart2): the reference the vectorised version must match."""
    last, count, out = 0.0, 0, []
    for value in values:
        if not math.isfinite(value):
            out.append(math.nan)
            continue
        last = last * weight + (1 - weight) * value
        count += 1
        out.append(last / (1 - weight ** count))
    return out


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.9, 0.999])
def test_ema_matches_tensorboards_debiased_smoothing_and_skips_nonfinite(weight):
    rng = np.random.default_rng(0)
    values = rng.normal(5, 1, 3000)
    values[[10, 500, 2999]] = [math.nan, math.inf, -math.inf]
    smoothed, _ = ema_debiased(values, weight)
    np.testing.assert_allclose(smoothed, tensorboard_smoothing(values, weight), rtol=1e-9, equal_nan=True)
    assert smoothed[0] == pytest.approx(values[0])  # debiased: the first point is not pulled towards 0


def test_ema_continues_across_calls_like_one_call():
    values = np.linspace(1, 2, 1000)
    first, state = ema_debiased(values[:333], 0.9)
    rest, _ = ema_debiased(values[333:], 0.9, state)
    np.testing.assert_allclose(np.concatenate([first, rest]), ema_debiased(values, 0.9)[0])


def test_decimation_keeps_every_spike_among_many_points():
    x = np.arange(100_000, dtype=float)
    y = np.ones_like(x)
    y[[1234, 77_777]] = [50.0, -40.0]
    cols = decimate(x, y, 0, 99_999, 80)
    assert cols.high.max() == 50.0 and cols.low.min() == -40.0
    assert len(cols) == 80


@pytest.mark.parametrize("window", [None, 5000, 300])
def test_block_extremes_decimate_exactly_like_reading_every_point(window):
    rng = np.random.default_rng(3)
    series = Series("loss")
    series.extend(np.arange(0, 60_000, dtype=float), rng.normal(size=60_000))
    series.extend(np.arange(40_000, 90_001, dtype=float), rng.normal(size=50_001) * 3, new_segment=True)
    series.extend([90_001.0, 90_002.0], [math.nan, math.inf])
    hi = series.x.view.max()
    lo = 0.0 if window is None else hi - window
    for begin, end in series.segment_bounds():
        x, y = series.x.view[begin:end], series.y.view[begin:end]
        fast = decimate(x, y, lo, hi, 157, series.y_blocks, base=begin)
        slow = decimate(x, y, lo, hi, 157)
        for name in ("index", "low", "high", "first", "last"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name))


def test_a_spike_is_drawn_at_the_top_row_however_many_points():
    x = np.arange(200_000, dtype=float)
    y = np.full_like(x, 2.0)
    y[123_456] = 9.0
    lines = draw([curve(x, y)], smooth=False)
    assert lines[1][:9].strip().startswith("9"), lines[1]  # the top label is the spike's value
    assert any(ord(c) in BRAILLE for c in lines[1][9:]), "the spike reaches the top row"


def test_nan_and_inf_become_markers_and_the_count_shows():
    steps = np.arange(1, 101, dtype=float)
    values = np.linspace(3, 1, 100)
    values[[20, 40, 60]] = [math.nan, math.inf, -math.inf]
    lines = draw([curve(steps, values)])
    assert "3 non-finite" in lines[0]
    assert "×" in lines[1] and "▲" in lines[1]
    assert "▼" in lines[-3]  # the canvas's bottom row
    ascii_lines = draw([curve(steps, values)], ascii=True, colour=False)
    assert "x" in ascii_lines[1] and "^" in ascii_lines[1] and "v" in ascii_lines[-3]


def test_only_nonfinite_values_still_draw_without_crashing():
    lines = draw([curve([1.0, 2.0, 3.0], [math.nan, math.inf, math.nan])])
    assert "3 non-finite" in lines[0]
    assert dots(lines) == 0


def test_one_point_is_drawn():
    lines = draw([curve([7.0], [2.5])])
    assert dots(lines) >= 1
    assert "7" in lines[-1]


def test_constant_series_is_a_flat_line_in_the_middle():
    lines = draw([curve(np.arange(50.0), np.full(50, 4.0))], smooth=False)
    rows = [i for i, line in enumerate(lines[1:-2]) if any(ord(c) in BRAILLE and c != "⠀" for c in line)]
    assert len(rows) == 1
    assert 2 <= rows[0] <= len(lines) - 6
    assert "4" in " ".join(lines)


@pytest.mark.parametrize("values", [[1e-300, 1e300], [-1e308, 1e308], [1e30, 1e30 + 1e15, 1e30 - 1e15]])
def test_huge_ranges_draw_with_finite_labels(values, log=False):
    for log in (False, True):
        lines = draw([curve(np.arange(len(values), dtype=float), values)], smooth=False, log=log)
        assert dots(lines) >= len(values) - 1
        assert "nan" not in "\n".join(lines)


def test_log_scale_copes_with_zero_and_negative_values():
    values = np.array([-5.0, -0.5, 0.0, 0.001, 1.0, 1000.0])
    scale = YScale.fit([values], [values], log=True)
    assert scale.kind == "symlog"
    fractions = scale.fraction(values)
    assert np.all(np.isfinite(fractions)) and np.all(np.diff(fractions) > 0)  # order kept, nothing lost
    positive = YScale.fit([np.array([0.01, 100.0])], [np.array([0.01, 100.0])], log=True)
    assert positive.kind == "log"
    assert positive.fraction(np.array([1.0]))[0] == pytest.approx(0.5)
    lines = draw([curve(np.arange(6.0), values)], smooth=False, log=True)
    assert dots(lines) > 0 and "log" in lines[0]


def test_resumed_run_is_split_into_segments_and_marked():
    history = RunHistory(0.9)
    events = [{"kind": "run_started", "step": 0}]
    events += [{"kind": "step", "step": s, "loss": 5 - s / 100} for s in range(10, 310, 10)]
    events += [{"kind": "checkpoint_saved", "step": 100}]
    events += [{"kind": "run_started", "step": 200, "resumed_from": "step-000000200.pt"}]
    events += [{"kind": "step", "step": s, "loss": 3 - s / 1000} for s in range(210, 410, 10)]
    history.add(events)
    loss = history.series["loss"]
    assert loss.segments == [0, 30]
    assert [m.kind for m in history.markers] == ["checkpoint", "resume"]
    # the smoothing restarts with the session: the first smoothed value after the resume is its raw value
    assert loss.smooth.view[30] == pytest.approx(loss.y.view[30])
    curves = [Curve(loss, "loss", "red", "#")]
    lines = draw(curves, history.markers)
    assert "◀" in lines[-2] and "┼" in lines[-2]
    ascii_lines = draw(curves, history.markers, ascii=True, colour=False)
    assert "<" in ascii_lines[-2] and "+" in ascii_lines[-2]


def test_step_going_backwards_without_run_started_is_a_resume():
    history = RunHistory()
    history.add([{"kind": "step", "step": s, "loss": 1.0} for s in (10, 20, 30, 15, 25)])
    assert history.series["loss"].segments == [0, 3]
    assert [m.kind for m in history.markers] == ["resume"]


def test_history_loaded_later_joins_the_tail_read_first():
    events = [{"kind": "step", "step": s, "loss": 1 + math.sin(s)} for s in range(1, 1001)]
    whole = RunHistory(0.9)
    whole.add(events)
    tail = RunHistory(0.9)
    tail.add(events[600:])
    earlier = RunHistory(0.9)
    earlier.add(events[:600])
    tail.prepend(earlier, continues=True)
    np.testing.assert_array_equal(tail.series["loss"].x.view, whole.series["loss"].x.view)
    # smoothed values are kept as float32 (drawn, never read out exactly)
    np.testing.assert_allclose(tail.series["loss"].smooth.view, whole.series["loss"].smooth.view, rtol=1e-6)
    assert tail.series["loss"].segments == [0]


def test_last_n_window_shows_only_recent_steps():
    steps = np.arange(0, 10_000, dtype=float)
    lines = draw([curve(steps, np.sin(steps / 100))], window=1000)
    assert "last 1000" in lines[0]
    assert lines[-1].split()[0] == "8999" and lines[-1].split()[-1] == "9999"


def test_ascii_mode_is_plain_ascii():
    steps = np.arange(1, 300, dtype=float)
    values = np.exp(-steps / 100)
    values[50] = math.nan
    text = render_plot([curve(steps, values)], [Marker(100, "checkpoint"), Marker(120, "anomaly")],
                       PlotOptions(ascii=True, colour=False, log=True), 70, 16)
    assert text.plain.isascii()
    assert not text.spans or all(span.style in ("", "dim", "bold") for span in text.spans)


def test_tiny_sizes_do_not_crash():
    c = [curve(np.arange(10.0), np.arange(10.0))]
    for width, height in [(1, 1), (5, 3), (20, 5), (18, 6)]:
        render_plot(c, [], PlotOptions(), width, height)


def test_number_formats_are_short():
    assert format_step(12_345) == "12.3k" and format_step(2_000_000) == "2M" and format_step(999) == "999"
    assert format_value(1e-300) == "1e-300" and format_value(0.000123) == "0.000123" and format_value(5.0) == "5"
