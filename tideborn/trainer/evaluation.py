"""Evaluation on held-out teacher data (`data.test`): the losses and accuracies of the `eval` event.

The positions are a fixed sample (seeded by `runtime.seed`, at most `data.eval_positions`) spread over
all test files, decoded once and kept as uint8 planes, so successive evaluations are comparable and cost
only the forward passes.
"""

from __future__ import annotations

import contextlib
import typing

import numpy as np
import torch
import torch.nn.functional as F

from tideborn.config.schema import Settings
from tideborn.data.decode.features import BadRecord, kept_positions
from tideborn.data.decode.legal import LegalLabels
from tideborn.data.decode.legal import mask as legal_mask
from tideborn.data.decode.targets import mixed_value_target, policy_entropy, value_entropy
from tideborn.data.formats.records import RecordSet
from tideborn.data.sets.evalfix import fit_files, scales_by_file
from tideborn.data.sets.sources import BatchDecoder, TeacherSource, as_source, held_out_source, padded_targets
from tideborn.data.training.loader import pins_memory, to_device_batch
from tideborn.errors import UserError
from tideborn.trainer.losses import policy_loss as policy_cross_entropy

DECODE_CHUNK = 4096


def evaluation_indices(records: int, limit: int, seed: int) -> np.ndarray:
    """All record indices when there are at most `limit`, else a seeded sample of `limit`, sorted."""
    if records <= limit:
        return np.arange(records, dtype=np.int64)
    chosen = np.random.default_rng([seed, 0xE7A1]).choice(records, size=limit, replace=False)
    return np.sort(chosen).astype(np.int64)


