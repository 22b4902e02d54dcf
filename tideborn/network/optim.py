"""Optimizer and learning-rate schedule from `[optim]`."""

from __future__ import annotations

import bisect
import math

import torch

from tideborn.config.schema import OptimSettings


def build_optimizer(model: torch.nn.Module, optim: OptimSettings, fused: bool = False) -> torch.optim.Optimizer:
    # `weights_only` (the default): weight decay on convolution and linear weights only; decaying BatchNorm
    # scales and biases only hurts a ResNet (torchvision's recipes). `all` decays every parameter, as dlshogi
    # does (it hands `model.parameters()` to the optimizer with one weight_decay). The two groups stay either
    # way, so the optimizer state keeps its layout and a run can resume under the other policy.
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": optim.weight_decay},
              {"params": no_decay, "weight_decay": optim.weight_decay if optim.weight_decay_policy == "all" else 0.0}]
    extra = {"fused": True} if fused else {}
    if optim.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum,
                               nesterov=optim.nesterov and optim.momentum > 0, **extra)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), **extra)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """Restore a checkpoint's optimizer state (momentum buffers, step counts) into `optimizer`, keeping
    everything else as this run built it.

    `Optimizer.load_state_dict` would take the saved groups' settings: a changed `optim.lr`,
    `optim.weight_decay`, momentum or betas would be listed in `run_started.changed_settings` and then
    silently ignored; the saved `fused`/`foreach` flags would run another kernel than this run's settings
    and device choose (fp16's grad scaler hands `found_inf` to a fused step, which a non-fused one refuses);
    and each state tensor would keep its saved memory layout (after a `runtime.channels_last` change,
    CUDA's fused kernels need buffers laid out like their parameters, and the CPU's silently compute
    wrong updates). So the groups' settings come from this run (the learning rate is then set by
    `load_scheduler_state`), and every state tensor takes its parameter's layout.
    """
    mine = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    state_dict = dict(state_dict)
    # Before loading: load_state_dict reads `fused` from these groups to decide where `step` lives.
    state_dict["param_groups"] = [{**saved, **ours} for saved, ours in zip(state_dict["param_groups"], mine)]
    optimizer.load_state_dict(state_dict)
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if (isinstance(value, torch.Tensor) and value.shape == param.shape
                        and value.stride() != param.stride()):
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LambdaLR, state_dict: dict) -> None:
    """Restore the schedule's position (its step), with this run's base rate (`optim.lr`) and shape rather
    than the checkpoint's, so that a changed `optim.lr`, schedule or `max_steps` applies from here on. With
    nothing changed the rate is the one a run that never stopped has, to the bit (same formula)."""
    scheduler.load_state_dict(state_dict)
    optimizer = scheduler.optimizer
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


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
