"""Training objective options beside the plain losses: the value-target mix weight by step (dlshogi's
`--val_lambda_decay_epoch`), mixing the two value targets with it, and the entropies of the two heads (the
entropy bonus, `optim.policy_entropy_beta`, and the `eval` event's figures).

The value loss is binary cross-entropy, which is linear in its target: `BCE(v, (1 - l) r + l e)` equals
`(1 - l) BCE(v, r) + l BCE(v, e)`, dlshogi's `(1 - val_lambda) * loss2 + val_lambda * loss3`. So mixing the
targets with the step's weight and taking one BCE is dlshogi's loss exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tideborn.config.schema import LossSettings


def value_lambda_decays(loss: LossSettings) -> bool:
    """Whether the mix weight changes during training (else the decoder's fixed mix is used, as before)."""
    return loss.value_lambda_decay_steps > 0 and loss.value_lambda_final != loss.value_lambda


def value_lambda_at(step: int, loss: LossSettings) -> float:
    """The mix weight for the update that makes step `step + 1` (0-based `step`, as the learning-rate factor).

    Linear from `value_lambda` at step 0 to `value_lambda_final` at `value_lambda_decay_steps`, then constant.
    dlshogi sets `val_lambda * (1 - epoch / decay_epoch)` (floored at 0) before each epoch: the same line,
    walked in whole epochs; here it moves every step."""
    if loss.value_lambda_decay_steps <= 0:
        return loss.value_lambda
    progress = min(1.0, step / loss.value_lambda_decay_steps)
    return loss.value_lambda + (loss.value_lambda_final - loss.value_lambda) * progress


def mixed_value_target(result: torch.Tensor, eval_value: torch.Tensor, value_lambda: float) -> torch.Tensor:
    """`(1 - lambda) * result + lambda * sigmoid(eval / scale)`, the latter given as `eval_value`."""
    return (1.0 - value_lambda) * result + value_lambda * eval_value


def policy_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per position: the entropy (nats) of the softmax over the 2187 move labels."""
    log_p = F.log_softmax(logits.float(), dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def value_entropy(logit: torch.Tensor) -> torch.Tensor:
    """Per position: the binary entropy (nats) of `sigmoid(logit)`, written with softplus as dlshogi does so
    that a saturated logit gives 0, not NaN."""
    logit = logit.float()
    p = torch.sigmoid(logit)
    softplus = F.softplus(logit)
    return -(p * (logit - softplus) - (1 - p) * softplus)
