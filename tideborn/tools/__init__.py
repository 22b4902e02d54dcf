"""Command-line tools around a training run (`train_run`) and benchmarks (`bench`, which imports torch)."""
