"""The exported model's interface, as the engine sees it (no torch here: the CLI parses with it).

docs/export.md describes it; `tideborn.export.onnx_export` produces it and a test holds the two together.
"""

from __future__ import annotations

INPUT_NAMES = ("features1", "features2")
"""float32 [N,62,9,9] and [N,57,9,9]: `cshogi.dlshogi.make_input_features`' two plane stacks."""
OUTPUT_NAMES = ("policy", "value")
"""float32 [N,2187] policy logits (`make_move_label` layout) and [N] value (see VALUE_CHOICES)."""
WEIGHT_CHOICES = ("ema", "raw")
"""The checkpoint's averaged weights (`ema`, present when optim.ema_decay > 0) or its trained ones."""
VALUE_CHOICES = ("logit", "probability")
"""The `value` output: the network's own logit, or its sigmoid, the side to move's win probability."""
DEFAULT_VALUE = "logit"
"""Logit by default: it is what the network computes and the loss sees, it keeps full resolution in
decisive positions where a probability rounds to 0 or 1 in an engine's fp16, and the parity check on it
is stricter (sigmoid's slope is at most 1/4, so it shrinks differences). dlshogi-style engines that read a
probability straight from the graph export with `--value probability`."""
METADATA_KEYS = ("tideborn.settings", "tideborn.step", "tideborn.weights", "tideborn.value", "tideborn.version",
                 "tideborn.policy")
"""`metadata_props` every exported model carries; all values are strings (settings as JSON)."""
