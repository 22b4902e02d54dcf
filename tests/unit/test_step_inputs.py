"""The training step hands the network dense input planes (issue 23, per-step speed): the loader's hand planes
are a stride-0 broadcast, which the CPU convolution copies twice and runs through a slower kernel, so the step
materialises them once itself, in the layout `runtime.channels_last` asks for, on the CPU as on CUDA (oneDNN's
channels_last convolutions are the faster ones there too). The values must stay the loader's."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.data import hcpe_records, random_positions, settings_for, write_records
from tideborn.trainer.device import resolve_device
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.state import TrainingState, teacher_batches


@pytest.mark.parametrize("channels_last", [True, False])
def test_the_step_feeds_the_network_dense_planes_in_the_asked_layout_with_the_loaders_values(tmp_path,
                                                                                           channels_last):
    write_records(tmp_path / "train.hcpe", hcpe_records(random_positions(64, seed=3), seed=3))
    settings = settings_for(tmp_path, "runtime.device=\"cpu\"", "model.blocks=1", "model.channels=8",
                            f"runtime.channels_last={str(channels_last).lower()}", train=["train.hcpe"])
    setup = resolve_device(settings.runtime)
    assert setup.channels_last is channels_last and setup.describe().endswith(", channels_last") is channels_last
    state = TrainingState(settings, setup, DistEnv())
    state.restore(StartPoint())
    twin = teacher_batches(settings, torch.device("cpu"))  # the same batches in the same order
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    state.model.register_forward_pre_hook(lambda _module, inputs: seen.append(inputs))
    try:
        expected = twin.next_batch()
        assert expected.features2.stride()[-1] == 0, "the loader no longer broadcasts: this test needs a new premise"
        state.train_step(0)
    finally:
        twin.close()
        state.close()
    (x1, x2), = seen
    layout = torch.channels_last if channels_last else torch.contiguous_format
    assert x1.is_contiguous(memory_format=layout) and x2.is_contiguous(memory_format=layout), (x1.stride(),
                                                                                               x2.stride())
    convolution = next(m for m in state.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert convolution.weight.is_contiguous(memory_format=layout)
    assert torch.equal(x1, expected.features1) and torch.equal(x2, expected.features2)
