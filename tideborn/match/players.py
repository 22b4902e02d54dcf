"""The players of a match behind one small interface: features in, policy logits and value out.

A side of `tideborn match` is a tideborn checkpoint (its network in PyTorch) or an ONNX file with dlshogi's
interface (`tideborn.export.engine_model`, run by onnxruntime), told apart by the file: a `.onnx` name or
ONNX content is a model, anything else is read as a checkpoint (whose loader names what is wrong with it).
Either way `evaluate` takes a batch of `cshogi.dlshogi.make_input_features` planes and returns the policy
logits [N,2187] and the side to move's value as a logit [N], numpy on the CPU, so play does not care which.
A net whose policy or value is not finite on ordinary positions (NaN or inf: weights that overflow, a broken
export) is refused as it is loaded, before it plays a move (`tideborn match`, `tideborn usi`, a run's matches).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from tideborn.errors import UserError


class Player(Protocol):
    info: dict
    """What the report says about the player (path, kind, step, weights, value, ...)."""
    name: str
    """Its name in game records."""

    def evaluate(self, features1: np.ndarray, features2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Policy logits [N,2187] and value logits [N], float32."""


@dataclass
class TorchPlayer:
    net: torch.nn.Module
    device: torch.device | str = "cpu"
    info: dict | None = None
    name: str = "net"

    def evaluate(self, features1: np.ndarray, features2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            x1 = torch.from_numpy(features1).to(self.device)
            x2 = torch.from_numpy(features2).to(self.device)
            policy, value = self.net(x1, x2)
        return policy.float().cpu().numpy(), value.float().cpu().numpy().reshape(-1)


@dataclass
class OnnxPlayer:
    model: object
    """A `tideborn.export.engine_model.EngineModel`."""
    info: dict
    name: str

    def evaluate(self, features1: np.ndarray, features2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.model.evaluate(features1, features2)


def as_player(thing, device: torch.device | str = "cpu") -> Player:
    """A player as is; a bare network (tests, benchmarks) wrapped as one on `device`."""
    if isinstance(thing, torch.nn.Module):
        return TorchPlayer(thing, device, {"kind": "network"})
    return thing


def is_onnx_file(path: Path) -> bool:
    """A `.onnx` name, or a file of another name whose first bytes are an ONNX model's, not a checkpoint's."""
    from tideborn.export.engine_model import looks_like_onnx
    from tideborn.safefile import open_regular

    if path.suffix.lower() == ".onnx":
        return True
    try:
        with open_regular(path) as handle:  # never a FIFO, whose open would block
            return looks_like_onnx(handle.read(1))
    except OSError:
        return False  # the checkpoint loader says what is wrong with it, in its words


def load_player(path: Path, *, weights: str = "auto", device: torch.device | str = "cpu", run_file: bool = False,
                onnx_value: str = "auto", threads: int | None = None) -> Player:
    """The player that `path` holds; `UserError` naming `path` for anything that cannot play."""
    if not run_file and is_onnx_file(path):
        player = _onnx_player(path, device, onnx_value, threads)
    else:
        player = _checkpoint_player(path, weights, device, run_file)
    _check_finite(player, path)
    return player


def _check_finite(player: Player, path: Path) -> None:
    """`UserError` naming `path` when the net's policy or value is NaN or inf on the parity positions (seeded
    random games: ordinary positions, with pieces in hand and checks)."""
    from tideborn.export.parity import parity_positions

    policy, value = player.evaluate(*parity_positions())
    for output, values in (("policy", policy), ("value", value)):
        if not np.isfinite(values).all():
            raise UserError(f"{path}: its {output} output is not finite on ordinary positions")


def _checkpoint_player(path: Path, weights: str, device, run_file: bool) -> TorchPlayer:
    from tideborn.export.onnx_export import choose_weights, reference_module
    from tideborn.network.checkpoint import CheckpointError, load_checkpoint

    try:
        payload = load_checkpoint(path, run_file=run_file)
    except CheckpointError as exc:
        raise UserError(str(exc)) from None
    try:
        kind = choose_weights(payload, weights)
        net = reference_module(payload, kind).to(device)
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    info = {"path": str(path), "kind": "checkpoint", "step": payload["step"], "weights": kind,
            "model": payload.get("settings", {}).get("model"), "value": "logit", "value_source": "checkpoint"}
    return TorchPlayer(net, device, info, _name(path, payload["step"]))


def _onnx_player(path: Path, device, onnx_value: str, threads: int | None) -> OnnxPlayer:
    import onnxruntime

    from tideborn.export.engine_model import load_engine_model, metadata_settings

    providers = ["CPUExecutionProvider"]
    if torch.device(device).type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    model = load_engine_model(path, onnx_value, threads, providers)
    step = model.metadata.get("tideborn.step")
    settings = metadata_settings(model)
    info = {"path": str(path), "kind": "onnx", "step": int(step) if step and step.isdigit() else None,
            "weights": model.metadata.get("tideborn.weights"),
            "model": settings.get("model") if settings else None,
            "value": model.value, "value_source": model.value_source,
            "inputs": [model.interface.features1, model.interface.features2],
            "outputs": [model.interface.policy, model.interface.value],
            "provider": model.session.get_providers()[0]}
    return OnnxPlayer(model, info, f"onnx/{path.name}")


def _name(path: Path, step: int) -> str:
    return f"{path.parent.name}/step-{step}" if path.parent.name else f"step-{step}"
