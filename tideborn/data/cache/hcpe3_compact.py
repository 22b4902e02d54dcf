"""The positions cache's compact layout: a packed position every few positions, the moves between replayed at read.

A position's 32-byte HuffmanCodedPos is most of what the full layout stores, and the positions of a game
follow each other by one move. So the cache keeps the hcp of an **anchor** only: every ANCHOR_EVERY-th
ply of a game, and any position that does not follow the one before it by one move (a game's first, the one after
a repetition left out); the others are replayed from their anchor with cshogi (`set_hcp`, `push_move16`
of the selected moves between, `to_hcp`: fewer than ANCHOR_EVERY moves). What follows from the position and
its move (the policy labels, the side to move) is computed, what a game shares (its result, number) is
stored with each anchor. At six candidates a position that is about 46 bytes instead of 89:

| array | per | bytes |
| --- | --- | --- |
| `hcp` uint8 [32], `anchor_position` i8, `anchor_game` i4, `anchor_ply` u2, `anchor_result` u1 | anchor | 47 |
| `anchor` uint32, `eval` int16, `move16` uint16, `cand_offsets` int64 | position | 16 |
| `cand_move16`, `cand_visits` uint16 | candidate | 4 |
| `game_offsets` int64 | game | 8 |

`expand` gives the readers the full layout's arrays (`hcp`, `label`, `result`, `game`, `ply`, `cand_label`
...) as `DerivedArray`s computed from these when indexed, so that nothing above the positions changes.
"""

from __future__ import annotations

import typing

import cshogi
import numpy as np
from cshogi.dlshogi import make_move_label

from tideborn.data.cache.cachefile import CacheArray
from tideborn.data.decode.hcpe3_replay import ANCHOR_EVERY, NO_LABEL, anchor_starts, move_labels

COMPACT_NAMES = ("game_offsets", "hcp", "anchor_position", "anchor_game", "anchor_ply", "anchor_result", "anchor",
                 "eval", "move16", "cand_offsets", "cand_move16", "cand_visits")


def compact(arrays: dict[str, np.ndarray], anchor_every: int = ANCHOR_EVERY) -> dict[str, np.ndarray]:
    """The compact layout of the full arrays `arrays` (`hcpe3.build_positions`), as the first open's replay
    writes it without the full layout (`ReplayedPositions(every_hcp=False)`)."""
    game, ply = arrays["game"].astype(np.int64), arrays["ply"].astype(np.int64)
    starts = anchor_starts(game, ply, anchor_every)
    rows = np.flatnonzero(starts)
    return {
        "game_offsets": arrays["game_offsets"],
        "hcp": arrays["hcp"][rows], "anchor_position": rows.astype(np.int64),
        "anchor_game": game[rows].astype(np.int32), "anchor_ply": ply[rows].astype(np.uint16),
        "anchor_result": arrays["result"][rows],
        "anchor": (np.cumsum(starts) - 1).astype(np.uint32),
        "eval": arrays["eval"], "move16": arrays["move16"], "cand_offsets": arrays["cand_offsets"],
        "cand_move16": arrays["cand_move16"], "cand_visits": arrays["cand_visits"],
    }


def consistent(header: dict, arrays: dict[str, typing.Any]) -> bool:
    """The compact arrays agree in length with each other and the header (the CSR offsets are checked by
    the caller; anchors are checked where they are used: `CompactPositions.locate`)."""
    positions, games = int(header["positions"]), int(header["games"])
    anchors = len(arrays["hcp"])
    return set(arrays) == set(COMPACT_NAMES) and arrays["hcp"].shape[1:] == (32,) and \
        all(len(arrays[name]) == positions for name in ("anchor", "eval", "move16")) and \
        all(len(arrays[name]) == anchors for name in ("anchor_position", "anchor_game", "anchor_ply",
                                                      "anchor_result")) and len(arrays["game_offsets"]) == games and \
        len(arrays["cand_move16"]) == len(arrays["cand_visits"]) and (positions == 0 or anchors > 0)


class DerivedArray(CacheArray):
    """An array of the full layout computed from a cache's compact arrays when indexed (an int, a slice, an
    index array, `gather`'s ranges), or whole by `np.asarray`. A `CacheArray` for its readers: read from the
    cache file (which `close_arrays` closes), never held in memory."""

    def __init__(self, owner: CompactPositions, name: str, length: int, dtype: typing.Any,
                 row_shape: tuple[int, ...] = ()):
        super().__init__(owner.stored["eval"].cache, name, 0, dtype, (length, *row_shape))
        self.owner = owner

    def _rows(self, start: int, stop: int, fd: int | None = None) -> np.ndarray:
        return self.take(np.arange(start, stop))

    def gather(self, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        total = int(counts.sum()) if len(counts) else 0
        flat = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)
        return self.take(flat)

    def take(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        flat = indices.reshape(-1)
        if len(flat) and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"rows out of range for {self.name} of {len(self)}")
        return self.owner.fetch(self.name, flat).reshape(*indices.shape, *self.row_shape)

    def __array__(self, dtype: typing.Any = None, copy: typing.Any = None) -> np.ndarray:
        out = self.owner.fetch_all(self.name)
        return out if dtype is None else out.astype(dtype)

    def chunks(self) -> typing.Iterator[np.ndarray]:
        yield np.asarray(self)


