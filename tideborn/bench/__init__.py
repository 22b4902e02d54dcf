"""Benchmarks that print figures (never pass/fail), apart from the product's commands: `python -m
tideborn.bench.train`, `.data`, `.ddp`, `.gpu` (`.gpu_report`), `.hcpe3`, `.run_tools`, `.monitor` (the monitor
as a real process in a pseudo-terminal). Results and how to read them: docs/benchmarks.md."""
