"""The headless trainer: the training loop, its state, resume, distributed ranks and the periodic duties
(evaluation, checkpoints, matches, exports); the network itself is `tideborn.network` (imports torch)."""
