"""Restoring optimizer state keeps how this run built its optimizer: the fused/foreach choice of this run's
settings and device, and each state tensor in its parameter's memory layout (CUDA's fused kernels refuse
momentum buffers whose strides differ from their parameter's, as after a `runtime.channels_last` change)."""

from __future__ import annotations

import copy

import pytest
import torch

from tideborn.config.schema import ModelSettings, OptimSettings
from tideborn.network.model import build_model
from tideborn.network.optim import build_optimizer, load_optimizer_state

TINY = ModelSettings(blocks=1, channels=8, value_channels=4, value_hidden=16)


def _stepped(optim: OptimSettings, fused: bool, channels_last: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = build_model(TINY)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(model, optim, fused=fused)
    x1, x2 = torch.rand(4, 62, 9, 9), torch.rand(4, 57, 9, 9)
    for _ in range(2):
        policy, value = model(x1, x2)
        (policy.square().mean() + value.square().mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def _fresh(optim: OptimSettings, fused: bool, channels_last: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model(TINY)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, build_optimizer(model, optim, fused=fused)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("saved_fused, run_fused", [(False, True), (True, False)])
def test_the_run_keeps_its_own_fused_choice_over_the_checkpoints(optimizer: str, saved_fused: bool,
                                                                 run_fused: bool) -> None:
    optim = OptimSettings(optimizer=optimizer)
    _, saved = _stepped(optim, fused=saved_fused, channels_last=False)
    assert all(bool(g.get("fused")) is saved_fused for g in saved.param_groups)

    model, restored = _fresh(optim, fused=run_fused, channels_last=False)
    load_optimizer_state(restored, saved.state_dict())

    assert all(bool(g.get("fused")) is run_fused for g in restored.param_groups)
    if optimizer == "adamw":  # a fused optimizer keeps `step` as a float tensor on the parameter's device
        steps = [restored.state[p]["step"] for p in model.parameters()]
        assert all(float(s) == 2.0 for s in steps)
        if run_fused:
            assert all(s.dtype == torch.float32 for s in steps)
    # And it steps: the state it holds suits the kernel it now runs.
    policy, value = model(torch.rand(2, 62, 9, 9), torch.rand(2, 57, 9, 9))
    (policy.square().mean() + value.square().mean()).backward()
    restored.step()


@pytest.mark.parametrize("saved_channels_last, run_channels_last", [(False, True), (True, False)])
def test_state_tensors_take_their_parameters_layout_and_keep_their_values(saved_channels_last: bool,
                                                                          run_channels_last: bool) -> None:
    optim = OptimSettings(optimizer="adamw")
    _, saved = _stepped(optim, fused=False, channels_last=saved_channels_last)
    saved_state = saved.state_dict()
    model, restored = _fresh(optim, fused=False, channels_last=run_channels_last)
    load_optimizer_state(restored, saved_state)

    convolutions = [p for p in model.parameters() if p.ndim == 4]
    assert convolutions and any(not p.is_contiguous() for p in convolutions) is run_channels_last
    # The saved state is indexed by position over the param groups, as load_state_dict maps it.
    for index, param in enumerate(p for group in restored.param_groups for p in group["params"]):
        for key in ("exp_avg", "exp_avg_sq"):
            value = restored.state[param][key]
            assert value.stride() == param.stride(), (index, key)
            assert torch.equal(value, saved_state["state"][index][key]), (index, key)


def test_restored_fused_state_in_another_layout_computes_the_same_update() -> None:
    # On the CPU a fused AdamW does not refuse buffers laid out unlike their parameters: it computes wrong
    # updates. Restored into a channels_last model, the fused step must match a plain continuation.
    optim = OptimSettings(optimizer="adamw")
    model, saved = _stepped(optim, fused=False, channels_last=False)
    state = copy.deepcopy(saved.state_dict())  # as from a file: no tensor shared with `saved`
    moved = build_model(TINY).to(memory_format=torch.channels_last)
    moved.load_state_dict(model.state_dict())
    fused = build_optimizer(moved, optim, fused=True)
    load_optimizer_state(fused, state)

    x1, x2 = torch.rand(4, 62, 9, 9), torch.rand(4, 57, 9, 9)
    for net, optimizer in ((model, saved), (moved, fused)):
        policy, value = net(x1, x2)
        (policy.square().mean() + value.square().mean()).backward()
        optimizer.step()
    for (name, expected), actual in zip(model.named_parameters(), moved.parameters()):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # no steps needed
def test_a_resume_takes_this_runs_rates_and_decay_and_keeps_the_schedules_position() -> None:
    from tideborn.network.optim import build_scheduler, load_scheduler_state, lr_factor

    before = OptimSettings(lr=0.1, weight_decay=1e-4, momentum=0.9, warmup_steps=2)
    model, optimizer = _stepped(before, fused=False, channels_last=False)
    scheduler = build_scheduler(optimizer, before, max_steps=20)
    for _ in range(5):
        scheduler.step()
    after = OptimSettings(lr=0.05, weight_decay=1e-3, momentum=0.5, warmup_steps=2)
    resumed_model, resumed = _fresh(after, fused=False, channels_last=False)
    resumed_scheduler = build_scheduler(resumed, after, max_steps=40)
    load_optimizer_state(resumed, optimizer.state_dict())
    load_scheduler_state(resumed_scheduler, scheduler.state_dict())

    assert [g["weight_decay"] for g in resumed.param_groups] == [1e-3, 0.0]
    assert all(g["momentum"] == 0.5 for g in resumed.param_groups)
    expected_lr = 0.05 * lr_factor(5, after, 40)  # this run's rate and schedule, at the saved position
    assert [g["lr"] for g in resumed.param_groups] == [expected_lr] * 2
    assert resumed_scheduler.get_last_lr() == [expected_lr] * 2 and resumed_scheduler.last_epoch == 5
    # The momentum buffers themselves are the checkpoint's.
    saved_buffers = [s["momentum_buffer"] for s in optimizer.state.values()]
    resumed_buffers = [resumed.state[p]["momentum_buffer"] for g in resumed.param_groups for p in g["params"]]
    assert all(torch.equal(a, b) for a, b in zip(saved_buffers, resumed_buffers))
