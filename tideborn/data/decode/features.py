"""Records into network inputs and targets: dlshogi's planes, the move label, the value target.

Inputs come from `cshogi.dlshogi.make_input_features`; the policy label is `make_move_label(move, side
to move)`; the value target is `(1 - lambda) * result + lambda * sigmoid(eval / eval_scale)`, with the
result (1 win, 0.5 draw, 0 loss) and the eval both from the side to move's point of view:

- hcpe `gameResult` is absolute: cshogi's DRAW 0, BLACK_WIN 1, WHITE_WIN 2 (dlshogi's `make_result`
  turns it into the side to move's result); `eval` is already the side to move's.
- psv `game_result` is the side to move's: 1 win, 0 draw, -1 loss (YaneuraOu's PackedSfenValue);
  `score` is the side to move's; `move` is YaneuraOu's 16-bit move (`Board.move_from_psv`).

Planes are handed over as uint8 (they are 0/1; `loader.to_device_batch` widens them to float on the
target device), and the 57 hand/check planes as one byte per plane, since each of those planes is all
zeros or all ones: 5 KB per position to move between processes and to a GPU instead of 39 KB.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import cshogi
import numpy as np
from cshogi.dlshogi import FEATURES1_NUM, FEATURES2_NUM, make_move_label

from tideborn.data.decode.hcpe3_ops import SLOW

POLICY_CLASSES = 27 * 81
EVAL_LIMIT = 32767
"""|eval| above this is out of range: int16's -32768 is not a score any engine writes."""
PIECE_LIMITS = {1: ("pawns", 18), 2: ("lances", 4), 3: ("knights", 4), 4: ("silvers", 4),
                5: ("bishops", 2), 6: ("rooks", 2), 7: ("golds", 4)}
_HAND_TO_PIECE_TYPE = (1, 2, 3, 4, 7, 5, 6)  # cshogi hand order: pawn lance knight silver gold bishop rook
_KING_BIT_WEIGHTS = 1 << np.arange(7)
CHUNK = 32
"""Positions whose float planes `Decoder.decode` gathers before narrowing them to uint8 in one copy: 1.2 MB of
scratch, within a core's L2 cache."""


_NO_MOVES = np.zeros(0, dtype=np.int64)


class BadRecord(Exception):
    """Record `position` (within the batch handed to `decode`) cannot be used; `reason` says why."""

    def __init__(self, position: int, reason: str):
        super().__init__(reason)
        self.position = position
        self.reason = reason


def packed_positions(records: np.ndarray) -> np.ndarray:
    """The 32-byte packed positions of `records` as a contiguous [N, 32] uint8 array."""
    field = "hcp" if "hcp" in records.dtype.names else "sfen"
    return np.ascontiguousarray(records[field]).reshape(len(records), 32)


