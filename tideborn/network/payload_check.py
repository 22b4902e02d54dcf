"""What a loaded checkpoint must hold before anything uses it: the types, the step, settings this tideborn
accepts, and tensors of exactly the sizes those settings give.

A `weights_only` load runs no code, but a crafted or foreign file can still hold anything plain data can:
a negative step, a string where a dict belongs, settings that ask for a network of terabytes, weights of
another shape. Each would otherwise surface later as a traceback, a run that fails mid-start, or an
allocation the machine cannot make. The expected sizes come from a network built on the `meta` device,
which has shapes and no storage, so checking a checkpoint allocates nothing whatever its settings say.
"""

from __future__ import annotations

import math
import random

import torch

from tideborn.config.load import settings_from_dict
from tideborn.config.schema import MAX_STEPS_LIMIT, Settings
from tideborn.errors import UserError
from tideborn.network.model import build_model
from tideborn.network.optim import build_optimizer, build_scheduler


class PayloadError(ValueError):
    """What is wrong with a checkpoint's contents, in one line (the caller adds the file's name)."""


def _kind(value: object) -> str:
    return type(value).__name__


def _show(value: object, limit: int = 60) -> str:
    """`repr(value)`, cut short: a crafted value may be megabytes of text, and the message is one line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def _shape(tensor: torch.Tensor) -> str:
    return f"[{', '.join(map(str, tensor.shape))}]"


def check_payload(payload: dict) -> Settings:
    """Raise `PayloadError` unless `payload` is a checkpoint this tideborn can resume, export or print;
    returns its settings. The format markers and required keys are checked by the caller."""
    step = payload["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise PayloadError(f"step is {_kind(step)} {_show(step)}, not a whole number")
    if not 0 <= step <= MAX_STEPS_LIMIT:
        raise PayloadError(f"step {step} is out of range (0 to {MAX_STEPS_LIMIT:,})")
    for key in ("settings", "model", "optimizer", "scheduler", "rng", "data_cursor"):
        if not isinstance(payload[key], dict):
            raise PayloadError(f"{key} is {_kind(payload[key])}, not a dict")
    for key in ("scaler", "ema"):
        if payload.get(key) is not None and not isinstance(payload[key], dict):
            raise PayloadError(f"{key} is {_kind(payload[key])}, not a dict or None")
    world_size = payload.get("world_size", 1)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PayloadError(f"world_size is {_show(world_size)}, not a whole number >= 1")
    try:
        settings = settings_from_dict(payload["settings"], "its settings")
    except UserError as exc:
        raise PayloadError(str(exc)) from None
    with torch.device("meta"):  # shapes without storage: nothing is allocated, whatever the settings say
        model = build_model(settings.model)
        expected = model.state_dict()
        # WeightAverage's (AveragedModel's) layout: the network under `module.`, and a scalar step counter.
        averaged = {**{f"module.{k}": v for k, v in expected.items()}, "n_averaged": torch.zeros((), dtype=torch.long)}
    _check_weights("model", payload["model"], expected, settings)
    if payload.get("ema"):
        _check_weights("ema", payload["ema"], averaged, settings)
    optimizer = build_optimizer(model, settings.optim)
    _check_optimizer(payload["optimizer"], optimizer)
    _check_scheduler(payload["scheduler"], build_scheduler(optimizer, settings.optim, settings.runtime.max_steps))
    if payload.get("scaler"):
        _check_scaler(payload["scaler"])
    _check_rng(payload["rng"])
    _check_cursor(payload["data_cursor"], settings)
    if payload.get("watchdog") is not None:
        _check_watchdog(payload["watchdog"], step)
    threads = payload.get("cpu_threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 4096):
        raise PayloadError(f"cpu_threads is {_show(threads)}, not a whole number from 1 to 4,096")
    return settings


def _check_weights(name: str, state: dict, expected: dict[str, torch.Tensor], settings: Settings) -> None:
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(map(str, missing[:3]))}{', ...' if len(missing) > 3 else ''}")
        if unexpected:
            parts.append(f"unexpected {', '.join(map(_show, unexpected[:3]))}{', ...' if len(unexpected) > 3 else ''}")
        raise PayloadError(f"{name} weights do not match the network its settings describe ({_network(settings)}): "
                           f"{'; '.join(parts)}")
    for key, want in expected.items():
        got = state[key]
        if not isinstance(got, torch.Tensor):
            raise PayloadError(f"{name} weight {key} is {_kind(got)}, not a tensor")
        if got.shape != want.shape:
            raise PayloadError(f"{name} weight {key} is {_shape(got)}, but its settings ({_network(settings)}) "
                               f"make it {_shape(want)}")
        if got.is_floating_point() != want.is_floating_point():
            raise PayloadError(f"{name} weight {key} holds {got.dtype}, not {want.dtype}")


def _network(settings: Settings) -> str:
    m = settings.model
    return f"model.blocks={m.blocks}, model.channels={m.channels}"


def _check_optimizer(state: dict, optimizer: torch.optim.Optimizer) -> None:
    groups, per_param = state.get("param_groups"), state.get("state")
    if not isinstance(groups, list) or not isinstance(per_param, dict):
        raise PayloadError("optimizer state has no param_groups list and state dict")
    if len(groups) != len(optimizer.param_groups):
        raise PayloadError(f"optimizer state has {len(groups)} parameter groups; the network needs "
                           f"{len(optimizer.param_groups)}")
    shapes: dict[int, torch.Size] = {}
    for index, (saved, ours) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        params = saved.get("params") if isinstance(saved, dict) else None
        if not isinstance(params, list) or len(params) != len(ours["params"]):
            raise PayloadError(f"optimizer parameter group {index} does not list the network's "
                               f"{len(ours['params'])} parameters")
        for saved_id, param in zip(params, ours["params"], strict=True):
            if isinstance(saved_id, bool) or not isinstance(saved_id, int):
                raise PayloadError(f"optimizer parameter group {index} lists {_show(saved_id)}, not a parameter number")
            shapes[saved_id] = param.shape
    for saved_id, entry in per_param.items():
        if saved_id not in shapes:
            raise PayloadError(f"optimizer state for parameter {_show(saved_id)}, which no group lists")
        if not isinstance(entry, dict):
            raise PayloadError(f"optimizer state for parameter {saved_id} is {_kind(entry)}, not a dict")
        for key, value in entry.items():
            if value is not None and not isinstance(value, torch.Tensor):
                raise PayloadError(f"optimizer {key} of parameter {saved_id} is {_kind(value)}, not a tensor")
            # Per-parameter buffers (momentum, Adam's moments) have their parameter's shape; counters are scalars.
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shapes[saved_id]:
                raise PayloadError(f"optimizer {key} of parameter {saved_id} is {_shape(value)}, but the "
                                   f"parameter is [{', '.join(map(str, shapes[saved_id]))}]")


def _check_scheduler(state: dict, scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    # LambdaLR.load_state_dict copies every key onto the scheduler object, so a key naming anything else
    # of it (its optimizer, a method) would replace that. Other unknown keys are plain data another torch
    # version wrote (older ones saved `verbose`) and are harmless.
    known = scheduler.state_dict().keys()
    foreign = [key for key in state if key not in known
               and (not isinstance(key, str) or key.startswith("__") or hasattr(scheduler, key))]
    if foreign:
        raise PayloadError(f"scheduler state has foreign key(s) {', '.join(map(_show, foreign[:3]))}")
    last = state.get("last_epoch")
    if isinstance(last, bool) or not isinstance(last, int) or last < 0:
        raise PayloadError(f"scheduler last_epoch is {_show(last)}, not a whole number >= 0")
    lambdas = state.get("lr_lambdas", [])
    if (not isinstance(lambdas, list) or len(lambdas) != len(scheduler.lr_lambdas)
            or not all(item is None or isinstance(item, dict) for item in lambdas)):
        raise PayloadError(f"scheduler lr_lambdas is {_show(lambdas)}, not one None or dict per parameter group")


_SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _check_scaler(state: dict) -> None:
    for key, value in state.items():
        if key not in _SCALER_KEYS:
            raise PayloadError(f"scaler state has an unknown key {_show(key)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PayloadError(f"scaler {key} is {_show(value)}, not a finite number")


def _check_rng(state: dict) -> None:
    try:
        random.Random().setstate(state["python"])  # a scratch generator: the same checks as the real one
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(f"rng python state is unusable ({type(exc).__name__}: {exc})") from None
    saved = state.get("torch")
    if not isinstance(saved, torch.Tensor):
        raise PayloadError(f"rng torch state is {_kind(saved)}, not a tensor")
    try:
        torch.Generator().set_state(saved)
    except (TypeError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PayloadError(f"rng torch state is unusable ({first})") from None
    cuda = state.get("cuda", [])
    if not isinstance(cuda, list) or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda):
        raise PayloadError("rng cuda state is not a list of byte tensors")


def _check_cursor(cursor: dict, settings: Settings) -> None:
    kind = settings.data.resolved_kind
    if cursor.get("kind") != kind:
        raise PayloadError(f"data_cursor is for {_show(cursor.get('kind'))} data; its settings train on {_show(kind)}")
    counters = ("position",) if kind == "synthetic" else ("epoch", "batch_in_epoch")
    for key in counters:
        value = cursor.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PayloadError(f"data_cursor {key} is {_show(value)}, not a whole number >= 0")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_watchdog(state: object, step: int) -> None:
    """The gradient watchdog's saved judge (trainer/watchdog.py): a resumed run judges by it, and automatic
    resume picks its start by `healthy` and `healthy_step`."""
    if not isinstance(state, dict):
        raise PayloadError(f"watchdog is {_kind(state)}, not a dict or None")
    history, seen, streak = state.get("history"), state.get("seen"), state.get("streak")
    if not isinstance(history, list) or not all(_number(n) and math.isfinite(n) and n >= 0 for n in history):
        raise PayloadError(f"watchdog history is {_show(history)}, not a list of finite norms >= 0")
    if not _whole(seen) or seen < 0:
        raise PayloadError(f"watchdog seen is {_show(seen)}, not a whole number >= 0")
    if not isinstance(streak, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and _whole(pair[0]) and _number(pair[1]) for pair in streak):
        raise PayloadError(f"watchdog streak is {_show(streak)}, not a list of [step, norm] pairs")
    if not isinstance(state.get("healthy"), bool):
        raise PayloadError(f"watchdog healthy is {_show(state.get('healthy'))}, not true or false")
    healthy_step = state.get("healthy_step")
    if healthy_step is not None and (not _whole(healthy_step) or not 0 <= healthy_step <= step):
        raise PayloadError(f"watchdog healthy_step is {_show(healthy_step)}, not a step from 0 to {step}")
