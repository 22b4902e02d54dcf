"""The EMA weights are saved in checkpoints, and a run stopped and resumed keeps them exactly."""

from __future__ import annotations

import torch

from tests.helpers.common import events_of, step_events, train
from tideborn.network.checkpoint import load_checkpoint


def test_ema_is_saved_and_resumes_exactly(tmp_path):
    straight, pieces = tmp_path / "straight", tmp_path / "pieces"
    train(straight, *SETS, cwd=tmp_path)
    train(pieces, *SETS, cwd=tmp_path, extra=("--stop-at-step", "4"))
    train(pieces, *SETS, cwd=tmp_path)
    a = load_checkpoint(straight / "step-000000008.pt")
    b = load_checkpoint(pieces / "step-000000008.pt")
    assert a["ema"] is not None and int(a["ema"]["n_averaged"]) == 8
    assert a["ema"].keys() == b["ema"].keys()
    assert all(torch.equal(a["ema"][k], b["ema"][k]) for k in a["ema"])
    # The average trails the weights: after 8 steps at decay 0.9 it differs from them.
    weight = "module.stem.board_conv3x3.weight"
    assert not torch.equal(a["ema"][weight], a["model"][weight.removeprefix("module.")])
    assert [e["loss"] for e in step_events(events_of(pieces))] == [e["loss"] for e in step_events(events_of(straight))]


SETS = ("runtime.max_steps=8", "runtime.log_every=1", "runtime.checkpoint_every=4", "optim.batch_size=16",
        "optim.ema_decay=0.9")