def king_squares(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both formats start with 1 bit side to move and two 7-bit king squares, least significant bit first."""
    bits = np.unpackbits(packed[:, :2], axis=1, bitorder="little").astype(np.int64)
    return bits[:, 1:8] @ _KING_BIT_WEIGHTS, bits[:, 8:15] @ _KING_BIT_WEIGHTS


def sane_kings(packed: np.ndarray) -> np.ndarray:
    """True where both king squares are on the board and distinct.

    cshogi's decoders write the kings before any other check, so a square past 80 corrupts memory and
    can crash the process; such records must never reach `set_hcp` / `set_psfen`.
    """
    black, white = king_squares(packed)
    return (black < 81) & (white < 81) & (black != white)


def side_to_move(packed: np.ndarray) -> np.ndarray:
    return (packed[:, 0] & 1).astype(np.int64)


def results_for_side_to_move(records: np.ndarray, kind: str) -> np.ndarray:
    """1 win, 0.5 draw, 0 loss for the side to move; NaN where the stored result is out of range."""
    result = np.full(len(records), np.nan, dtype=np.float32)
    if kind == "hcpe":
        stored = records["gameResult"].astype(np.int64)
        turn = side_to_move(packed_positions(records))
        result[stored == cshogi.DRAW] = 0.5
        decisive = (stored == cshogi.BLACK_WIN) | (stored == cshogi.WHITE_WIN)
        winner = np.where(stored == cshogi.BLACK_WIN, cshogi.BLACK, cshogi.WHITE)
        result[decisive] = (winner[decisive] == turn[decisive]).astype(np.float32)
    else:
        stored = records["game_result"].astype(np.int64)
        for value, target in ((1, 1.0), (0, 0.5), (-1, 0.0)):
            result[stored == value] = target
    return result


def evals_for_side_to_move(records: np.ndarray, kind: str) -> np.ndarray:
    return records["eval" if kind == "hcpe" else "score"].astype(np.float32)


def value_targets(result: np.ndarray, evals: np.ndarray, eval_scale: float | np.ndarray,
                  value_lambda: float) -> np.ndarray:
    """`(1 - lambda) * result + lambda * sigmoid(eval / eval_scale)`, as float32."""
    mixed = (1.0 - value_lambda) * result.astype(np.float64)
    mixed += value_lambda / (1.0 + np.exp(-evals.astype(np.float64) / eval_scale))
    return mixed.astype(np.float32)


def stored_move(records: np.ndarray, kind: str) -> np.ndarray:
    field = "bestMove16" if kind == "hcpe" else "move"
    return records[field].astype(np.int64) & 0xFFFF


def material_problem(board: cshogi.Board) -> str | None:
    """Why the decoded position cannot occur in a game (too many pieces of a kind), or None."""
    counts = dict.fromkeys(PIECE_LIMITS, 0)
    for piece in board.pieces:
        piece_type = piece & 15
        if piece_type == 0 or piece_type == cshogi.KING:
            continue
        counts[piece_type - 8 if piece_type > cshogi.KING else piece_type] += 1
    for hand in board.pieces_in_hand:
        for hand_index, number in enumerate(hand):
            counts[_HAND_TO_PIECE_TYPE[hand_index]] += number
    for piece_type, (name, limit) in PIECE_LIMITS.items():
        if counts[piece_type] > limit:
            return f"impossible position: {counts[piece_type]} {name} (at most {limit})"
    return None


@dataclass
class DecodedBatch:
    """Decoded records that were kept, in input order; numpy arrays, ready to become tensors."""

    features1: np.ndarray
    """[n, 62, 9, 9] uint8 board planes."""
    features2: np.ndarray
    """[n, 57] uint8: one value per hand/check plane (each plane is constant over the board)."""
    policy: np.ndarray
    """[n] int64 move labels."""
    value: np.ndarray
    """[n] float32 value targets."""
    result: np.ndarray
    """[n] float32 game result for the side to move (1, 0.5, 0)."""
    eval_value: np.ndarray
    """[n] float32 `sigmoid(eval / eval_scale)`: the value target's other part (the trainer mixes the two itself
    when `loss.value_lambda` decays)."""
    skipped: list[tuple[int, str]]
    """(position in the input, reason) of records left out for an empty or illegal move."""
    policy_labels: np.ndarray | None = None
    """[n, K] int64: with `policy_probs`, a policy distribution per position (hcpe3 visits, averaged
    duplicates; see `sources`); None: `policy` is a one-hot target."""
    policy_probs: np.ndarray | None = None
    """[n, K] float32 probabilities of `policy_labels` (each row sums to 1; padding is label 0, probability 0)."""

    def __len__(self) -> int:
        return int(self.policy.shape[0])


def kept_positions(count: int, skipped: list[tuple[int, str]]) -> np.ndarray:
    """The positions of a decoded input of `count` records that were not skipped (`DecodedBatch.skipped`)."""
    keep = np.ones(count, dtype=bool)
    keep[[position for position, _ in skipped]] = False
    return np.flatnonzero(keep)


def _flush_chunk(chunk1: np.ndarray, chunk2: np.ndarray, filled: int, features1: np.ndarray, features2: np.ndarray,
                 count: int) -> None:
    """The first `filled` scratch positions become batch positions `count - filled` to `count` (uint8 board
    planes, one value per hand plane); the scratch is zeroed again for make_input_features, which only sets."""
    if filled:
        # The planes are 0.0 or 1.0: a comparison written straight into the batch as bools (bytes 0 and 1) is
        # one vectorised pass, where numpy's float-to-uint8 cast took three times as long.
        np.not_equal(chunk1[:filled], 0, out=features1[count - filled:count].view(np.bool_))
        features2[count - filled:count] = chunk2[:filled, :, 0, 0]
        chunk1[:filled] = 0
        # Only each hand plane's first square is read, so only it needs zeroing (make_input_features writes a
        # set plane whole): 57 values a position instead of 57 planes.
        chunk2[:filled, :, 0, 0] = 0


class Decoder:
    """Decodes batches of one record kind; one per process (it owns a cshogi Board and scratch planes)."""

    def __init__(self, kind: str, eval_scale: float, value_lambda: float, bad_records: str = "skip",
                 compiled: bool = True):
        self.kind = kind
        self.compiled = compiled and kind == "hcpe"
        """hcp positions go through `compiled.decode_batch` (the same arrays, from one compiled loop), cshogi
        decoding only what it leaves; psv positions, and all with `compiled=False`, through cshogi alone."""
        self.eval_scale = eval_scale
        self.value_lambda = value_lambda
        self.bad_records = bad_records
        self.board = cshogi.Board()
        # make_input_features writes float32 planes one position at a time (cshogi has no batch call): they go
        # to zeroed scratch planes for a chunk of positions that stays in cache, and the uint8 batch gets the
        # chunk in one copy (a quarter of the bytes to move between processes and to the GPU). Per chunk, not
        # per position, so that zeroing and narrowing cost a numpy call per 32 positions instead of four per
        # position; the views are made once, since making one costs as much as the call that fills it.
        self._chunk1 = np.zeros((CHUNK, FEATURES1_NUM, 9, 9), dtype=np.float32)
        self._chunk2 = np.zeros((CHUNK, FEATURES2_NUM, 9, 9), dtype=np.float32)
        self._chunk_planes = [(self._chunk1[k], self._chunk2[k]) for k in range(CHUNK)]

    def set_position(self, packed_row: np.ndarray) -> None:
        """Raises RuntimeError for a position cshogi cannot decode (call only after `sane_kings`)."""
        if self.kind == "hcpe":
            self.board.set_hcp(packed_row)
        else:
            self.board.set_psfen(packed_row)

    def move_from_stored(self, move: int) -> int:
        return self.board.move_from_move16(move) if self.kind == "hcpe" else self.board.move_from_psv(move)

    def undecodable_reason(self, packed_row: np.ndarray, king_ok: bool, result: float) -> str | None:
        if not king_ok:
            return "undecodable position (king squares off the board)"
        if np.isnan(result):
            return "game result out of range"
        try:
            self.set_position(packed_row)
        except RuntimeError as exc:
            return f"undecodable position ({exc})"
        return None

    def move_reason(self, move16: int) -> tuple[int, str | None]:
        """(move, None) for a legal move in the current position, else (0, why not)."""
        if move16 == 0:
            return 0, "empty move"
        move = self.move_from_stored(move16)
        if not move or not self.board.is_legal(move):
            return 0, f"move {move16:#06x} is illegal in this position"
        return move, None

    def decode(self, records: np.ndarray, features1_out: np.ndarray | None = None,
               eval_scale: np.ndarray | None = None, positions: typing.Any = None) -> DecodedBatch:
        """Decode `records`. Raises `BadRecord` for an undecodable record, and for an empty or illegal
        move when `bad_records` is `error`; otherwise such moves are skipped and listed.

        `features1_out`, a zeroed [len(records), 62, 9, 9] uint8 array, receives the board planes (a worker
        passes shared memory, so the batch crosses to the trainer without a copy). `eval_scale`: one scale per
        record (each file's fitted one, `data.eval_scale_fit`) instead of the decoder's. `positions`: a plan
        that sets the board to record i's position from another one (a compact positions cache's anchors and
        the moves from there: `hcpe3_compact.ReplayPlan`) instead of `set_hcp` of the record's packed one."""
        if self.compiled:
            return self._decode_compiled(records, features1_out, eval_scale, positions)
        n = len(records)
        packed = packed_positions(records)
        results = results_for_side_to_move(records, self.kind)
        kings_ok = sane_kings(packed)
        decodable = (kings_ok & ~np.isnan(results)).tolist()
        moves16 = stored_move(records, self.kind).tolist()
        features1 = np.zeros((n, FEATURES1_NUM, 9, 9), np.uint8) if features1_out is None else features1_out
        features2 = np.zeros((n, FEATURES2_NUM), dtype=np.uint8)
        policy = np.zeros(n, dtype=np.int64)
        kept = np.zeros(n, dtype=np.int64)
        skipped: list[tuple[int, str]] = []
        board = self.board
        chunk1, chunk2, chunk_planes = self._chunk1, self._chunk2, self._chunk_planes
        filled = 0  # positions in the chunk, not yet copied to the batch
        # The loop runs per position: bound methods and no helper calls (`undecodable_reason` and
        # `move_reason` say the same, slower, for verify and for the messages).
        set_position = board.set_hcp if self.kind == "hcpe" else board.set_psfen
        replay = positions is not None
        if replay:  # the plan's lists, read in the loop without a call per position
            anchors, replay_moves, bounds = positions.anchors, positions.moves.tolist(), positions.bounds.tolist()
            set_anchor, push = board.set_hcp, board.push_move16
        from_stored = board.move_from_move16 if self.kind == "hcpe" else board.move_from_psv
        is_legal, fill_planes = board.is_legal, board._dlshogi_make_input_features  # = make_input_features
        count = 0
        for i in range(n):
            if not decodable[i]:
                raise BadRecord(i, self.undecodable_reason(packed[i], bool(kings_ok[i]), float(results[i])))
            try:
                if replay:
                    set_anchor(anchors[i])
                    for replay_move in replay_moves[bounds[i]:bounds[i + 1]]:
                        push(replay_move)
                else:
                    set_position(packed[i])
            except RuntimeError as exc:
                raise BadRecord(i, f"undecodable position ({exc})") from None
            move16 = moves16[i]
            move = from_stored(move16) if move16 else 0
            if not move or not is_legal(move):
                reason = "empty move" if not move16 else f"move {move16:#06x} is illegal in this position"
                if self.bad_records == "error":
                    raise BadRecord(i, reason + " (data.bad_records=\"error\")")
                skipped.append((i, reason))
                continue
            fill_planes(*chunk_planes[filled])
            filled += 1
            policy[count] = make_move_label(move, board.turn)
            kept[count] = i
            count += 1
            if filled == CHUNK:
                _flush_chunk(chunk1, chunk2, filled, features1, features2, count)
                filled = 0
        _flush_chunk(chunk1, chunk2, filled, features1, features2, count)
        return self._batch(records, results, kept[:count], features1[:count], features2[:count], policy[:count],
                           skipped, eval_scale)

    def _batch(self, records: np.ndarray, results: np.ndarray, kept: np.ndarray, features1: np.ndarray,
               features2: np.ndarray, policy: np.ndarray, skipped: list[tuple[int, str]],
               eval_scale: np.ndarray | None) -> DecodedBatch:
        """The decoded batch of the `kept` records, with their value targets."""
        result = results[kept]
        evals = evals_for_side_to_move(records, self.kind)[kept]
        scale = self.eval_scale if eval_scale is None else np.asarray(eval_scale, dtype=np.float64)[kept]
        value = value_targets(result, evals, scale, self.value_lambda)
        eval_value = value_targets(result, evals, scale, 1.0)
        return DecodedBatch(features1, features2, policy, value, result, eval_value, skipped)

    def _decode_compiled(self, records: np.ndarray, features1_out: np.ndarray | None,
                         eval_scale: np.ndarray | None, positions: typing.Any) -> DecodedBatch:
        """`decode` of hcp positions: the compiled loop decodes the batch in place, and the positions it leaves
        (`SLOW`: an odd record, a move it does not certify) are decoded here by cshogi, in order, with the loop's
        messages; the kept rows are then moved up over the skipped ones."""
        # Imported here, not at the top: numba's import and the compiled code's load from its cache take about
        # 0.35 s, which only a process that decodes should pay (the monitor, the engine and the synthetic runs
        # import this module too).
        from tideborn.data.decode import compiled
        n = len(records)
        packed = packed_positions(records)
        results = results_for_side_to_move(records, self.kind)
        kings_ok = sane_kings(packed)
        decodable = kings_ok & ~np.isnan(results)
        moves16 = stored_move(records, self.kind)
        features1 = np.zeros((n, FEATURES1_NUM, 9, 9), np.uint8) if features1_out is None else features1_out
        flat = features1.view()
        flat.shape = (n, FEATURES1_NUM, 81)  # raises rather than copy: the rows must be written where they are
        features2 = np.zeros((n, FEATURES2_NUM), dtype=np.uint8)
        policy = np.zeros(n, dtype=np.int64)
        status = np.zeros(n, dtype=np.uint8)
        if positions is None:
            anchors, replay_moves, bounds = packed, _NO_MOVES, _NO_MOVES
        else:
            anchors, replay_moves, bounds = positions.anchors, positions.moves, positions.bounds
        compiled.decode_batch(packed, moves16, decodable, anchors, replay_moves, bounds, flat, features2, policy,
                              status)
        skipped: list[tuple[int, str]] = []
        board = self.board
        chunk1, chunk2 = self._chunk1, self._chunk2
        for i in np.flatnonzero(status == SLOW).tolist():
            if not decodable[i]:
                raise BadRecord(i, self.undecodable_reason(packed[i], bool(kings_ok[i]), float(results[i])))
            try:
                if positions is None:
                    board.set_hcp(packed[i])
                else:
                    board.set_hcp(anchors[i])
                    for replay_move in replay_moves[bounds[i]:bounds[i + 1]].tolist():
                        board.push_move16(replay_move)
            except RuntimeError as exc:
                raise BadRecord(i, f"undecodable position ({exc})") from None
            move, reason = self.move_reason(int(moves16[i]))
            if reason is not None:
                if self.bad_records == "error":
                    raise BadRecord(i, reason + " (data.bad_records=\"error\")")
                skipped.append((i, reason))
                continue
            board._dlshogi_make_input_features(chunk1[0], chunk2[0])
            _flush_chunk(chunk1, chunk2, 1, features1, features2, i + 1)
            policy[i] = make_move_label(move, board.turn)
        kept = kept_positions(n, skipped)
        count = len(kept)
        if skipped:
            features1[:count] = features1[kept]
            features1[count:] = 0  # the rows past the batch stay zeroed, as the caller handed them over
            features2, policy = features2[kept], policy[kept]
        return self._batch(records, results, kept, features1[:count], features2, policy, skipped, eval_scale)


def record_problems(records: np.ndarray, kind: str, decoder: Decoder) -> typing.Iterator[tuple[int, str]]:
    """(index in `records`, reason) for every unusable record, in order."""
    packed = packed_positions(records)
    kings = sane_kings(packed).tolist()
    results = results_for_side_to_move(records, kind).tolist()
    evals = evals_for_side_to_move(records, kind).tolist()
    moves = stored_move(records, kind).tolist()
    for i in range(len(records)):
        reason = decoder.undecodable_reason(packed[i], kings[i], results[i])
        if reason is None:
            reason = material_problem(decoder.board)
        if reason is None and abs(evals[i]) > EVAL_LIMIT:
            reason = f"eval {int(evals[i])} out of range (|eval| <= {EVAL_LIMIT})"
        if reason is None:
            reason = decoder.move_reason(moves[i])[1]
        if reason is not None:
            yield i, reason
