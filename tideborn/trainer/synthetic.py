"""Synthetic batches with the shapes, dtypes and value ranges of real ones, for smoke runs and tests.

The stream is one global sequence of micro-batches; micro-batch `k` depends only on (seed, k). Rank `r`
of `w` takes micro-batches `c + r, c + w + r, ...` from the global cursor `c` (the micro-batches all ranks
have consumed), so a resumed run sees exactly the batches an uninterrupted one would, at any world size. It
also makes a step of 2 ranks x 1 micro-batch see the same positions as a step of 1 rank x 2 micro-batches. The
data is weakly learnable, so a smoke run's loss visibly falls: each position's policy label is also
written as a set bit on plane `label // 81` at square `label % 81`, and the value target is the fraction
of set hand planes.
"""

from __future__ import annotations

import torch

from tideborn.data.training.batch import Batch, DataSummary, SkippedRecords, WindowControl
from tideborn.network.model import FEATURES1_NUM, FEATURES2_NUM, POLICY_CLASSES

PIECE_DENSITY = 0.05
HAND_DENSITY = 0.3


def _mix(seed: int, index: int) -> int:
    return (seed * 0x9E3779B97F4A7C15 + index * 0x94D049BB133111EB) % (2**63)


class SyntheticBatches:
    """An endless, seekable stream of micro-batches generated on `device` (a `BatchSource` with nothing to say
    about files: no summary, no scale fits, no skipped records, no window, no warnings)."""

    summary: DataSummary | None = None
    scale_fits: tuple = ()
    skipped = SkippedRecords()
    window: WindowControl | None = None

    def __init__(self, seed: int, batch_size: int, device: torch.device, rank: int = 0, world_size: int = 1):
        self.seed, self.batch_size, self.device = seed, batch_size, device
        self.rank, self.world_size = rank, world_size
        self.position = 0
        """Micro-batches this rank has taken since step 0 (or since a resume at another world size)."""
        self.global_position = 0
        """The global cursor: micro-batches all ranks together have taken, the same on every rank."""
        self.record_draws = False
        self.drawn: list[tuple[int, list[int]]] = []
        """With `record_draws`: this rank's micro-batches since last cleared, as (k, [k]) (k names its positions)."""
        self._generator = torch.Generator(device=device)

    def next_batch(self) -> Batch:
        index = self.global_position + self.rank
        batch = self.make(index)
        if self.record_draws:
            self.drawn.append((index, [index]))
        self.position += 1
        self.global_position += self.world_size
        return batch

    def make(self, index: int) -> Batch:
        g = self._generator
        g.manual_seed(_mix(self.seed, index))
        n, dev = self.batch_size, self.device
        policy = torch.randint(0, POLICY_CLASSES, (n,), generator=g, device=dev)
        features1 = (torch.rand(n, FEATURES1_NUM, 81, generator=g, device=dev) < PIECE_DENSITY).float()
        rows = torch.arange(n, device=dev)
        features1[rows, torch.remainder(policy // 81, FEATURES1_NUM), policy % 81] = 1.0
        hands = (torch.rand(n, FEATURES2_NUM, 1, 1, generator=g, device=dev) < HAND_DENSITY).float()
        value = hands.flatten(1).mean(dim=1)
        return Batch(features1.view(n, FEATURES1_NUM, 9, 9), hands.expand(n, FEATURES2_NUM, 9, 9).contiguous(),
                     policy, value)

    def state_dict(self) -> dict:
        return {"kind": "synthetic", "position": self.position, "global_position": self.global_position,
                "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if "global_position" in state:
            self.global_position = int(state["global_position"])
        else:  # written before the cursor was global: each rank's count, dealt in turns of the world size then
            self.global_position = int(state["position"]) * int(state.get("world_size", 1))
        same = int(state.get("world_size", 1)) == self.world_size
        self.position = int(state["position"]) if same else self.global_position // self.world_size

    def take_warnings(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing to release; the teacher-data loader's workers need it."""
