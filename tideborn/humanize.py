"""Numbers and durations as people read them, shared by the trainer's progress line, the run tools and
the TUI (no torch here)."""

from __future__ import annotations

import math
import numbers
import time


def duration(seconds: object) -> str:
    """`45s`, `3m07s`, `2h05m`, `3d04h`; `?` for anything that is not a finite, non-negative number."""
    if not isinstance(seconds, (int, float)) or seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def clock(when: object, spec: str = "%H:%M:%S") -> str:
    """Local wall-clock time of a unix time; `?` for one no calendar can show (a corrupt file's 1e17, "x")."""
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        return "?"
    try:
        return time.strftime(spec, time.localtime(when))
    except (OverflowError, OSError, ValueError):
        return "?"


def number(value: object, spec: str = ".4f") -> str:
    if isinstance(value, bool) or value is None:
        return "?"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def compact(value: object) -> str:
    """A figure in at most about 7 characters, the one format the monitor and `status` show figures in:
    3 significant digits, 41.2k and 2.5M for thousands and millions, 3.07e26 past them (a diverged loss
    printed as %.4f took 30 columns); `nan`, `inf`; `?` for what is not a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's floats are Real too
        return "?"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if 1e3 <= abs(value) < 1e9:  # 41.2k pos/s, 2.5M steps: easier to read than 4.12e4
        for unit, size in (("M", 1e6), ("k", 1e3)):
            if abs(value) >= size:
                return f"{value / size:.3g}{unit}"
    text = f"{value:.3g}"
    return text.replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")


def percent(value: object) -> str:
    """A fraction (0.215) as a percentage with one decimal (21.5%); `?` for what is not a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return "?"
    value = float(value)
    return f"{value:.1%}" if math.isfinite(value) else str(value)


def shortened(text: str, limit: int = 200) -> str:
    """`text` for a one-line message, cut after `limit` characters with an ellipsis and its length: a
    50 MB `--set` value must not come back as a 50 MB error line."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def clipped(text: str, limit: int = 200) -> str:
    """`text` quoted (as `repr` quotes it), cut like `shortened`, the length outside the quotes."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"
