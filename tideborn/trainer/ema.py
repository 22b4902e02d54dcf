"""The exponential moving average of the weights (`optim.ema_decay`), without host-device syncs.

torch's `AveragedModel` with `get_ema_multi_avg_fn` computes the same average, but its
`update_parameters` reads its step counter as a bool and copies that counter (a CPU tensor) to the device
once per dtype group: blocking copies, two a step on CUDA, which stall the host behind the GPU every step
of every run that keeps an average. `WeightAverage` keeps `AveragedModel`'s module and state_dict layout
(`module.*` keys and the `n_averaged` counter, which checkpoints and `tideborn export` rely on) and
replaces only the update: the counter is read on the host, where it lives, and the device sees nothing
but foreach kernels.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel


class WeightAverage(AveragedModel):
    """`average = decay * average + (1 - decay) * weights` after every step, over parameters and buffers
    (BatchNorm's running statistics); the first update copies the weights. Integer buffers
    (`num_batches_tracked`) are copied, not averaged."""

    def __init__(self, model: nn.Module, decay: float):
        super().__init__(model, use_buffers=True)
        self.decay = decay
        # AveragedModel creates the counter on the CPU (no device given); it must stay there.
        assert self.n_averaged.device.type == "cpu"

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        averaged = list(itertools.chain(self.module.parameters(), self.module.buffers()))
        current = [t.detach() for t in itertools.chain(model.parameters(), model.buffers())]
        if len(averaged) != len(current):
            raise ValueError(f"the average holds {len(averaged)} tensors, the model {len(current)}")
        if int(self.n_averaged) == 0:  # a CPU tensor: reading it never waits for the GPU
            for mine, theirs in zip(averaged, current):
                mine.copy_(theirs)
        else:
            floats = [(mine, theirs) for mine, theirs in zip(averaged, current) if mine.is_floating_point()]
            if floats:
                torch._foreach_lerp_([mine for mine, _ in floats], [theirs for _, theirs in floats], 1.0 - self.decay)
            for mine, theirs in zip(averaged, current):
                if not mine.is_floating_point():
                    mine.copy_(theirs)
        self.n_averaged += 1
