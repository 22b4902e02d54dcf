"""A batch of training positions as the training loop takes it, from teacher data (`data.loader`) or
synthetic data (`trainer.synthetic`): input planes and the policy and value targets, as tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    features1: torch.Tensor
    """[N, 62, 9, 9] float, binary planes."""
    features2: torch.Tensor
    """[N, 57, 9, 9] float, each plane all zeros or all ones."""
    policy: torch.Tensor
    """[N] int64 move labels in [0, 2187)."""
    value: torch.Tensor
    """[N] float value targets in [0, 1]."""
    policy_labels: torch.Tensor | None = None
    """[N, K] int64: with `policy_probs`, a policy target distribution per position (hcpe3 visit counts,
    averaged duplicates); None: `policy` is the one-hot target."""
    policy_probs: torch.Tensor | None = None
    """[N, K] float probabilities of `policy_labels` (rows sum to 1; padding has probability 0)."""
    result: torch.Tensor | None = None
    """[N] float game results (teacher data): with `eval_value`, what the trainer mixes when the mix decays."""
    eval_value: torch.Tensor | None = None
    """[N] float `sigmoid(eval / eval_scale)` (teacher data)."""

    def __len__(self) -> int:
        return int(self.policy.shape[0])
