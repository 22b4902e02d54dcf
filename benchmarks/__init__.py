"""Benchmarks that print figures (never pass/fail), apart from the product: a plain package beside `tideborn/`,
left out of the wheel, run from the checkout's root as `python -m benchmarks.NAME` (`train`, `train_dlshogi`,
`data`, `ddp`, `gpu`, `hcpe3`, `hcpe3_decode`, `scale`, `average`, `search`, `usi_latency`, `run_tools`, `monitor`:
the monitor as a real process in a pseudo-terminal). Nothing in `tideborn` imports them (pyproject.toml's
import contracts). Results and how to read them: docs/benchmarks.md."""
