"""A checkpoint payload's network as an ONNX model for the engine, published only after it passes the
parity check against PyTorch.

Interface (docs/export.md): inputs `features1` [N,62,9,9] and `features2` [N,57,9,9] float32, outputs
`policy` [N,2187] logits and `value` [N] (a logit or a probability), N dynamic. The model is written to a
hidden temp file beside `out`, checked with onnxruntime, then renamed over `out`; a model that fails
the check is renamed to `out` + `.failed` instead, so `out` only ever holds a checked model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import tideborn
from tideborn.config.schema import ModelSettings, SettingError
from tideborn.errors import UserError
from tideborn.export.interface import (
    DEFAULT_VALUE,
    INPUT_NAMES,
    METADATA_KEYS,
    OUTPUT_NAMES,
    VALUE_CHOICES,
    WEIGHT_CHOICES,
)
from tideborn.export.parity import ParityError, check_parity
from tideborn.network.model import FEATURES1_NUM, FEATURES2_NUM, build_model
from tideborn.outputs import StagedOutputs, check_output_path
from tideborn.safefile import publish, remove_stale_temps

OPSET = 18
"""The dynamo exporter's own opset. Asking for an older one goes through a version converter that (in
torch 2.13) quietly keeps 18 for ops it cannot lower, e.g. Mish; an engine whose ONNX parser stops
below 18 needs a converter of its own."""
FAILED_SUFFIX = ".failed"
_EXAMPLE_BATCH = 2
"""torch.export specialises batch sizes 0 and 1, so the example batch must be at least 2."""


class ExportInputError(UserError):
    """A payload or request that cannot be exported: no EMA weights, weights that do not fit the
    settings, an output path that cannot be written. One line; the CLI exits with status 2."""


@dataclass(frozen=True)
class ExportReport:
    path: Path
    """Where the checked model now is."""
    step: int
    """The checkpoint's step."""
    weights: str
    """`ema` or `raw`: the weights exported."""
    value: str
    """`logit` or `probability`: what the `value` output holds."""
    opset: int
    bytes: int
    seconds: float
    """Export and parity check together."""
    policy_max_abs_diff: float
    value_max_abs_diff: float
    parity_positions: int
    parity_batch_sizes: tuple[int, ...]

    def event_fields(self) -> dict:
        """Plain data for an `export` event (`step` is the caller's to add)."""
        return {"path": str(self.path), "weights": self.weights, "value": self.value, "opset": self.opset,
                "bytes": self.bytes, "seconds": self.seconds, "policy_max_abs_diff": self.policy_max_abs_diff,
                "value_max_abs_diff": self.value_max_abs_diff, "parity_positions": self.parity_positions,
                "parity_batch_sizes": list(self.parity_batch_sizes)}


