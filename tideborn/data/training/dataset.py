"""The data order: a seeded permutation of all training records, new each epoch, cut into rank shards and
micro-batches, addressed by a cursor (epoch, batch) so a resumed run reads exactly what an unbroken one would.

The permutation is a keyed Feistel network over the record indices (with cycle walking to fit any
count): any position of any epoch's order is computed on demand in O(1) memory, so a billion-record set
needs no 8 GB index array per rank, and jumping to a saved cursor costs nothing.

Epoch `e`'s order is `p_e(0), p_e(1), ...`; rank `r` of `w` takes positions `r, r + w, r + 2w, ...`
(`len // w` of them, so every rank has the same number of batches), and its batch `j` is the records at
its positions `j * B ... (j + 1) * B - 1`. The records a rank's last partial batch would hold are left
out that epoch (drop-last); a different few each epoch, since the order changes.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass

import numpy as np

_ROUNDS = 6
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash, vectorised (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class EpochPermutation:
    """A bijection of [0, n) keyed by (seed, epoch): `permute(positions) -> record indices`."""

    def __init__(self, n: int, seed: int, epoch: int):
        if n < 1:
            raise ValueError("a permutation needs at least one element")
        self.n = n
        half_bits = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
        self.half_bits = np.uint64(half_bits)
        self.half_mask = np.uint64((1 << half_bits) - 1)
        keys = np.random.SeedSequence([seed, epoch, 0x7E1DB0]).generate_state(_ROUNDS, dtype=np.uint64)
        self.keys = [np.uint64(k) for k in keys]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half_bits, x & self.half_mask
        for key in self.keys:
            left, right = right, left ^ (_mix64(right ^ key) & self.half_mask)
        return (left << self.half_bits) | right

    def permute(self, positions: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            x = self._feistel(np.asarray(positions, dtype=np.uint64))
            # Cycle walking: the network permutes [0, 4^k) >= n; stepping on until a value lands below n
            # keeps it a bijection of [0, n). Fewer than 4 steps on average, since 4^k < 4n.
            outside = x >= np.uint64(self.n)
            while outside.any():
                x[outside] = self._feistel(x[outside])
                outside = x >= np.uint64(self.n)
        return x.astype(np.int64)


@dataclass(frozen=True)
class ShardedOrder:
    """Which records rank `rank` of `world_size` reads in each micro-batch of each epoch."""

    records: int
    seed: int
    batch_size: int
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.records < self.world_size:
            raise ValueError(f"{self.records} records cannot be shared among {self.world_size} ranks")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")

    @property
    def shard_records(self) -> int:
        """Records each rank reads per epoch, before drop-last."""
        return self.records // self.world_size

    @property
    def batches_per_epoch(self) -> int:
        """Full micro-batches per epoch; one short batch when a shard is smaller than a batch."""
        return max(1, self.shard_records // self.batch_size)

    def batch_indices(self, epoch: int, batch: int) -> np.ndarray:
        """Global record indices of this rank's micro-batch `batch` of `epoch`."""
        if not 0 <= batch < self.batches_per_epoch:
            raise IndexError(f"batch {batch} outside epoch of {self.batches_per_epoch} batches")
        start = batch * self.batch_size
        stop = min(start + self.batch_size, self.shard_records)
        positions = np.arange(start, stop, dtype=np.int64) * self.world_size + self.rank
        return _permutation(self.records, self.seed, epoch).permute(positions)

    def following(self, epoch: int, batch: int) -> tuple[int, int]:
        """The cursor after (epoch, batch)."""
        batch += 1
        return (epoch + 1, 0) if batch >= self.batches_per_epoch else (epoch, batch)


@functools.lru_cache(maxsize=4)
def _permutation(records: int, seed: int, epoch: int) -> EpochPermutation:
    return EpochPermutation(records, seed, epoch)


@dataclass(frozen=True)
class GlobalOrder:
    """The training order as one global stream, whatever the world size: epoch `e`'s positions cut into global
    micro-batches of `micro_batch` records (global micro-batch `g` is positions `g * m ... (g + 1) * m - 1` of
    `p_e`), `accumulation` x `world_size` of them per optimizer step. Within a step, rank `r`'s micro-batch `i`
    is global micro-batch `i * world_size + r` (the synthetic stream deals them the same way), so a step of 2
    ranks x 1 micro-batch reads what a step of 1 rank x 2 micro-batches reads, micro-batch for micro-batch.

    The cursor (epoch, global micro-batch) is the same on every rank and means the same at any world size: a
    run resumed with other ranks continues the same global sequence. An epoch is a whole number of steps
    (drop-last at the global batch): with the global batch held constant, the epochs break at the same
    positions too. A set smaller than one global batch gives one step of shorter micro-batches each epoch.
    """

    records: int
    seed: int
    micro_batch: int
    world_size: int = 1
    accumulation: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.records < self.world_size * self.accumulation:
            raise ValueError(f"{self.records} records cannot be shared among {self.world_size} ranks x "
                             f"{self.accumulation} micro-batches")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")

    @property
    def micros_per_step(self) -> int:
        return self.world_size * self.accumulation

    @property
    def global_batch(self) -> int:
        return self.micros_per_step * self.micro_batch

    @property
    def micro_size(self) -> int:
        """Records per micro-batch: `micro_batch`, or fewer when the set is smaller than one global batch."""
        return self.micro_batch if self.records >= self.global_batch else self.records // self.micros_per_step

    @property
    def micros_per_epoch(self) -> int:
        """Global micro-batches per epoch, a whole number of steps."""
        steps = max(1, self.records // (self.micro_size * self.micros_per_step))
        return steps * self.micros_per_step

    def micro_indices(self, epoch: int, micro: int) -> np.ndarray:
        """Global record indices of global micro-batch `micro` of `epoch`."""
        if not 0 <= micro < self.micros_per_epoch:
            raise IndexError(f"micro-batch {micro} outside epoch of {self.micros_per_epoch}")
        start = micro * self.micro_size
        return _permutation(self.records, self.seed, epoch).permute(np.arange(start, start + self.micro_size))

    def step_start(self, epoch: int, micro: int) -> tuple[int, int]:
        """Where a step starting at cursor (epoch, micro) really starts: the next epoch when this one has no
        room left for a whole step (a cursor written at another global batch may leave a remainder)."""
        return (epoch + 1, 0) if micro + self.micros_per_step > self.micros_per_epoch else (epoch, micro)

    def rank_cursors(self, epoch: int, micro: int) -> typing.Iterator[tuple[int, int]]:
        """This rank's micro-batches from the step starting at (epoch, micro) on, endlessly."""
        while True:
            epoch, micro = self.step_start(epoch, micro)
            for i in range(self.accumulation):
                yield epoch, micro + i * self.world_size + self.rank
            micro += self.micros_per_step
