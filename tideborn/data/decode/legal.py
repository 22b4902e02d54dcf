"""The legal moves of decoded positions as policy labels: what `policy_accuracy_legal` restricts the top-1 to.

Kept compact (one label per legal move, about 80 per position, not a 2187-wide mask per position); `mask`
makes a batch's boolean mask on the device when it is needed.
"""

from __future__ import annotations

import cshogi
import numpy as np
import torch
from cshogi.dlshogi import make_move_label

from tideborn.data.decode.features import POLICY_CLASSES, packed_positions


class LegalLabels:
    """The policy labels of each position's legal moves, for positions appended in order."""

    def __init__(self) -> None:
        self._labels: list[np.ndarray] = []

    def add(self, records: np.ndarray, kind: str, kept: np.ndarray) -> None:
        """Append the positions `records[kept]` (the records a decoder kept, in order)."""
        board = cshogi.Board()
        set_position = board.set_hcp if kind == "hcpe" else board.set_psfen
        packed = packed_positions(records)
        for i in kept.tolist():
            set_position(packed[i])
            turn = board.turn
            self._labels.append(np.fromiter((make_move_label(move, turn) for move in board.legal_moves),
                                            dtype=np.int16))

    def add_groups(self, groups: list[tuple[np.ndarray, str]], kept: np.ndarray) -> None:
        """Append the kept positions of consecutive record groups (`TeacherSource.record_groups`); `kept` are
        positions in the groups taken together."""
        start = 0
        for records, kind in groups:
            stop = start + len(records)
            inside = kept[(kept >= start) & (kept < stop)]
            self.add(records, kind, inside - start)
            start = stop

    def freeze(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels, offsets): position `i`'s legal labels are `labels[offsets[i]:offsets[i + 1]]`."""
        counts = np.asarray([len(x) for x in self._labels], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat = np.concatenate(self._labels).astype(np.int64) if self._labels else np.zeros(0, np.int64)
        return torch.from_numpy(flat), torch.from_numpy(offsets)


def mask(labels: torch.Tensor, offsets: torch.Tensor, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """[stop - start, 2187] bool: True at the legal moves' labels of positions start..stop-1."""
    first, last = int(offsets[start]), int(offsets[stop])
    counts = offsets[start + 1:stop + 1] - offsets[start:stop]
    rows = torch.repeat_interleave(torch.arange(stop - start), counts)
    found = torch.zeros(stop - start, POLICY_CLASSES, dtype=torch.bool)
    found[rows, labels[first:last]] = True
    return found.to(device)
