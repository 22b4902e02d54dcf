"""The policy loss, one-hot or against a distribution, for training, evaluation and the benchmarks.

A batch with `policy_probs` (hcpe3 visit distributions, averaged duplicates) is scored by the cross-entropy
against its sparse distribution, `-sum_k p_k * log_softmax(logits)[label_k]` (dlshogi's
`cross_entropy_loss_with_soft_target`, restricted to the moves with a probability); otherwise by the
plain cross-entropy against the `policy` label, the fast path of pure hcpe/psv runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tideborn.data.training.batch import Batch


def policy_loss(logits: torch.Tensor, batch: Batch, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of `logits` [N, 2187] (computed in float32) against `batch`'s policy target;
    `reduction`: `mean`, `sum` or `none`."""
    logits = logits.float()
    probs = batch.policy_probs
    if probs is None:
        return F.cross_entropy(logits, batch.policy, reduction=reduction)
    log_probs = F.log_softmax(logits, dim=1).gather(1, batch.policy_labels)
    per_position = -(probs.float() * log_probs).sum(dim=1)
    if reduction == "mean":
        return per_position.mean()
    if reduction == "sum":
        return per_position.sum()
    return per_position
