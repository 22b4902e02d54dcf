"""The network and what a checkpoint holds of it: the ResNet (`model`), its optimizer and schedule (`optim`),
checkpoint files (`checkpoint`) and the checks a loaded one passes (`payload_check`). Torch."""