class CompactPositions:
    """Reads of the full layout from the compact arrays `stored` (cache arrays, read by `pread`)."""

    def __init__(self, stored: dict[str, typing.Any], damaged: typing.Callable[[str], Exception]):
        self.stored = stored
        self.damaged = damaged
        self._board: cshogi.Board | None = None
        self._located: tuple[bytes, tuple[np.ndarray, np.ndarray]] | None = None
        self._start_hcp: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_board": None, "_located": None, "_start_hcp": None}

    def expand(self) -> dict[str, typing.Any]:
        s = self.stored
        n, c = len(s["eval"]), len(s["cand_move16"])
        return {
            "game_offsets": s["game_offsets"], "hcp": DerivedArray(self, "hcp", n, np.uint8, (32,)),
            "eval": s["eval"], "move16": s["move16"], "result": DerivedArray(self, "result", n, np.uint8),
            "label": DerivedArray(self, "label", n, np.uint16), "game": DerivedArray(self, "game", n, np.int32),
            "ply": DerivedArray(self, "ply", n, np.uint16), "cand_offsets": s["cand_offsets"],
            "cand_move16": s["cand_move16"], "cand_label": DerivedArray(self, "cand_label", c, np.uint16),
            "cand_visits": s["cand_visits"],
        }

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(anchor, steps from it) of each position, checked (a cache damaged in place is the caller's
        `damaged` error, never an index past an array)."""
        key = np.asarray(indices, dtype=np.int64).tobytes()
        if self._located is not None and self._located[0] == key:  # a batch's records, then its targets
            return self._located[1]
        s = self.stored
        anchor = np.asarray(s["anchor"][indices], dtype=np.int64)
        if len(anchor) and anchor.max() >= len(s["hcp"]):
            raise self.damaged("anchor past the stored positions")
        steps = indices - np.asarray(s["anchor_position"][anchor], dtype=np.int64)
        if len(steps) and (steps.min() < 0 or steps.max() > 255):
            raise self.damaged("anchor out of order")
        self._located = key, (anchor, steps)
        self._start_hcp = None
        return anchor, steps

    def start_hcp(self, indices: np.ndarray) -> np.ndarray:
        """The hcp of each position's anchor (kept for the batch: its records, then its targets)."""
        anchor, _ = self.locate(indices)
        if self._start_hcp is None:
            self._start_hcp = np.asarray(self.stored["hcp"][anchor])
        return self._start_hcp

    def turns(self, indices: np.ndarray) -> np.ndarray:
        """The side to move of each position (0 black, 1 white): its anchor's, flipped every move."""
        _, steps = self.locate(indices)
        return (self.start_hcp(indices)[:, 0] & 1).astype(np.int64) ^ (steps & 1)

    def fetch(self, name: str, indices: np.ndarray) -> np.ndarray:
        s = self.stored
        if name == "hcp":
            return self.replay(indices)
        if name == "cand_label":
            offsets = np.asarray(s["cand_offsets"], dtype=np.int64)
            owner = np.searchsorted(offsets, indices, side="right") - 1
            return labels_of(self.turns(owner), np.asarray(s["cand_move16"][indices]))
        if name == "label":
            return labels_of(self.turns(indices), np.asarray(s["move16"][indices]))
        anchor, steps = self.locate(indices)
        if name == "game":
            return np.asarray(s["anchor_game"][anchor]).astype(np.int32)
        if name == "ply":
            return (np.asarray(s["anchor_ply"][anchor]).astype(np.int64) + steps).astype(np.uint16)
        return np.asarray(s["anchor_result"][anchor])  # result: the game's, as its anchor's

    def fetch_all(self, name: str) -> np.ndarray:
        length = len(self.stored["cand_move16"] if name == "cand_label" else self.stored["eval"])
        if name == "cand_label":
            s = self.stored
            counts = np.diff(np.asarray(s["cand_offsets"], dtype=np.int64))
            turns = np.repeat(self.turns(np.arange(len(counts))), counts)
            return labels_of(turns, np.asarray(s["cand_move16"]))
        return self.fetch(name, np.arange(length))

    def replay_plan(self, indices: np.ndarray) -> tuple[np.ndarray, ReplayPlan]:
        """What the batch decoder needs to reach each position itself (`features.Decoder.decode`'s
        `positions`): per position its anchor's hcp with the side-to-move bit set to the position's (what
        the decoder reads the side to move and the kings from), and the plan that sets its board there. The
        decoder sets a board per position anyway: from the anchor, it costs a few pushes more, not a second
        `set_hcp` (which costs more than the features' own share of the decode)."""
        _, steps = self.locate(indices)
        start_hcp = self.start_hcp(indices)
        counts = steps
        flat = np.repeat(indices - counts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        moves = np.asarray(self.stored["move16"][flat]).astype(np.int64)
        packed = start_hcp.copy()
        packed[:, 0] = (packed[:, 0] & 0xFE) | (((start_hcp[:, 0] & 1) ^ (steps & 1)) & 1)
        return packed, ReplayPlan(np.ascontiguousarray(start_hcp), moves,
                                  np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))

    def replay(self, indices: np.ndarray) -> np.ndarray:
        """The hcp of each position: its anchor's, with the selected moves from there played (cshogi)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) > 1 and indices[-1] - indices[0] == len(indices) - 1 and (np.diff(indices) == 1).all():
            return self._replay_range(indices)
        s = self.stored
        _, steps = self.locate(indices)
        start_hcp = self.start_hcp(indices)
        out = np.empty((len(indices), 32), np.uint8)
        replaying = np.flatnonzero(steps)
        out[steps == 0] = start_hcp[steps == 0]
        if not len(replaying):
            return out
        counts = steps[replaying]
        flat = np.repeat(indices[replaying] - counts - (np.cumsum(counts) - counts), counts) + \
            np.arange(int(counts.sum()))
        moves = np.asarray(s["move16"][flat]).tolist()
        if self._board is None:
            self._board = cshogi.Board()
        board = self._board
        set_hcp, push, to_hcp = board.set_hcp, board.push_move16, board.to_hcp
        at = 0
        for row, count in zip(replaying.tolist(), counts.tolist()):
            try:
                set_hcp(start_hcp[row])
            except RuntimeError as exc:
                raise self.damaged(f"undecodable anchor position ({exc})") from None
            for move in moves[at:at + count]:
                push(move)
            at += count
            to_hcp(out[row])
        return out


    def _replay_range(self, indices: np.ndarray) -> np.ndarray:
        """`replay` of consecutive positions (a whole file read in order: averaging, checks): one move and one
        `to_hcp` a position, a `set_hcp` only where a game or a run of positions starts (an anchor)."""
        s = self.stored
        _, steps = self.locate(indices)
        start_hcp = self.start_hcp(indices)
        first = int(indices[0])
        move_array = np.asarray(s["move16"][first - int(steps[0]):int(indices[-1])]).astype(np.int64)
        out = np.empty((len(indices), 32), np.uint8)
        from tideborn.data.decode import compiled  # here: numba's import is for a process that reads hcpe3 positions
        if compiled.replay_range(np.ascontiguousarray(start_hcp), steps, move_array, int(steps[0]), out):
            return out
        moves = move_array.tolist()  # a position or move the compiled loop did not certify: cshogi's replay
        if self._board is None:
            self._board = cshogi.Board()
        board = self._board
        set_hcp, push, to_hcp = board.set_hcp, board.push_move16, board.to_hcp
        lead = int(steps[0])
        for row, step in enumerate(steps.tolist()):
            if row == 0 or step == 0:
                try:
                    set_hcp(start_hcp[row])
                except RuntimeError as exc:
                    raise self.damaged(f"undecodable anchor position ({exc})") from None
                if row == 0:
                    for move in moves[:lead]:
                        push(move)
            else:
                push(moves[lead + row - 1])
            to_hcp(out[row])
        return out


class ReplayPlan:
    """How the decoder reaches position i of a batch: `set_hcp(anchors[i])`, then `push_move16` of
    `moves[bounds[i]:bounds[i + 1]]` (`features.Decoder.decode`)."""

    def __init__(self, anchors: np.ndarray, moves: np.ndarray, bounds: np.ndarray):
        self.anchors = anchors
        """[n, 32] uint8: each position's anchor hcp."""
        self.moves = moves
        """int64 move16s, position i's at `bounds[i]:bounds[i + 1]`."""
        self.bounds = bounds


def labels_of(turns: np.ndarray, move16: np.ndarray) -> np.ndarray:
    """`make_move_label(move16, turn)` of each, by table (a call only for a move16 with stray high bits,
    which the table has no row for and the replay kept as stored)."""
    labels = move_labels()[turns, move16]
    for row in np.flatnonzero(labels == NO_LABEL).tolist():
        labels[row] = make_move_label(int(move16[row]), int(turns[row]))
    return labels