class EngineNet(nn.Module):
    """The network as the engine sees it: policy logits, and the value as a logit or a probability."""

    def __init__(self, net: nn.Module, value: str):
        super().__init__()
        self.net = net
        self.value = value

    def forward(self, features1: torch.Tensor, features2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        policy, value = self.net(features1, features2)
        return policy, torch.sigmoid(value) if self.value == "probability" else value


def choose_weights(payload: dict, weights: str = "auto") -> str:
    """`ema` or `raw`: `auto` takes the EMA weights when the checkpoint holds them."""
    if weights != "auto" and weights not in WEIGHT_CHOICES:
        raise ExportInputError(f"weights must be auto, {' or '.join(WEIGHT_CHOICES)}; got {weights!r}")
    has_ema = bool(payload.get("ema"))
    if weights == "ema" and not has_ema:
        raise ExportInputError("this checkpoint holds no EMA weights (it was saved with optim.ema_decay=0); "
                               "export its raw weights with --weights raw")
    if weights == "auto":
        return "ema" if has_ema else "raw"
    return weights


def plain_state_dict(state: dict) -> dict:
    """A network state_dict from the checkpoint's `model` or `ema` entry.

    The EMA is saved as `torch.optim.swa_utils.AveragedModel.state_dict()`: the network's keys under
    `module.`, plus an `n_averaged` counter, which is dropped here.
    """
    state = {key: value for key, value in state.items() if key != "n_averaged"}
    for prefix in ("module.", "_orig_mod."):
        if state and all(key.startswith(prefix) for key in state):
            state = {key[len(prefix):]: value for key, value in state.items()}
    return state


def reference_module(payload: dict, weights: str = "auto", value: str = DEFAULT_VALUE) -> EngineNet:
    """The network of `payload` with the chosen weights, fp32 on the CPU in eval mode, wrapped for export."""
    if value not in VALUE_CHOICES:
        raise ExportInputError(f"value must be one of {', '.join(VALUE_CHOICES)}; got {value!r}")
    kind = choose_weights(payload, weights)
    stored = payload.get("settings", {}).get("model")
    try:
        model_settings = ModelSettings(**stored)
    except (TypeError, SettingError) as exc:
        raise ExportInputError(f"the checkpoint's model settings {stored!r} do not describe a network this "
                               f"tideborn builds ({exc})") from None
    state = plain_state_dict(payload["ema" if kind == "ema" else "model"])
    broken = [key for key, tensor in state.items()
              if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    if broken:
        raise ExportInputError(f"the checkpoint's {kind} weights hold NaN or inf (in {', '.join(broken[:3])}"
                               f"{', ...' if len(broken) > 3 else ''}); export an earlier checkpoint")
    net = build_model(model_settings)
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ExportInputError(f"the checkpoint's {kind} weights do not fit its model settings ({first})") from None
    return EngineNet(net, value).eval().float()


def export_onnx(payload: dict, out_path: Path, weights: str = "auto", value: str = DEFAULT_VALUE) -> ExportReport:
    """Export `payload`'s network to `out_path`, check parity, and publish it atomically.

    Raises `ExportInputError` for a request that cannot be met (nothing is written) and `ParityError`
    when the check fails (the model is left at `out_path` + `.failed`, `out_path` is untouched).
    """
    started = time.perf_counter()
    out_path = Path(out_path)
    if out_path.is_dir():
        raise ExportInputError(f"--out {out_path}: is a directory; name the model file, e.g. {out_path / 'model.onnx'}")
    if not out_path.parent.is_dir():
        raise ExportInputError(f"--out {out_path}: directory {out_path.parent} does not exist")
    check_output_path(out_path, "--out")
    check_output_path(out_path.with_name(out_path.name + FAILED_SUFFIX), "--out (for a model that fails the check)")
    remove_stale_temps(out_path)  # left by an export that was killed (SIGKILL, a power cut)
    kind = choose_weights(payload, weights)
    reference = reference_module(payload, kind, value)
    model = to_onnx(reference)
    add_metadata(model, payload, kind, value)
    # Written like the data tools' outputs: a 0o644 temp file (whatever the umask), a full disk named as
    # such, no temp file left by an error or Ctrl-C, and one left by a killed export removed now.
    with StagedOutputs() as staged:
        temp = staged.write(out_path, lambda handle: handle.write(model.SerializeToString()))
        try:
            parity = check_parity(temp, reference)
        except ParityError as exc:
            failed = out_path.with_name(out_path.name + FAILED_SUFFIX)
            publish([(temp, failed)])
            raise ParityError(f"{exc}; the model was left at {failed}, not at {out_path}") from None
        staged.publish()
    return ExportReport(out_path, int(payload["step"]), kind, value, OPSET, out_path.stat().st_size,
                        time.perf_counter() - started, parity.policy_max_abs_diff, parity.value_max_abs_diff,
                        parity.positions, parity.batch_sizes)


def to_onnx(module: nn.Module):
    """The ONNX ModelProto of `module` (fp32, CPU, eval mode) with a dynamic batch axis.

    The exporter is the dynamo one (`torch.export` underneath), not the TorchScript one: from torch 2.9
    it is the default and the TorchScript exporter is deprecated; its batch axis is a declared symbolic
    dimension that export checks (a model that would bake in the example's batch size fails at export
    instead of at the engine); and its graph optimiser folds each BatchNorm into the convolution before
    it. Both exporters give parity within 1e-6 here; this one costs a few seconds more per export and
    needs `onnxscript`.
    """
    example = (torch.zeros(_EXAMPLE_BATCH, FEATURES1_NUM, 9, 9), torch.zeros(_EXAMPLE_BATCH, FEATURES2_NUM, 9, 9))
    batch = torch.export.Dim("batch")
    with _quiet_exporter():
        program = torch.onnx.export(module, example, dynamo=True, input_names=list(INPUT_NAMES),
                                    output_names=list(OUTPUT_NAMES), opset_version=OPSET, verbose=False,
                                    dynamic_shapes={"features1": {0: batch}, "features2": {0: batch}})
    return program.model_proto


@contextlib.contextmanager
def _quiet_exporter():
    """Silence the exporter's chatter about its own internals (pytree deprecations, torchvision ops it
    skips registering): nothing a user can act on, and the parity check judges the result."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def add_metadata(model, payload: dict, weights: str, value: str) -> None:
    """Record where the model came from in its `metadata_props` (interface.METADATA_KEYS, all strings)."""
    step = int(payload["step"])
    props = dict(zip(METADATA_KEYS, (
        json.dumps(payload["settings"], sort_keys=True), str(step), weights, value, tideborn.__version__,
        "logits over cshogi.dlshogi.make_move_label's 2187 classes (direction * 81 + square)",
    ), strict=True))
    for key, text in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, text
    model.doc_string = (f"DLManaka policy/value network, step {step}, {weights} weights, value as a {value}; "
                        f"exported by tideborn {tideborn.__version__}")
