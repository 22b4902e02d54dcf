"""The headless trainer: network, data, training loop and checkpoints (imports torch)."""
