"""Optimizer and learning-rate schedule from `[optim]`."""

from __future__ import annotations

import bisect
import math

import torch

from tideborn.config.schema import OptimSettings


def build_optimizer(model: torch.nn.Module, optim: OptimSettings, fused: bool = False) -> torch.optim.Optimizer:
    # Weight decay on convolution and linear weights only: decaying BatchNorm scales and biases only
    # hurts a ResNet (the usual practice in dlshogi-style trainers and torchvision recipes).
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": optim.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if fused else {}
    if optim.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum,
                               nesterov=optim.nesterov and optim.momentum > 0, **extra)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), **extra)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """Restore a checkpoint's optimizer state into `optimizer`, keeping how this run built it.

    `Optimizer.load_state_dict` would take the saved groups' `fused`/`foreach` flags (a checkpoint from a
    CPU run, or from `runtime.fused_optimizer=false`, would silently run another kernel, and fp16's grad
    scaler would hand `found_inf` to a non-fused step, which refuses it) and keep each state tensor's
    memory layout (after a `runtime.channels_last` change, CUDA's fused kernels refuse momentum buffers
    whose strides differ from their parameter's). So the flags come from this run, and every state
    tensor takes its parameter's layout.
    """
    built = [{key: group[key] for key in ("fused", "foreach") if key in group} for group in optimizer.param_groups]
    state_dict = dict(state_dict)
    # Before loading: load_state_dict reads `fused` from these groups to decide where `step` lives.
    state_dict["param_groups"] = [{**saved, **flags} for saved, flags in zip(state_dict["param_groups"], built)]
    optimizer.load_state_dict(state_dict)
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if (isinstance(value, torch.Tensor) and value.shape == param.shape
                        and value.stride() != param.stride()):
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def lr_factor(step: int, optim: OptimSettings, max_steps: int) -> float:
    """The multiplier of `optim.lr` for the update that makes step `step + 1` (0-based `step`)."""
    if optim.warmup_steps and step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return 1.0
    if optim.schedule == "step":
        return optim.decay_gamma ** bisect.bisect_right(optim.decay_steps, step)
    span = max(1, max_steps - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return optim.min_lr_ratio + (1.0 - optim.min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimSettings,
                    max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, optim, max_steps))
