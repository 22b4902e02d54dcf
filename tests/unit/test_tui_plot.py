"""The loss plot's drawing (no app needed): decimation that keeps spikes, TensorBoard's debiased EMA,
scales that cope with values <= 0 and huge ranges, non-finite markers, resumes, ASCII mode."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from tideborn.tui.decimate import decimate
from tideborn.tui.history import RunHistory
from tideborn.tui.plotting import (
    Chart,
    Curve,
    Marker,
    PlotOptions,
    YScale,
    format_step,
    format_tick,
    format_value,
    grid_shape,
    nice_step,
    render_grid,
    render_plot,
    y_ticks,
)
from tideborn.tui.series import Series, ema_debiased

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


# -- the metrics view: charts with their own y axes, round ticks, zoom, wall time, cursor -------------

def y_labels(lines: list[str]) -> list[str]:
    """The labels left of the y axis, top to bottom (the canvas rows)."""
    return [line[:8].strip() for line in lines[1:-2] if line[:8].strip()]


def is_round(value: float) -> bool:
    """1, 2 or 5 times a power of ten (or zero)."""
    if value == 0:
        return True
    exponent = math.floor(math.log10(abs(value)))
    return round(abs(value) / 10 ** exponent, 9) in (1.0, 2.0, 5.0)


def parse_label(label: str) -> float:
    units = {"k": 1e3, "M": 1e6}
    return float(label[:-1]) * units[label[-1]] if label[-1] in units else float(label)


@pytest.mark.parametrize("low, high", [(0.37, 8.91), (0.001234, 0.00987), (2431.0, 2687.0), (-3.3, 4.4),
                                       (41_000.0, 1_234_567.0)])
def test_y_ticks_between_the_ends_are_round_numbers(low, high):
    steps = np.arange(100.0)
    lines = draw([curve(steps, np.linspace(low, high, 100))], smooth=False, height=24)
    labels = y_labels(lines)
    ends, ticks = [labels[0], labels[-1]], labels[1:-1]
    assert parse_label(ends[0]) == pytest.approx(high, rel=5e-3) and parse_label(ends[1]) == pytest.approx(low,
                                                                                                          rel=5e-3)
    assert len(ticks) >= 2, labels
    values = [parse_label(t) for t in ticks]
    step = float(f"{abs(values[0] - values[1]):.6g}")
    assert is_round(step), labels  # 1, 2 or 5 times a power of ten apart
    assert all(abs(v / step - round(v / step)) < 1e-6 for v in values), labels  # and multiples of it
    assert np.allclose(np.diff(values), values[1] - values[0]), labels


def test_nice_steps_and_log_ticks():
    assert nice_step(8.2, 5) == 2 and nice_step(0.0099, 4) == 0.005 and nice_step(255, 3) == 100
    assert y_ticks(YScale("linear", 0.37, 8.91), 5) == [2, 4, 6, 8]
    assert y_ticks(YScale("log", -4.0, 1.0), 6) == [1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0]
    assert format_tick(40_000) == "40k" and format_tick(1_500_000) == "1.5M" and format_tick(0.05) == "0.05"


def test_grid_shape_fits_six_charts_or_says_it_cannot():
    assert grid_shape(6, 199, 26) == (3, 2)
    assert grid_shape(6, 159, 24) == (3, 2)
    assert grid_shape(6, 79, 11) is None and grid_shape(6, 100, 14) is None


def test_a_grid_gives_each_chart_its_own_y_axis_over_one_x_range():
    losses = curve(np.arange(10.0, 1001.0), np.linspace(9.0, 1.0, 991))
    lr = curve(np.arange(10.0, 501.0), np.linspace(0.05, 0.0001, 491), name="lr")
    text = render_grid([Chart("losses", [losses]), Chart("learning rate", [lr])], [], PlotOptions(smooth=False),
                       120, 20, (2, 1)).plain
    rows = text.split("\n")
    assert len(rows) == 20 and all(len(row) <= 120 for row in rows)
    assert rows[0].startswith("losses") and "learning rate" in rows[0]
    assert rows[1].lstrip().startswith("9┤") and "0.05┤" in rows[1]  # each its own scale
    assert rows[-1].split() == ["10", "505", "1000", "10", "505", "1000"]  # the same steps in both


def test_an_explicit_x_range_zooms_into_the_steps():
    c = curve(np.arange(0.0, 10_000.0), np.sin(np.arange(10_000.0) / 50))
    lines = draw([c], x_range=(2000.0, 3000.0), view_label="zoom 2k-3k")
    assert lines[-1].split() == ["2000", "2500", "3000"] and "zoom 2k-3k" in lines[0]
    assert dots(lines) > 50


def test_wall_time_axis_uses_the_points_times_and_the_markers_times(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        series = Series("loss", 0.9)
        start = 1_700_000_000.0  # 22:13:20 UTC
        series.extend(np.arange(1.0, 101.0), np.linspace(3, 1, 100), times=start + np.arange(100) * 60.0)
        markers = [Marker(50.0, "checkpoint", start + 49 * 60.0), Marker(60.0, "anomaly")]  # no time: not drawn
        lines = draw([Curve(series, "loss", "red", "#")], markers, wall_time=True)
        assert lines[-1].split() == ["22:13", "23:02", "23:52"]  # 22:13:20, +49.5 and +99 minutes
        assert "┼" in lines[-2] and "!" not in lines[-2]
        assert dots(lines) > 20
    finally:
        monkeypatch.undo()
        time.tzset()


def test_cursor_reads_out_values_and_marks_its_column():
    train = curve(np.arange(0.0, 101.0), np.arange(0.0, 101.0) / 10)
    evals = Series("eval_policy_loss", 0.9, smoothed=False)
    evals.extend([0.0, 50.0, 100.0], [3.0, 2.0, 1.0])
    lines = draw([train, Curve(evals, "eval-pol", "blue", "P")], cursor=42.0, x_range=(0.0, 100.0))
    assert "loss 4.2~" in lines[0] and "eval-pol 2@50" in lines[0], lines[0]
    column = 9 + int(42 / 100 * 51)
    assert any(line[column] in "│⣿⡇⢸" or ord(line[column]) >= 0x2800 for line in lines[1:-2])
    assert "↑42" in lines[-1]


def test_eval_points_are_never_smoothed_and_train_curves_are():
    steps = np.arange(0.0, 200.0)
    noisy = np.where(np.arange(200) % 2, 3.0, 1.0)
    evals = Series("eval_value_loss", 0.9, smoothed=False)
    evals.extend(steps, noisy)

    def styles(c, smooth):
        text = render_plot([c], [], PlotOptions(smooth=smooth), 60, 14)
        return text, {str(span.style) for span in text.spans}

    (on, on_styles), (off, off_styles) = styles(Curve(evals, "eval-val", "green", "V"), True), styles(
        Curve(evals, "eval-val", "green", "V"), False)
    assert on.plain.split("\n")[1:] == off.plain.split("\n")[1:] and on_styles == off_styles  # drawn raw either way
    assert "dim green" not in on_styles and "EMA" not in on.plain.split("\n")[0]
    train, train_styles = styles(curve(steps, noisy), True)
    assert "dim red" in train_styles and "red" in train_styles  # raw faint under the smoothed curve
    assert "EMA 0.9" in train.plain.split("\n")[0]


def test_history_keeps_every_step_metric_over_one_shared_step_array():
    history = RunHistory(0.9)
    history.add([{"kind": "run_started", "step": 0}]
                + [{"kind": "step", "step": s, "time": 100.0 + s, "loss": 2.0, "policy_loss": 1.5, "value_loss": 0.5,
                    "grad_norm": 1.0 + s, "lr": 0.1, "positions_per_second": 1000.0, "data_wait_seconds": 0.25,
                    "compute_seconds": 0.75} for s in range(1, 11)]
                + [{"kind": "step", "step": 11, "time": 111.0, "loss": 2.0}])  # an older writer: only losses
    grad, wait, lr = history.series["grad_norm"], history.series["data_wait_fraction"], history.series["lr"]
    assert len(grad) == 10 and len(history.series["loss"]) == 11
    assert grad.x is history.series["loss"].x and grad.t is lr.t  # one step array, one time array for all
    assert wait.y.view[0] == pytest.approx(0.25) and grad.y.view[9] == 11.0
    assert grad.nonfinite == 0 and np.isnan(grad.y.view[10])  # absent is not non-finite
    assert history.series["loss"].t.view[-1] == 111.0
    assert not lr.smoothed and grad.smoothed and not history.series["eval_policy_loss"].smoothed


def test_the_loaders_fast_path_reads_every_metric_as_events_do(tmp_path):
    from tideborn.rundir.events import loads_bounded
    from tideborn.tui.history import load_history
    from tideborn.tui.testing import write_fixture_run

    write_fixture_run(tmp_path)
    path = tmp_path / "events.jsonl"
    fast = load_history(path, path.stat().st_size, 0.9)
    slow = RunHistory(0.9)
    slow.add([loads_bounded(line) for line in path.read_bytes().split(b"\n") if line.endswith(b"}")])
    for name, series in slow.series.items():
        np.testing.assert_array_equal(fast.series[name].x.view, series.x.view)
        np.testing.assert_array_equal(fast.series[name].t.view, series.t.view)
        np.testing.assert_allclose(fast.series[name].y.view, series.y.view, equal_nan=True)
        assert fast.series[name].nonfinite == series.nonfinite, name
    assert fast.series["data_wait_fraction"].y.view[0] == pytest.approx(0.01 / 2.0)
    # a value that is not a number sends its chunk through json instead (nothing misread)
    bad = tmp_path / "bad.jsonl"
    line = path.read_bytes().split(b"\n")[1]
    bad.write_bytes(line.replace(b'"grad_norm":1.5', b'"grad_norm":true') + b"\n" + line + b"\n")
    history = load_history(bad, bad.stat().st_size, 0.9)
    assert len(history.series["loss"]) == 2 and len(history.series["grad_norm"]) == 1


def test_the_accuracy_chart_draws_top1_among_legal_moves_where_eval_events_carry_it():
    from tideborn.tui.widgets.loss_plot import GROUPS

    history = RunHistory(0.9)
    history.add([{"kind": "run_started", "step": 0}]
                + [{"kind": "eval", "step": s, "time": 100.0 + s, "policy_loss": 2.0, "value_loss": 0.6,
                    "policy_accuracy": 0.30 + s / 1000, "policy_accuracy_legal": 0.32 + s / 1000,
                    "value_accuracy": 0.6} for s in (10, 20, 30)])
    legal = history.series["eval_policy_accuracy_legal"]
    assert list(legal.x.view) == [10, 20, 30] and legal.y.view[2] == pytest.approx(0.35)
    assert not legal.smoothed  # an eval point, never smoothed
    assert "eval_policy_accuracy_legal" in dict(GROUPS)["accuracy"]
