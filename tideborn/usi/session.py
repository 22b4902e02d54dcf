"""An engine made ready to speak USI: the model loaded (`tideborn.match.players.load_player`), its latency measured,
and the thinker chosen for a number of playouts."""

from __future__ import annotations

from pathlib import Path

from tideborn.errors import UserError
from tideborn.usi.engine import Engine
from tideborn.usi.thinking import PolicyThinker, Thinker, measure_latency_ms


def open_engine(model: Path, *, playouts: int = 1, threads: int | None = None, device: str = "cpu",
                weights: str = "auto", onnx_value: str = "auto") -> Engine:
    """The engine for `model`; `UserError` (naming the file or the option) for anything that cannot play."""
    import torch

    from tideborn.match.players import load_player
    from tideborn.match.run import choose_device

    if threads:
        torch.set_num_threads(threads)
    player = load_player(model, weights=weights, device=choose_device(device), onnx_value=onnx_value,
                         threads=threads)
    policy = PolicyThinker(player)
    latency_ms = measure_latency_ms(policy)

    def think_with(count: int) -> Thinker:
        if count <= 1:
            return policy
        raise UserError(f"Playouts {count}: this build has no search; use 0 or 1 (policy play)")

    if playouts > 1:
        raise UserError(f"--playouts {playouts}: this build has no search; use 0 or 1 (policy play)")
    return Engine(_name(model, player.info), think_with, playouts=playouts, latency_ms=latency_ms)


def _name(model: Path, info: dict) -> str:
    step = info.get("step")
    return f"{model.name}" + (f", step {step}" if step is not None else "")
