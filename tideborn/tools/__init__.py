"""Command-line tools around a training run (`train_run`). Benchmarks live in `tideborn.bench`."""
