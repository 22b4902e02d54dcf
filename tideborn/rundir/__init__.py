"""The run directory, the one contract between the trainer, the run tools and the TUI (no torch here).

This package holds the whole concept: `layout` (the names of the files in it, how step checkpoints and exported
models are named and listed, the archive folders), `access` (whether this user may read it, or train in it: ours
alone and writable), `events` (events.jsonl: writing, bounded reading, following), `kinds` (the events' typed
records), `files` (train.pid, launch.json, the process identity), `state` (what a run is doing, from its files),
`status` and `report` (that as a typed value and in words), `lock` (one trainer per run directory) and `anomaly`
(the rules `status`, `watch` and the monitor report); starting and signalling a run is `tideborn.tools.control`.
How files are opened, written and moved, and how a run file refuses a link, is `tideborn.safefile`.
"""
