"""What `summary` tells about a network: its layers' output shapes and parameters, and its cost.

One zero-input forward pass gives both: forward hooks record each layer's output, and
`torch.utils.flop_counter.FlopCounterMode` counts the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tideborn.network.model import FEATURES1_NUM, FEATURES2_NUM, ResidualBlock

__all__ = ["LayerRow", "ModelSummary", "format_model_summary", "parameter_bytes", "summarize_model"]


@dataclass(frozen=True)
class LayerRow:
    name: str
    """Qualified module name, e.g. `tower.3` or `value_head.fc1`."""
    kind: str
    """The module's class name, e.g. `Conv2d`, `ResidualBlock`."""
    output_shape: tuple[int, ...]
    """Output shape for one position (no batch dimension)."""
    parameters: int
    """Parameters the module holds, its submodules' included."""


@dataclass(frozen=True)
class ModelSummary:
    rows: tuple[LayerRow, ...]
    """Layers in the order the forward pass runs them."""
    total_parameters: int
    """Every parameter of the model."""
    trainable_parameters: int
    """Parameters with `requires_grad`."""
    flops_per_position: int
    """Forward-pass FLOPs for one position, 2 per multiply-add of the convolutions and linear layers."""


def _row_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules, except that a residual block is one row: a tower of 6-row blocks reads badly."""
    chosen: list[tuple[str, nn.Module]] = []
    block_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in block_prefixes):
            continue
        if isinstance(module, ResidualBlock):
            block_prefixes.append(name + ".")
            chosen.append((name, module))
        elif next(module.children(), None) is None and module is not model:
            chosen.append((name, module))
    return chosen


def summarize_model(model: nn.Module) -> ModelSummary:
    """Shapes, parameters and FLOPs of `model` from one forward pass on a single all-zero position.

    The pass runs in eval mode under `torch.no_grad()` on the model's own device; every module's
    train/eval mode is restored and every hook removed afterwards. FLOPs are what `FlopCounterMode`
    counts: 2 per multiply-add in convolutions and matrix multiplies (linear layers). BatchNorm,
    activations, the residual and stem additions, and biases are not counted; they are a small
    fraction of the total.
    """
    first = next(model.parameters())
    x1 = torch.zeros(1, FEATURES1_NUM, 9, 9, device=first.device, dtype=first.dtype)
    x2 = torch.zeros(1, FEATURES2_NUM, 9, 9, device=first.device, dtype=first.dtype)

    rows: list[LayerRow] = []

    def record(name: str):
        def hook(module: nn.Module, _inputs, output) -> None:
            shape = tuple(output.shape[1:]) if isinstance(output, torch.Tensor) else ()
            rows.append(LayerRow(name, type(module).__name__, shape,
                                 sum(p.numel() for p in module.parameters())))
        return hook

    modes = {module: module.training for module in model.modules()}
    handles = []
    try:
        for name, module in _row_modules(model):
            handles.append(module.register_forward_hook(record(name)))
        model.eval()
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            model(x1, x2)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training

    return ModelSummary(
        rows=tuple(rows),
        total_parameters=sum(p.numel() for p in model.parameters()),
        trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
        flops_per_position=int(counter.get_total_flops()),
    )


def parameter_bytes(model: nn.Module) -> int:
    """Bytes the parameters take in their current dtype (buffers such as BN statistics excluded)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def format_flops(flops: int) -> str:
    """`2.15 GFLOP`, `41.3 MFLOP`, `812 kFLOP`: three significant digits in the largest fitting unit."""
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            value = flops / scale
            decimals = 2 if value < 9.995 else 1 if value < 99.95 else 0
            return f"{value:.{decimals}f} {unit}"
    return f"{flops} FLOP"


def _format_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "-"


def format_model_summary(summary: ModelSummary) -> str:
    """An aligned table of the layers, then the parameter totals and the FLOPs per position."""
    header = ("Layer", "Type", "Output shape", "Params")
    body = [(row.name, row.kind, _format_shape(row.output_shape), f"{row.parameters:,}")
            for row in summary.rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(4)]

    def line(cells: tuple[str, ...]) -> str:
        return (f"{cells[0]:<{widths[0]}}  {cells[1]:<{widths[1]}}  "
                f"{cells[2]:<{widths[2]}}  {cells[3]:>{widths[3]}}")

    rule = "-" * len(line(header))
    lines = [line(header), rule, *(line(cells) for cells in body), rule,
             f"Total parameters:     {summary.total_parameters:,}",
             f"Trainable parameters: {summary.trainable_parameters:,}",
             f"FLOPs:                {format_flops(summary.flops_per_position)} per position (forward)"]
    return "\n".join(lines)
