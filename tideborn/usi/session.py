"""An engine made ready to speak USI: the model loaded (`tideborn.match.players.load_player`) and the thinker chosen
for a number of playouts. The net is warmed up and its latency measured later, at `isready`, on the thread that
thinks (`Thinker.warm_up`)."""

from __future__ import annotations

from pathlib import Path

from tideborn.match.search import Searcher
from tideborn.usi.engine import Engine
from tideborn.usi.thinking import PolicyThinker, SearchThinker, Thinker


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
    searcher = Searcher(player)

    def think_with(count: int) -> Thinker:
        return policy if count <= 1 else SearchThinker(searcher, count)

    return Engine(_name(model, player.info), think_with, playouts=playouts)


def _name(model: Path, info: dict) -> str:
    step = info.get("step")
    return f"{model.name}" + (f", step {step}" if step is not None else "")
