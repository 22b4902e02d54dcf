"""The run tools: starting, signalling and following a detached training run (`control`, used by the
monitor too) and their command line (`train_run`). No torch. Benchmarks live outside the package, in
`benchmarks/` at the top of the checkout."""