class Evaluator:
    """Decodes the evaluation sample once; `run(model)` evaluates a model on it."""

    def __init__(self, settings: Settings, device: torch.device, batch_size: int | None = None,
                 records: RecordSet | TeacherSource | None = None):
        records = records if records is not None else held_out_source(settings.data, settings.paths.data_root)
        if records is None:
            raise UserError("data.test: no files given; evaluation needs held-out data")
        records = as_source(records)
        data = settings.data
        self.device = torch.device(device)
        self.pinned = pins_memory(self.device, settings.runtime.pin_memory)
        self.batch_size = batch_size or settings.optim.micro_batch_size
        self.scale_fits = fit_files(records, data.eval_scale) if data.eval_scale_fit == "per_file" else []
        decoder = BatchDecoder(data.eval_scale, settings.loss.value_lambda, data.bad_records, data.policy_temperature,
                               scales_by_file(self.scale_fits))
        indices = evaluation_indices(len(records), data.eval_positions, settings.runtime.seed)
        parts = []
        legal = LegalLabels()
        self.skipped_records = 0
        for start in range(0, len(indices), DECODE_CHUNK):
            chunk = indices[start:start + DECODE_CHUNK]
            try:
                parts.append(decoder.decode(records, chunk))
            except BadRecord as bad:
                raise UserError(f"{records.describe(int(chunk[bad.position]))}: {bad.reason}") from None
            self.skipped_records += len(parts[-1].skipped)
            # sorted indices: what the decoder kept is in the order of `record_groups`
            legal.add_groups(records.record_groups(chunk), kept_positions(len(chunk), parts[-1].skipped))
        records.close()
        self.legal_labels, self.legal_offsets = legal.freeze()
        self.features1 = torch.from_numpy(np.concatenate([p.features1 for p in parts]))
        self.features2 = torch.from_numpy(np.concatenate([p.features2 for p in parts]))
        self.policy = torch.from_numpy(np.concatenate([p.policy for p in parts]))
        self.value = torch.from_numpy(np.concatenate([p.value for p in parts]))
        self.result = torch.from_numpy(np.concatenate([p.result for p in parts]))
        self.policy_labels = self.policy_probs = None
        if any(p.policy_probs is not None for p in parts):  # distributions (hcpe3): one padded [n, K] target
            labels, probs = padded_targets(parts)
            self.policy_labels, self.policy_probs = torch.from_numpy(labels), torch.from_numpy(probs)
        self.eval_value = torch.from_numpy(np.concatenate([p.eval_value for p in parts]))
        if self.pinned:  # pinned once: each batch's copy is then asynchronous
            self.features1, self.features2 = self.features1.pin_memory(), self.features2.pin_memory()
            self.policy, self.value = self.policy.pin_memory(), self.value.pin_memory()
        if not len(self.policy):
            raise UserError(f"data.test: none of the {len(indices)} sampled records has a legal move")

    @property
    def positions(self) -> int:
        return int(self.policy.shape[0])

    @torch.no_grad()
    def run(self, model: torch.nn.Module,
            autocast_ctx: contextlib.AbstractContextManager | typing.Callable[[], typing.Any] | None = None,
            value_lambda: float | None = None) -> dict:
        """`policy_loss`, `value_loss` (BCE against the mixed target: mixed with `value_lambda` when given, the
        weight of a decaying mix at this step, else with `loss.value_lambda`), `policy_accuracy` (top-1),
        `policy_accuracy_legal` (top-1 among the legal moves), `policy_entropy` and `value_entropy` (means, in
        nats), `value_accuracy` (sign of the value logit agrees with the game result; draws left out; None when
        every position is a draw), `positions`, `skipped_records`."""
        if autocast_ctx is None:
            autocast_ctx = contextlib.nullcontext()
        elif not hasattr(autocast_ctx, "__enter__"):
            autocast_ctx = autocast_ctx()  # a factory such as DeviceSetup.autocast
        was_training = model.training
        model.eval()
        totals = torch.zeros(8, dtype=torch.float64, device=self.device)
        try:
            with autocast_ctx:
                for start in range(0, self.positions, self.batch_size):
                    stop = start + self.batch_size
                    item = {"features1": self.features1[start:stop], "features2": self.features2[start:stop],
                            "policy": self.policy[start:stop], "value": self.value[start:stop]}
                    if self.policy_probs is not None:
                        item["policy_labels"] = self.policy_labels[start:stop]
                        item["policy_probs"] = self.policy_probs[start:stop]
                    batch = to_device_batch(item, self.device, self.pinned)
                    result = self.result[start:stop].to(self.device)
                    target = batch.value
                    if value_lambda is not None:
                        target = mixed_value_target(result, self.eval_value[start:stop].to(self.device), value_lambda)
                    policy_logits, value_logit = model(batch.features1, batch.features2)
                    policy_logits, value_logit = policy_logits.float(), value_logit.float()
                    legal = legal_mask(self.legal_labels, self.legal_offsets, start, min(stop, self.positions),
                                       self.device)
                    decisive = result != 0.5
                    agree = (value_logit > 0) == (result > 0.5)
                    totals += torch.stack([
                        policy_cross_entropy(policy_logits, batch, reduction="sum"),
                        F.binary_cross_entropy_with_logits(value_logit, target, reduction="sum"),
                        (policy_logits.argmax(dim=1) == batch.policy).sum(),
                        (agree & decisive).sum(),
                        decisive.sum(),
                        (policy_logits.masked_fill(~legal, -torch.inf).argmax(dim=1) == batch.policy).sum(),
                        policy_entropy(policy_logits).sum(),
                        value_entropy(value_logit).sum(),
                    ]).double()
        finally:
            model.train(was_training)
        policy_loss, value_loss, policy_hits, value_hits, decisive, legal_hits, p_entropy, v_entropy = totals.tolist()
        n = self.positions
        return {
            "policy_loss": policy_loss / n, "value_loss": value_loss / n, "policy_accuracy": policy_hits / n,
            "value_accuracy": value_hits / decisive if decisive else None,
            "policy_accuracy_legal": legal_hits / n, "policy_entropy": p_entropy / n, "value_entropy": v_entropy / n,
            "positions": n, "skipped_records": self.skipped_records,
        }


def evaluate(model: torch.nn.Module, settings: Settings, device: torch.device,
             autocast_ctx: contextlib.AbstractContextManager | typing.Callable[[], typing.Any] | None = None) -> dict:
    """Evaluate `model` on `data.test` (decoding the sample anew; keep an `Evaluator` to decode once)."""
    return Evaluator(settings, device).run(model, autocast_ctx)
