"""Engine-ready weights: a checkpoint's network as an ONNX model, checked against PyTorch before it is
published. `tideborn.export.onnx_export.export_onnx` does the work; `tideborn.export.cli` is
`tideborn export`. This package's `__init__` and `cli` import no torch, so `tideborn --help` stays quick.
"""
