"""tideborn-tui: the Textual monitor that attaches to a run directory (no torch here)."""
