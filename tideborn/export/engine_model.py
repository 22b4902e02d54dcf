"""An ONNX policy/value net with dlshogi's interface, run by onnxruntime: ours (`tideborn export`) or anyone's.

The interface is recognised by shapes, not names (dlshogi calls its tensors `input1`/`input2` and
`output_policy`/`output_value`, `tideborn export` `features1`/`features2` and `policy`/`value`): two float
inputs [N,62,9,9] and [N,57,9,9] (`cshogi.dlshogi.make_input_features`' planes, told apart by their channels)
and two float outputs, [N,2187] policy logits and [N] or [N,1] value. Anything else is refused in one line
naming the file, what it has and what was expected.

The value output may be a logit or a probability (dlshogi's own export ends in a Sigmoid; ours writes a logit
unless `--value probability`). Which one is taken from, in order: the caller (`--onnx-value`), the model's
`tideborn.value` metadata, the node that makes the output (a Sigmoid: probability; a Gemm, MatMul, Add or
Conv: logit), and last the outputs on the parity positions (a value outside [0, 1] can only be a logit). When
none of these tells, the model is refused with a line asking for the option rather than guessed at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM

from tideborn.errors import UserError
from tideborn.export.external_data import external_tensors, inline_external_data
from tideborn.export.interface import VALUE_CHOICES
from tideborn.safefile import NotARegularFile, open_regular

POLICY_CLASSES = 2187
"""`cshogi.dlshogi.make_move_label`'s classes (the network module says the same, but importing it costs torch)."""
VALUE_AUTO = "auto"
PROBABILITY_EDGE = 1e-7
"""A probability is clipped to [edge, 1 - edge] before it becomes a logit: fp32 sigmoid saturates at exactly 0
or 1 in decisive positions, whose logit would be infinite. +-16 still orders them above every other."""
_PASS_THROUGH = {"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
"""Nodes between the last real operation and the value output that do not change what it means."""
_LOGIT_MAKERS = {"Gemm", "MatMul", "Add", "Conv"}
_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
EXPECTED = ("two float inputs [N,62,9,9] and [N,57,9,9] (cshogi.dlshogi.make_input_features) and two float "
            "outputs [N,2187] (policy logits) and [N] or [N,1] (value)")


@dataclass(frozen=True)
class EngineInterface:
    """Which tensor of the model is which, as recognised by shape."""
    features1: str
    features2: str
    policy: str
    value: str
    input_dtype: type
    fixed_batch: int | None
    """A model exported with a fixed batch size runs in chunks of exactly that size (the last one padded)."""


@dataclass
class EngineModel:
    """An ONNX file with dlshogi's interface, ready to run: `evaluate` gives policy logits and value logits."""
    path: Path
    session: object
    interface: EngineInterface
    value: str
    """`logit` or `probability`: what the file's value output holds."""
    value_source: str
    """How `value` was decided: option, metadata, graph or outputs."""
    metadata: dict[str, str] = field(default_factory=dict)

    def evaluate(self, features1: np.ndarray, features2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Policy logits [N,2187] float32 and the side to move's value as a logit [N] float32."""
        policy, value = self.raw_outputs(features1, features2)
        if self.value == "probability":
            p = np.clip(value.astype(np.float64), PROBABILITY_EDGE, 1.0 - PROBABILITY_EDGE)
            value = (np.log(p) - np.log1p(-p)).astype(np.float32)
        return policy, value

    def raw_outputs(self, features1: np.ndarray, features2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The model's own policy and value outputs, [N,2187] and [N], as float32."""
        n = len(features1)
        chunk = self.interface.fixed_batch or max(n, 1)
        policies, values = [], []
        for start in range(0, n, chunk):
            x1, x2 = features1[start:start + chunk], features2[start:start + chunk]
            rows = len(x1)
            if rows < chunk:  # only with a fixed batch: pad with empty positions, dropped below
                x1 = np.concatenate([x1, np.zeros((chunk - rows, *x1.shape[1:]), x1.dtype)])
                x2 = np.concatenate([x2, np.zeros((chunk - rows, *x2.shape[1:]), x2.dtype)])
            dtype = self.interface.input_dtype
            policy, value = self.session.run(
                [self.interface.policy, self.interface.value],
                {self.interface.features1: x1.astype(dtype, copy=False),
                 self.interface.features2: x2.astype(dtype, copy=False)})
            policies.append(np.asarray(policy, dtype=np.float32)[:rows])
            values.append(np.asarray(value, dtype=np.float32).reshape(len(value), -1)[:rows, 0])
        if not policies:
            return np.zeros((0, POLICY_CLASSES), np.float32), np.zeros(0, np.float32)
        return np.concatenate(policies), np.concatenate(values)


def looks_like_onnx(head: bytes) -> bool:
    """Whether a file's first bytes may be an ONNX ModelProto: protobuf field 1 (ir_version) as a varint
    comes first in every exporter's output. A PyTorch checkpoint starts with a zip or pickle header."""
    return head[:1] == b"\x08"


def load_engine_model(path: Path, value: str = VALUE_AUTO, threads: int | None = None,
                      providers: list[str] | None = None) -> EngineModel:
    """Open `path` with onnxruntime and recognise its interface; `UserError` (one line naming `path`) if it is
    missing, not ONNX, not runnable, or has other inputs or outputs than dlshogi's. Weights in side files
    (external data, `NAME.onnx.data`) are read from the model's folder, whatever the working directory
    (`tideborn.export.external_data`)."""
    import onnx
    import onnxruntime
    from google.protobuf.message import DecodeError

    if value != VALUE_AUTO and value not in VALUE_CHOICES:
        raise UserError(f"--onnx-value must be auto, {' or '.join(VALUE_CHOICES)}; got {value!r}")
    data = _read(path)
    try:
        proto = onnx.load_model_from_string(data)
    except DecodeError as exc:
        raise UserError(f"{path}: not an ONNX model (protobuf parsing failed: {exc}); expected an ONNX file "
                        f"with {EXPECTED}") from None
    if not proto.graph.node:
        raise UserError(f"{path}: not an ONNX model (no graph in it); expected an ONNX file with {EXPECTED}")
    if external_tensors(proto):  # weights in side files (NAME.onnx.data), read here as the model was
        inline_external_data(path, proto, len(data))
        data = proto.SerializeToString()
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # its warnings about unused initialisers are nothing a user can act on
    if threads:
        options.intra_op_num_threads = threads
    try:
        session = onnxruntime.InferenceSession(data, sess_options=options,
                                               providers=providers or ["CPUExecutionProvider"])
    except _onnxruntime_errors() as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: onnxruntime cannot run this model ({first[:200]})") from None
    interface = recognise(path, session)
    metadata = dict(session.get_modelmeta().custom_metadata_map)
    model = EngineModel(path, session, interface, "logit", "option", metadata)
    model.value, model.value_source = _value_kind(model, proto, value)
    return model


def recognise(path: Path, session) -> EngineInterface:
    """The model's tensors by shape, or `UserError` saying what it has and what was expected."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    has = (f"it has inputs {_tensors(inputs)} and outputs {_tensors(outputs)}")
    refused = UserError(f"{path}: not a net with dlshogi's interface: {has}; expected {EXPECTED}")
    if len(inputs) != 2 or len(outputs) != 2:
        raise refused
    by_channels = {}
    for tensor in inputs:
        shape = tensor.shape
        if (tensor.type not in _TYPES or len(shape) != 4 or list(shape[2:]) != [9, 9]
                or shape[1] not in (FEATURES1_NUM, FEATURES2_NUM)):
            raise refused
        by_channels[shape[1]] = tensor
    if set(by_channels) != {FEATURES1_NUM, FEATURES2_NUM}:
        raise refused
    policy = [t for t in outputs if len(t.shape) == 2 and t.shape[1] == POLICY_CLASSES]
    value = [t for t in outputs if len(t.shape) == 1 or (len(t.shape) == 2 and t.shape[1] == 1)]
    if len(policy) != 1 or len(value) != 1 or policy[0] is value[0] or any(t.type not in _TYPES for t in outputs):
        raise refused
    first, second = by_channels[FEATURES1_NUM], by_channels[FEATURES2_NUM]
    if first.type != second.type:
        raise refused
    batches = {t.shape[0] for t in (*inputs, *outputs)}
    fixed = [b for b in batches if isinstance(b, int)]
    if len(set(fixed)) > 1 or (fixed and fixed[0] < 1):
        raise refused
    return EngineInterface(first.name, second.name, policy[0].name, value[0].name, _TYPES[first.type],
                           fixed[0] if fixed else None)


def _tensors(tensors) -> str:
    texts = [f"{t.name} {list(t.shape)} {t.type.removeprefix('tensor(').rstrip(')')}" for t in tensors]
    return ", ".join(texts) or "none"


def _value_kind(model: EngineModel, proto, asked: str) -> tuple[str, str]:
    """(logit or probability, how it was decided): see the module's docstring for the order."""
    if asked != VALUE_AUTO:
        return asked, "option"
    stored = model.metadata.get("tideborn.value")
    if stored in VALUE_CHOICES:
        return stored, "metadata"
    maker = _value_maker(proto, model.interface.value)
    if maker == "Sigmoid":
        return "probability", "graph"
    if maker in _LOGIT_MAKERS:
        return "logit", "graph"
    from tideborn.export.parity import parity_positions  # torch, only for a model the graph does not explain

    _, values = model.raw_outputs(*parity_positions())
    if not np.isfinite(values).all():
        raise UserError(f"{model.path}: its value output is not finite on ordinary positions")
    if (values < 0).any() or (values > 1).any():
        return "logit", "outputs"
    raise UserError(f"{model.path}: cannot tell whether its value output is a logit or a probability (made by "
                    f"{maker or 'nothing known'}, no tideborn.value metadata, every value in [0, 1]); say which "
                    "with --onnx-value logit or --onnx-value probability")


def _value_maker(proto, output: str) -> str | None:
    """The operation that makes `output`, looking through nodes that only reshape or cast it."""
    makers = {name: node for node in proto.graph.node for name in node.output}
    name = output
    for _ in range(len(proto.graph.node)):
        node = makers.get(name)
        if node is None:
            return None
        if node.op_type not in _PASS_THROUGH or not node.input:
            return node.op_type
        name = node.input[0]
    return None


def _read(path: Path) -> bytes:
    if not path.exists():
        raise UserError(f"{path}: no such ONNX model")
    try:
        with open_regular(path) as handle:
            return handle.read()
    except NotARegularFile as exc:
        raise UserError(f"{path}: {exc.what}") from None
    except OSError as exc:
        raise UserError(f"{path}: unreadable ({exc.strerror or exc})") from None


def _onnxruntime_errors() -> tuple[type[BaseException], ...]:
    """onnxruntime's own exception classes (each derives from Exception directly, with no common base)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
             "InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail")
    return tuple(getattr(state, name) for name in names if isinstance(getattr(state, name, None), type))


def metadata_settings(model: EngineModel) -> dict | None:
    """The tideborn settings an exported model carries (`tideborn.settings`), or None for another's net."""
    text = model.metadata.get("tideborn.settings")
    if not text:
        return None
    try:
        settings = json.loads(text)
    except ValueError:
        return None
    return settings if isinstance(settings, dict) else None
