"""Where notifications go: never over the chart. Textual draws them in a rack docked to the bottom of
the screen on a layer of its own; here the rack is fitted to the rows below the chart (the panes, the
compare legend) or, where the chart reaches the bottom (maximised with `z`), to the rows above it (the
header), and the rest of a long notification is cut rather than drawn over the chart."""

from __future__ import annotations

from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget

FOOTER_ROWS = 1
RACK_ID = "textual-toastrack"
"""The id Textual gives each screen's notification rack (textual/screen.py, `_compose`)."""


def keep_off(screen: Screen, chart: Widget) -> None:
    """Fit the screen's notification rack to the larger free band above or below `chart`."""
    try:
        rack = screen.get_child_by_id(RACK_ID)
    except NoMatches:  # notifications disabled: nothing to place
        return
    region = chart.region
    if not region.height:
        return  # not laid out yet (or hidden: the log maximised): Textual's own place is clear of it
    below = screen.size.height - FOOTER_ROWS - region.bottom
    above = region.y
    if below >= above:
        rack.styles.dock = "bottom"
        rack.styles.margin = (0, 0, FOOTER_ROWS, 0)
        rack.styles.max_height = max(below, 0)
    else:
        rack.styles.dock = "top"
        rack.styles.margin = (0, 0, 0, 0)
        rack.styles.max_height = above
