"""The dashboard's panes, one module each."""
