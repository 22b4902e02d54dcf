"""The parity check: an exported ONNX model, run by onnxruntime, against the PyTorch network it came from.

Both run in fp32 on the CPU over fixed real positions: the positions reached by seeded random legal
games (cshogi), encoded by `cshogi.dlshogi.make_input_features` exactly as the engine encodes them.
onnxruntime runs them one at a time and as one batch, so the dynamic batch axis is exercised too.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import cshogi
import numpy as np
import torch
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_input_features

from tideborn.network.model import POLICY_CLASSES

TOLERANCE = 1e-4
"""Largest absolute difference allowed between onnxruntime's and PyTorch's outputs, fp32 on the CPU."""
FP32_REACH = 1e3
"""Output magnitude past which fp32 rounding (~1.2e-7 relative) alone can exceed `TOLERANCE`."""
POSITIONS = 16
BATCH_SIZES = (1, POSITIONS)
"""Batch sizes onnxruntime runs the positions at; neither is the exporter's example batch of 2."""
SEED = 7
MAX_PLIES = 160


class ParityError(Exception):
    """onnxruntime's outputs differ from PyTorch's by more than `TOLERANCE` (or have the wrong shape)."""


@dataclass(frozen=True)
class ParityResult:
    policy_max_abs_diff: float
    value_max_abs_diff: float
    positions: int
    batch_sizes: tuple[int, ...]


def parity_positions(count: int = POSITIONS, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """`count` positions ([N,62,9,9] and [N,57,9,9] float32) from seeded random legal games.

    Game i plays a random number (0 to MAX_PLIES) of uniformly random legal moves from the start
    position, stopping early at a position with no legal move; by then most games have pieces in hand,
    promoted pieces and checks, which the start position alone would not exercise.
    """
    rng = random.Random(seed)
    features1 = np.zeros((count, FEATURES1_NUM, 9, 9), dtype=np.float32)
    features2 = np.zeros((count, FEATURES2_NUM, 9, 9), dtype=np.float32)
    board = cshogi.Board()
    for index in range(count):
        board.reset()
        for _ in range(rng.randrange(MAX_PLIES + 1)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        make_input_features(board, features1[index], features2[index])
    return features1, features2


def check_parity(onnx_path: Path, reference: torch.nn.Module, tolerance: float = TOLERANCE) -> ParityResult:
    """Run `onnx_path` in onnxruntime and `reference` (fp32, eval mode) in PyTorch on the parity positions.

    Returns the largest differences; raises `ParityError` if either exceeds `tolerance`, if an output
    is missing or misshapen, or if the outputs are not finite.
    """
    import onnxruntime

    features1, features2 = parity_positions()
    reference = reference.eval().float().cpu()
    with torch.no_grad():
        policy_ref, value_ref = (t.numpy() for t in reference(torch.from_numpy(features1),
                                                             torch.from_numpy(features2)))
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    if names != ["policy", "value"]:
        raise ParityError(f"parity check failed: the model's outputs are {names}, expected ['policy', 'value']")
    policy_diff = value_diff = 0.0
    for batch in BATCH_SIZES:
        for start in range(0, len(features1), batch):
            rows = slice(start, start + batch)
            policy, value = session.run(["policy", "value"],
                                        {"features1": features1[rows], "features2": features2[rows]})
            size = len(features1[rows])
            if policy.shape != (size, POLICY_CLASSES) or value.shape != (size,):
                raise ParityError(f"parity check failed: at batch {size} onnxruntime gave policy {list(policy.shape)} "
                                  f"and value {list(value.shape)}, expected [{size}, {POLICY_CLASSES}] and [{size}]")
            policy_diff = _worst(policy_diff, _max_abs_diff(policy, policy_ref[rows]))
            value_diff = _worst(value_diff, _max_abs_diff(value, value_ref[rows]))
    result = ParityResult(policy_diff, value_diff, len(features1), BATCH_SIZES)
    if not (policy_diff <= tolerance and value_diff <= tolerance):
        raise ParityError(
            f"parity check failed: max |onnxruntime - PyTorch| is {policy_diff:.3g} for policy and "
            f"{value_diff:.3g} for value over {len(features1)} positions at batch sizes "
            f"{' and '.join(map(str, BATCH_SIZES))} (tolerance {tolerance:g}, fp32){_hint(policy_ref, value_ref)}")
    return result


def _hint(policy: np.ndarray, value: np.ndarray) -> str:
    """Why the check may have failed when the reference itself is suspect."""
    if not (np.isfinite(policy).all() and np.isfinite(value).all()):
        return "; PyTorch's own outputs are not finite"
    largest = float(max(np.abs(policy).max(), np.abs(value).max()))
    if largest > FP32_REACH:
        # fp32 holds about 7 significant digits: at this magnitude rounding alone exceeds the tolerance.
        return (f"; PyTorch's own outputs reach {largest:.3g}, beyond what fp32 can match to the tolerance "
                "(the weights look diverged)")
    return ""


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """NaN when any difference is not finite (an inf on both sides is no agreement either)."""
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(diff.max(initial=0.0)) if np.isfinite(diff).all() else math.nan


def _worst(a: float, b: float) -> float:
    # Python's max() drops a NaN depending on argument order; a NaN must win so the check fails.
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)
