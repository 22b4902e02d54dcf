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
