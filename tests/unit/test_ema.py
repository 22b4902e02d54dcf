"""The exponential moving average of the weights: updated every step, checkpointed, resumed exactly."""

from __future__ import annotations

import torch

from tests.helpers.common import train
from tideborn.network.checkpoint import load_checkpoint


def test_no_ema_by_default(tmp_path):
    run = tmp_path / "run"
    train(run, "runtime.max_steps=2", "optim.batch_size=16", cwd=tmp_path)
    assert load_checkpoint(run / "step-000000002.pt")["ema"] is None


def _perturbed(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.is_floating_point():
                tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.1)
            else:
                tensor.add_(1)


def test_the_average_is_torchs_ema_bit_for_bit_and_keeps_its_state_dict_layout():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from tideborn.config.schema import ModelSettings
    from tideborn.network.model import build_model
    from tideborn.trainer.ema import WeightAverage

    torch.manual_seed(0)
    model = build_model(ModelSettings(blocks=1, channels=8, value_channels=4, value_hidden=16))
    ours = WeightAverage(model, 0.9)
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    for seed in range(5):
        _perturbed(model, seed)
        ours.update_parameters(model)
        reference.update_parameters(model)

    mine, theirs = ours.state_dict(), reference.state_dict()
    assert mine.keys() == theirs.keys() and int(mine["n_averaged"]) == 5
    for key, value in mine.items():
        if value.is_floating_point():
            assert torch.equal(value, theirs[key]), key
        elif key.endswith("num_batches_tracked"):  # copied, where torch's would scale an integer by the decay
            assert torch.equal(value, model.state_dict()[key.removeprefix("module.")]), key
    # The average trails the weights.
    weight = "module.stem.board_conv3x3.weight"
    assert not torch.equal(mine[weight], model.state_dict()[weight.removeprefix("module.")])


def test_an_update_moves_nothing_between_host_and_device(monkeypatch):
    # torch's AveragedModel copies its counter to the device (`.to`) for every dtype group, and on CUDA
    # each such copy makes the host wait for the GPU. The average's update must make no such call.
    from tideborn.config.schema import ModelSettings
    from tideborn.network.model import build_model
    from tideborn.trainer.ema import WeightAverage

    model = build_model(ModelSettings(blocks=1, channels=8, value_channels=4, value_hidden=16))
    average = WeightAverage(model, 0.99)
    average.update_parameters(model)
    calls = []
    for name in ("to", "item", "cpu", "cuda", "tolist", "__bool__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _o=original, **k: calls.append(_n) or _o(
            self, *a, **k))
    for _ in range(3):
        average.update_parameters(model)
    monkeypatch.undo()
    assert calls == [], calls
    assert average.n_averaged.device.type == "cpu" and int(average.n_averaged) == 4
