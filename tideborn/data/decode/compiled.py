"""The per-position decode in compiled code: hcp records (or a compact cache's anchors and the moves from there)
into dlshogi's input planes and move labels, a batch per call.

cshogi (1.1) has no batch call: `features.Decoder`'s loop makes four to five calls into it per position from
Python (`set_hcp`, `push_move16`, `move_from_move16`, `is_legal`, `make_input_features`), about 8 us a position
against dlshogi's 6 us for its whole C++ loop. This module does the same work in one numba-compiled loop, on a
mailbox board, and writes the same bytes as cshogi does: its Huffman tables, its piece codes, its attack planes
(`_dlshogi_make_input_features`), its move labels (`__dlshogi_make_move_label`) and its `is_legal`
(`moveIsPseudoLegal<false>` and `pseudoLegalMoveIsLegal`; cshogi's src/position.cpp and src/cshogi.h).

It only certifies what it is sure cshogi agrees with. A position it does not decode the usual way (a Huffman code
it does not know, a code running past the 256 bits, more pieces of a kind than a game has), a stored move it does
not certify as legal (an empty or odd move16, a move cshogi might call illegal, a pawn drop that mates), or a
replay move that is not a plain move of the side to move gets `SLOW`: the
caller decodes that position with cshogi itself, which gives the same arrays or the same message as before.
tests/unit/test_decode_compiled.py holds it to cshogi's output position by position.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from pathlib import Path

import numpy as np
from numba import njit
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

from tideborn.data.decode.hcpe3_ops import (
    ALLOWED_PIECES,
    ANCHOR_BIT,
    DONE,
    MOVE_OP,
    NEVER,
    PLAIN,
    REPETITION_PLIES,
    SLOW,
)

_BLACK_KING, _WHITE_KING = 8, 24
_FEATURES1_PER_COLOR = 31  # 14 piece planes, 14 attack planes, 3 attack-count planes
_HAND_PLANES = 28  # per color: 8 pawns, 4 lances, 4 knights, 4 silvers, 4 golds, 2 bishops, 2 rooks


def _table(entries: dict[tuple[int, int], int]) -> np.ndarray:
    """[bits, code] -> piece (or 0 for an empty square / a piece in the box); -1 where no code is."""
    table = np.full((10, 512), -1, dtype=np.int8)
    for (code, bits), piece in entries.items():
        table[bits, code] = piece
    return table


# cshogi's HuffmanCodedPos tables (position.cpp), code read least significant bit first: (code, bits) -> piece,
# pieces by Apery's numbers (black 1..14, white 17..30; pawn 1, lance 2, knight 3, silver 4, bishop 5, rook 6,
# gold 7, king 8, promoted 9..14).
_BOARD_CODES = _table({
    (0b0, 1): 0,
    (0b1, 4): 1, (0b11, 6): 2, (0b111, 6): 3, (0b1011, 6): 4, (0b11111, 8): 5, (0b111111, 8): 6, (0b1111, 6): 7,
    (0b1001, 4): 9, (0b100011, 6): 10, (0b100111, 6): 11, (0b101011, 6): 12, (0b10011111, 8): 13,
    (0b10111111, 8): 14,
    (0b101, 4): 17, (0b10011, 6): 18, (0b10111, 6): 19, (0b11011, 6): 20, (0b1011111, 8): 21, (0b1111111, 8): 22,
    (0b101111, 6): 23,
    (0b1101, 4): 25, (0b110011, 6): 26, (0b110111, 6): 27, (0b111011, 6): 28, (0b11011111, 8): 29,
    (0b11111111, 8): 30,
})
_BOX_CODES = {1: (0b10, 3), 2: (0b1001, 5), 3: (0b1011, 5), 4: (0b1101, 5), 7: (0b11101, 5), 5: (0b1111, 7),
              6: (0b101111, 7)}
"""The piece box's codes by piece type: pieces in neither hand nor on the board (read as an empty code)."""
_HAND_CODES = _table({
    (0b0, 3): 1, (0b100, 3): 17, (0b1, 5): 2, (0b10001, 5): 18, (0b11, 5): 3, (0b10011, 5): 19,
    (0b101, 5): 4, (0b10101, 5): 20, (0b111, 5): 7, (0b10111, 5): 23, (0b11111, 7): 5, (0b1011111, 7): 21,
    (0b111111, 7): 6, (0b1111111, 7): 22,
    **{code: 0 for code in _BOX_CODES.values()},
})
# Piece type -> hand index (cshogi's order: pawn lance knight silver gold bishop rook); -1: not a hand piece.
_HAND_INDEX = np.array([-1, 0, 1, 2, 3, 5, 6, 4, -1, -1, -1, -1, -1, -1, -1], dtype=np.int64)
_HAND_PLANE_START = np.array([0, 8, 12, 16, 20, 24, 26], dtype=np.int64)
_HAND_PLANE_MAX = np.array([8, 4, 4, 4, 4, 2, 2], dtype=np.int64)
# The most of each piece type (pawn..gold, by type number) a game has, board and hands together.
_MATERIAL_LIMIT = np.array([0, 18, 4, 4, 4, 2, 2, 4], dtype=np.int64)


def _moves() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per piece type, black's one-square steps and sliding directions as (file delta, rank delta); white's are
    the same with the rank delta negated. A square is file * 9 + rank, rank 0 black's far side."""
    forward = [(0, -1)]
    diagonal = [(-1, -1), (1, -1), (-1, 1), (1, 1)]
    orthogonal = [(0, -1), (-1, 0), (1, 0), (0, 1)]
    gold = [(0, -1), (-1, -1), (1, -1), (-1, 0), (1, 0), (0, 1)]
    steps = {1: forward, 3: [(-1, -2), (1, -2)], 4: [(0, -1), (-1, -1), (1, -1), (-1, 1), (1, 1)], 7: gold,
             8: diagonal + orthogonal, 9: gold, 10: gold, 11: gold, 12: gold, 13: orthogonal, 14: diagonal}
    slides = {2: forward, 5: diagonal, 6: orthogonal, 13: diagonal, 14: orthogonal}
    step_table = np.zeros((15, 8, 2), dtype=np.int64)
    step_count = np.zeros(15, dtype=np.int64)
    slide_table = np.zeros((15, 4, 2), dtype=np.int64)
    slide_count = np.zeros(15, dtype=np.int64)
    for piece_type, deltas in steps.items():
        step_count[piece_type] = len(deltas)
        step_table[piece_type, :len(deltas)] = deltas
    for piece_type, deltas in slides.items():
        slide_count[piece_type] = len(deltas)
        slide_table[piece_type, :len(deltas)] = deltas
    return step_table, step_count, slide_table, slide_count


_STEPS, _STEP_COUNT, _SLIDES, _SLIDE_COUNT = _moves()
_DIRECTIONS = np.array([(0, -1), (-1, -1), (1, -1), (-1, 0), (1, 0), (-1, 1), (1, 1), (0, 1)], dtype=np.int64)
"""The eight lines out of a square, each the opposite of the one at 7 minus its index."""
_DIRECTION_INDEX = np.full((3, 3), -1, dtype=np.int64)
"""[file delta + 1, rank delta + 1] -> the index of that line in `_DIRECTIONS`."""
for _index, (_df, _dr) in enumerate(_DIRECTIONS.tolist()):
    _DIRECTION_INDEX[_df + 1, _dr + 1] = _index


def _reach() -> np.ndarray:
    """[piece, direction]: 1 where the piece attacks the next square in `_DIRECTIONS[direction]`, 2 where it
    slides on along it, 0 where it does not attack that way (knights: none; `_attacked` looks for them)."""
    reach = np.zeros((32, 8), dtype=np.int64)
    for piece in range(32):
        piece_type, sign = piece & 15, (1 if piece < 16 else -1)
        if piece_type == 0 or piece_type == 15 or piece in (16, 31):
            continue
        for k in range(_STEP_COUNT[piece_type]):
            df, dr = _STEPS[piece_type, k, 0], sign * _STEPS[piece_type, k, 1]
            if abs(dr) <= 1:  # a knight's jump is on no line
                d = _DIRECTION_INDEX[df + 1, dr + 1]
                reach[piece, d] = max(reach[piece, d], 1)
        for k in range(_SLIDE_COUNT[piece_type]):
            reach[piece, _DIRECTION_INDEX[_SLIDES[piece_type, k, 0] + 1, sign * _SLIDES[piece_type, k, 1] + 1]] = 2
    return reach


_REACH = _reach()


@njit(cache=True, nogil=True)
def _bit(data, at):
    return (data[at >> 3] >> (at & 7)) & 1


@njit(cache=True, nogil=True)
def _set_hcp(hcp, board, hands, kings):
    """cshogi's `Position::set_hcp` onto `board` (81 pieces), `hands` ([2, 7] counts) and `kings`; returns the
    side to move, or -1 where cshogi would not decode it the usual way (the caller then asks cshogi)."""
    board[:] = 0
    hands[:] = 0
    turn = np.int64(hcp[0] & 1)  # bit 0 the side to move, bits 1-7 black's king square, 8-14 white's
    black_king = np.int64(hcp[0] >> 1)
    white_king = np.int64(hcp[1] & 0x7F)
    if black_king >= 81 or white_king >= 81 or black_king == white_king:
        return -1
    board[black_king] = _BLACK_KING
    board[white_king] = _WHITE_KING
    kings[0], kings[1] = black_king, white_king
    at = 15
    sq = 0
    # The board's squares in order (the kings' skipped), then hand pieces until the 256 bits are used: one code
    # at a time, of at most 9 bits, read as cshogi reads it.
    while sq < 81 or at < 256:
        if sq < 81 and (sq == black_king or sq == white_king):
            sq += 1
            continue
        table = _BOARD_CODES if sq < 81 else _HAND_CODES
        code, bits, piece = 0, 0, -1
        while bits <= 8:
            if at >= 256:
                return -1
            code |= _bit(hcp, at) << bits
            at += 1
            bits += 1
            piece = table[bits, code]
            if piece >= 0:
                break
        if piece < 0:
            return -1
        if sq < 81:
            board[sq] = piece
            sq += 1
        elif piece:
            hands[piece >> 4, _HAND_INDEX[piece & 15]] += 1
    if not _material_ok(board, hands):
        return -1
    return turn


@njit(cache=True, nogil=True)
def _material_ok(board, hands):
    counts = np.zeros(8, dtype=np.int64)
    for sq in range(81):
        piece_type = board[sq] & 15
        if piece_type == 0 or piece_type == 8:
            continue
        counts[piece_type - 8 if piece_type > 8 else piece_type] += 1
    for color in range(2):
        for piece_type in range(1, 8):
            counts[piece_type] += hands[color, _HAND_INDEX[piece_type]]
    for piece_type in range(1, 8):
        if counts[piece_type] > _MATERIAL_LIMIT[piece_type]:
            return False
    return True


@njit(cache=True, nogil=True)
def _attacks(board, sq, target):
    """Whether the piece on `sq` attacks square `target` on this board: the line from one to the other, the
    piece's reach along it, and the squares between empty."""
    piece = board[sq]
    df, dr = target // 9 - sq // 9, target % 9 - sq % 9
    if (piece & 15) == 3:  # a knight: one file over, two ranks forward
        return (df == 1 or df == -1) and dr == (-2 if piece < 16 else 2)
    if df == 0 and dr == 0:
        return False
    if not (df == 0 or dr == 0 or df == dr or df == -dr):
        return False
    step_f = (df > 0) - (df < 0)
    step_r = (dr > 0) - (dr < 0)
    reach = _REACH[piece, _DIRECTION_INDEX[step_f + 1, step_r + 1]]
    distance = max(abs(df), abs(dr))
    if reach == 0 or (reach == 1 and distance > 1):
        return False
    for k in range(1, distance):
        if board[sq + k * (step_f * 9 + step_r)]:
            return False
    return True


@njit(cache=True, nogil=True)
def _attacked(board, target, by):
    """Whether a piece of color `by` attacks square `target`: the first piece out along each line from it, and
    the two squares a knight of `by` would attack it from."""
    file, rank = target // 9, target % 9
    for d in range(8):
        df, dr = _DIRECTIONS[d, 0], _DIRECTIONS[d, 1]
        f, r = file + df, rank + dr
        distance = 1
        while 0 <= f < 9 and 0 <= r < 9:
            piece = board[f * 9 + r]
            if piece:
                # the piece attacks back along the opposite direction (7 - d in `_DIRECTIONS`' order)
                reach = _REACH[piece, 7 - d]
                if (piece >> 4) == by and (reach == 2 or (reach == 1 and distance == 1)):
                    return True
                break
            f += df
            r += dr
            distance += 1
    knight = 3 + 16 * by
    r = rank + (2 if by == 0 else -2)  # a black knight attacks two ranks up, so it stands two ranks down
    if 0 <= r < 9:
        for f in (file - 1, file + 1):
            if 0 <= f < 9 and board[f * 9 + r] == knight:
                return True
    return False


@njit(cache=True, nogil=True)
def _line(a, b):
    """Apery's `squareRelation` class of two squares: 1 a file, 2 a rank, 3 and 4 the diagonals, 0 none."""
    df, dr = b // 9 - a // 9, b % 9 - a % 9
    if df == 0:
        return 1
    if dr == 0:
        return 2
    if df == dr:
        return 3
    if df == -dr:
        return 4
    return 0


@njit(cache=True, nogil=True)
def _pawn_drop_mate(board, us, sq, king):
    """cshogi's `isPawnDropCheckMate(us, sq)` (position.cpp): no piece of the other side but its king can take
    the pawn (a pinned piece only along its pin), and the king has no square out of `us`'s reach, the pawn
    counted as a blocker but not as an attacker (as cshogi counts it); the other side is not in check before."""
    them = 1 - us
    for origin in range(81):
        piece = board[origin]
        if not piece or (piece >> 4) != them or (piece & 15) == 8 or not _attacks(board, origin, sq):
            continue
        board[origin] = 0
        pinned = _attacked(board, king, us)
        board[origin] = piece
        if not pinned or (_line(origin, king) != 0 and _line(origin, king) == _line(origin, sq)):
            return False
    board[sq] = them * 16 + 1  # occupies the square, attacks nothing of us's
    mate = True
    for df in range(-1, 2):
        for dr in range(-1, 2):
            f, r = king // 9 + df, king % 9 + dr
            if (df == 0 and dr == 0) or not (0 <= f < 9 and 0 <= r < 9):
                continue
            t = f * 9 + r
            if t != sq and board[t] and (board[t] >> 4) == them:
                continue
            if not _attacked(board, t, us):
                mate = False
                break
        if not mate:
            break
    board[sq] = 0
    return mate


@njit(cache=True, nogil=True)
def _features(board, hands, turn, kings, planes, hand_planes, counts):
    """cshogi's `_dlshogi_make_input_features` as bytes into zeroed `planes` [62, 81] and `hand_planes` [57]."""
    counts[:] = 0
    for sq in range(81):
        piece = board[sq]
        if not piece:
            continue
        color = piece >> 4
        piece_type = piece & 15
        sign = 1 if color == 0 else -1
        base = (color if turn == 0 else 1 - color) * _FEATURES1_PER_COLOR
        planes[base + piece_type - 1, sq if turn == 0 else 80 - sq] = 1
        attack_plane = base + 14 + piece_type - 1
        file, rank = sq // 9, sq % 9
        for k in range(_STEP_COUNT[piece_type]):
            f, r = file + _STEPS[piece_type, k, 0], rank + sign * _STEPS[piece_type, k, 1]
            if 0 <= f < 9 and 0 <= r < 9:
                t = f * 9 + r
                planes[attack_plane, t if turn == 0 else 80 - t] = 1
                counts[color, t] += 1
        for k in range(_SLIDE_COUNT[piece_type]):
            df, dr = _SLIDES[piece_type, k, 0], sign * _SLIDES[piece_type, k, 1]
            f, r = file + df, rank + dr
            while 0 <= f < 9 and 0 <= r < 9:
                t = f * 9 + r
                planes[attack_plane, t if turn == 0 else 80 - t] = 1
                counts[color, t] += 1
                if board[t]:
                    break
                f += df
                r += dr
    for color in range(2):
        base = (color if turn == 0 else 1 - color) * _FEATURES1_PER_COLOR + 28
        for sq in range(81):
            number = min(counts[color, sq], 3)
            for k in range(number):
                planes[base + k, sq if turn == 0 else 80 - sq] = 1
        hand_base = (color if turn == 0 else 1 - color) * _HAND_PLANES
        for hand_index in range(7):
            number = min(hands[color, hand_index], _HAND_PLANE_MAX[hand_index])
            for k in range(number):
                hand_planes[hand_base + _HAND_PLANE_START[hand_index] + k] = 1
    # in check: a piece of the side not to move attacks the king of the side to move
    hand_planes[56] = 1 if counts[1 - turn, kings[turn]] > 0 else 0


@njit(cache=True, nogil=True)
def _legal(board, hands, turn, kings, move16, in_check):
    """True only where cshogi's `is_legal(move_from_move16(move16))` is True (False: ask cshogi). `in_check`:
    whether the side to move's king is attacked now; if not, a drop cannot leave it attacked, nor can a move of
    a piece off every line through it, so only the other moves are played out and the king looked at."""
    if move16 == 0 or move16 & 0x8000:
        return False
    to = move16 & 0x7F
    origin = (move16 >> 7) & 0x7F
    if to >= 81:
        return False
    them = 1 - turn
    if origin >= 81:  # a drop: origin is 80 + piece type
        piece_type = origin - 80
        if piece_type > 7 or board[to] or hands[turn, _HAND_INDEX[piece_type]] == 0:
            return False
        if piece_type == 1:
            for rank in range(9):  # two pawns on a file
                if board[(to // 9) * 9 + rank] == turn * 16 + 1:
                    return False
            if to + (-1 if turn == 0 else 1) == kings[them]:  # cshogi's pawn-drop mate test
                if to % 9 == (0 if turn == 0 else 8):  # the king a file over (cshogi's square arithmetic)
                    return False
                if _attacked(board, kings[them], turn) or _pawn_drop_mate(board, turn, to, kings[them]):
                    return False  # a position where the side not to move is in check; a mate: left to cshogi
        if not in_check:
            return True
        board[to] = turn * 16 + piece_type
        safe = not _attacked(board, kings[turn], them)
        board[to] = 0
        return safe
    piece = board[origin]
    if not piece or (piece >> 4) != turn:
        return False
    captured = board[to]
    if captured and (captured >> 4) == turn:
        return False
    if not _attacks(board, origin, to):
        return False
    if not in_check and (piece & 15) != 8 and _line(origin, kings[turn]) == 0:
        return True
    board[to] = piece
    board[origin] = 0
    safe = not _attacked(board, to if (piece & 15) == 8 else kings[turn], them)
    board[origin] = piece
    board[to] = captured
    return safe


@njit(cache=True, nogil=True)
def _push(board, hands, turn, kings, move16):
    """cshogi's `push_move16` of a plain move of the side to move; False (board undefined) for anything else."""
    if move16 & 0x8000:
        return False
    to = move16 & 0x7F
    origin = (move16 >> 7) & 0x7F
    if to >= 81 or (board[to] and (board[to] >> 4) == turn):
        return False
    if origin >= 81:
        piece_type = origin - 80
        if piece_type > 7 or board[to] or hands[turn, _HAND_INDEX[piece_type]] == 0:
            return False
        hands[turn, _HAND_INDEX[piece_type]] -= 1
        board[to] = turn * 16 + piece_type
        return True
    piece = board[origin]
    if not piece or (piece >> 4) != turn:
        return False
    piece_type = piece & 15
    promote = (move16 >> 14) & 1
    if promote and (piece_type >= 7):  # gold, king and promoted pieces do not promote
        return False
    captured = board[to]
    if captured:
        captured_type = captured & 15
        if captured_type == 8:
            return False
        unpromoted = captured_type - 8 if captured_type > 8 else captured_type
        hands[turn, _HAND_INDEX[unpromoted]] += 1
    board[to] = piece + 8 * promote
    board[origin] = 0
    if piece_type == 8:
        kings[turn] = to
    return True


@njit(cache=True, nogil=True)
def _label(move16, turn):
    """cshogi's `__dlshogi_make_move_label` (the move from the side to move's view)."""
    to = move16 & 0x7F
    origin = (move16 >> 7) & 0x7F
    if origin >= 81:
        return 81 * (20 + origin - 81) + (to if turn == 0 else 80 - to)
    if turn == 1:
        to, origin = 80 - to, 80 - origin
    dir_x = origin // 9 - to // 9
    dir_y = to % 9 - origin % 9
    if dir_y < 0 and dir_x == 0:
        direction = 0
    elif dir_y == -2 and dir_x == -1:
        direction = 8
    elif dir_y == -2 and dir_x == 1:
        direction = 9
    elif dir_y < 0 and dir_x < 0:
        direction = 1
    elif dir_y < 0 and dir_x > 0:
        direction = 2
    elif dir_y == 0 and dir_x < 0:
        direction = 3
    elif dir_y == 0 and dir_x > 0:
        direction = 4
    elif dir_y > 0 and dir_x == 0:
        direction = 5
    elif dir_y > 0 and dir_x < 0:
        direction = 6
    else:
        direction = 7
    if move16 & 0x4000:
        direction += 10
    return 81 * direction + to


@njit(cache=True, nogil=True)
def decode_batch(packed, moves16, usable, anchors, replay_moves, bounds, planes, hand_planes, labels, status):
    """Decode each position i with `usable[i]` into row i of `planes` ([n, 62, 81] uint8) and
    `hand_planes` ([n, 57] uint8), its move label into `labels[i]`, and `status[i]` = DONE; SLOW where cshogi must
    decode it (the rows are then left as they were). Positions come from `packed` ([n, 32] hcp), or, where
    `bounds` is not empty, from `anchors[i]` and `replay_moves[bounds[i]:bounds[i + 1]]` played from there."""
    board = np.zeros(81, dtype=np.int64)
    hands = np.zeros((2, 7), dtype=np.int64)
    kings = np.zeros(2, dtype=np.int64)
    counts = np.zeros((2, 81), dtype=np.int64)
    replay = len(bounds) > 0
    for i in range(len(packed)):
        status[i] = SLOW
        if not usable[i]:
            continue
        turn = _set_hcp(anchors[i] if replay else packed[i], board, hands, kings)
        if turn < 0:
            continue
        if replay:
            played = True
            for k in range(bounds[i], bounds[i + 1]):
                if not _push(board, hands, turn, kings, replay_moves[k]):
                    played = False
                    break
                turn = 1 - turn
            if not played:  # material: checked by _set_hcp, kept by _push
                continue
        if not _legal(board, hands, turn, kings, moves16[i], _attacked(board, kings[turn], 1 - turn)):
            continue
        planes[i] = 0
        hand_planes[i] = 0
        _features(board, hands, turn, kings, planes[i], hand_planes[i], counts)
        labels[i] = _label(moves16[i], turn)
        status[i] = DONE


def prepare_decoder() -> None:
    """Load `decode_batch` into this process (from numba's cache, else compiled): a process that forks loader
    workers calls this first, and they inherit it rather than each loading it again (about 0.35 s a worker and an
    epoch). The arguments have the types `features.Decoder` passes, so this is the compilation it uses."""
    no_moves = np.zeros(0, dtype=np.int64)
    no_hcp = np.zeros((0, 32), dtype=np.uint8)
    decode_batch(no_hcp, no_moves, np.zeros(0, dtype=np.bool_), no_hcp, no_moves, no_moves,
                 np.zeros((0, 2 * _FEATURES1_PER_COLOR, 81), dtype=np.uint8),
                 np.zeros((0, 2 * _HAND_PLANES + 1), dtype=np.uint8), no_moves, np.zeros(0, dtype=np.uint8))


# --- the first open's replay: a game's candidates and moves checked and played, the anchors packed ---

def _encoder() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """cshogi's `toHuffmanCodedPos` tables: board codes by piece, hand codes by [color, hand index], piece box
    codes by hand index (each as code, bits)."""
    board_code, board_bits = np.zeros(32, np.int64), np.zeros(32, np.int64)
    for bits in range(10):
        for code in range(512):
            piece = _BOARD_CODES[bits, code]
            if piece >= 0:
                board_code[piece], board_bits[piece] = code, bits
    hand_code, hand_bits = np.zeros((2, 7), np.int64), np.zeros((2, 7), np.int64)
    box_code, box_bits = np.zeros(7, np.int64), np.zeros(7, np.int64)
    for bits in range(10):
        for code in range(512):
            piece = _HAND_CODES[bits, code]
            if piece > 0:
                hand_code[piece >> 4, _HAND_INDEX[piece & 15]] = code
                hand_bits[piece >> 4, _HAND_INDEX[piece & 15]] = bits
    for piece_type, (code, bits) in _BOX_CODES.items():
        box_code[_HAND_INDEX[piece_type]], box_bits[_HAND_INDEX[piece_type]] = code, bits
    return board_code, board_bits, hand_code, hand_bits, box_code, box_bits


_BOARD_CODE, _BOARD_BITS, _HAND_CODE, _HAND_BITS, _BOX_CODE, _BOX_BITS = _encoder()
_BOX_FULL = np.zeros(7, dtype=np.int64)
"""Pieces of each hand kind in a game (pawn lance knight silver gold bishop rook): `_MATERIAL_LIMIT` by hand index."""
_BOX_FULL[_HAND_INDEX[1:8]] = _MATERIAL_LIMIT[1:8]
_ZOBRIST = np.random.default_rng(20261204).integers(1, 1 << 62, size=(32, 81), dtype=np.int64)
"""A key per (piece, square) that tells boards apart in `play_games`' repetition rule (any fixed numbers do); the
empty square's is 0, so that a move changes the key by the squares it changes."""
_ZOBRIST[0] = 0


@njit(cache=True, nogil=True)
def _emit(out, acc, filled, written, code, bits):
    """A code into the bit accumulator, each full byte written out; `written` 33 once a byte would fall past
    the 32."""
    acc |= code << filled
    filled += bits
    while filled >= 8:
        if written >= 32:
            return acc, filled, 33
        out[written] = acc & 0xFF
        written += 1
        acc >>= 8
        filled -= 8
    return acc, filled, written


@njit(cache=True, nogil=True)
def _to_hcp(board, hands, turn, kings, out):
    """cshogi's `to_hcp` of the board into `out` (32 bytes); False where the pieces do not fill the 256 bits."""
    box = _BOX_FULL.copy()
    acc, filled, written = turn | (kings[0] << 1) | (kings[1] << 8), 15, 0
    for sq in range(81):
        piece = board[sq]
        piece_type = piece & 15
        if piece_type == 8:
            continue
        acc, filled, written = _emit(out, acc, filled, written, _BOARD_CODE[piece], _BOARD_BITS[piece])
        if piece:
            box[_HAND_INDEX[piece_type - 8 if piece_type > 8 else piece_type]] -= 1
    for color in range(2):
        for hand_index in range(7):
            number = hands[color, hand_index]
            box[hand_index] -= number
            for _ in range(number):
                acc, filled, written = _emit(out, acc, filled, written, _HAND_CODE[color, hand_index],
                                             _HAND_BITS[color, hand_index])
    for hand_index in range(7):
        if box[hand_index] < 0:
            return False
        for _ in range(box[hand_index]):
            acc, filled, written = _emit(out, acc, filled, written, _BOX_CODE[hand_index], _BOX_BITS[hand_index])
    return written == 32 and filled == 0


@njit(cache=True, nogil=True)
def _board_key(board):
    key = np.int64(0)
    for sq in range(81):
        if board[sq]:
            key ^= _ZOBRIST[board[sq], sq]
    return key


_ALLOWED = np.array(ALLOWED_PIECES, dtype=np.int64)


@njit(cache=True, nogil=True)
def _checked_ok(board, move16, kind):
    """hcpe3_replay's piece check of a move that `is_legal` alone does not settle (kind > 0): a board move whose
    piece may make it; False also where it cannot tell (a drop)."""
    origin = (move16 >> 7) & 0x7F
    if kind == PLAIN:
        return True
    if origin >= 81 or kind == NEVER:
        return False
    return (_ALLOWED[kind] >> (board[origin] & 15)) & 1 == 1


LEAVES_GAP = 1
"""`play_games`' mark of a move after which cshogi's `is_draw(16)` finds a draw, superior or inferior
repetition: the position is left out (hcpe3_replay's `repeating`)."""


@njit(cache=True, nogil=True)
def _repetition(hand_history, keys, checks, plies, key, hand, turn):
    """cshogi's `is_draw(16)` (Apery's `isDraw`) of the board just reached, `plies` moves after the start: 0 none,
    1 a draw, superior or inferior repetition (left out), 2 a win or loss by perpetual check (kept). The
    histories hold, per ply mod 17, the board's key and the side to move's hand; `checks` the plies each side
    has been checking in a row. Boards are told apart by their 62-bit keys, as cshogi tells them apart by its
    64-bit ones."""
    back = 4
    ring = REPETITION_PLIES + 1
    while back <= min(plies, REPETITION_PLIES):
        then = (plies - back) % ring
        if keys[then] == key:
            same_hand, superior, inferior = True, True, True
            for k in range(7):
                if hand[k] != hand_history[then, k]:
                    same_hand = False
                if hand[k] < hand_history[then, k]:
                    superior = False
                if hand[k] > hand_history[then, k]:
                    inferior = False
            if same_hand:
                if back <= checks[turn] or back <= checks[1 - turn]:
                    return 2
                return 1
            if superior or inferior:
                return 1
        back += 2
    return 0


@njit(cache=True, nogil=True)
def play_games(starts, usable, first_moves, ops, op_starts, hcp, ok, gaps):
    """`hcpe3_replay.ReplayedPositions._play_fast` of each usable game, in compiled code: from `starts[g]`, the
    game's ops (`_Plan.ops`: candidates to check, then the move) checked and played, the position packed into
    `hcp` at an anchor and after a left-out repetition (`gaps[move]` = LEAVES_GAP after its move); `ok[g]` = 1
    where all of it was plainly right, else 0 (the caller then plays the game with cshogi, which names what is
    wrong). It gives up at anything it does not certify as cshogi would."""
    board = np.zeros(81, dtype=np.int64)
    hands = np.zeros((2, 7), dtype=np.int64)
    kings = np.zeros(2, dtype=np.int64)
    ring = REPETITION_PLIES + 1
    keys = np.zeros(ring, dtype=np.int64)
    hand_history = np.zeros((ring, 7), dtype=np.int64)
    checks = np.zeros(2, dtype=np.int64)
    for game in range(len(usable)):
        ok[game] = 0
        if not usable[game]:
            continue
        turn = _set_hcp(starts[game], board, hands, kings)
        if turn < 0:
            continue
        move_index = first_moves[game]
        plies = 0
        key = _board_key(board)
        keys[0] = key
        hand_history[0] = hands[turn]
        checks[:] = 0
        in_check = _attacked(board, kings[turn], 1 - turn)
        gap = False
        fine = True
        for k in range(op_starts[game], op_starts[game + 1]):
            op = ops[k]
            if op < 0x10000:
                if not _legal(board, hands, turn, kings, op, in_check):
                    fine = False
                    break
                continue
            if op < MOVE_OP:
                move16, kind = op & 0xFFFF, op >> 16
                if not (_legal(board, hands, turn, kings, move16, in_check) and _checked_ok(board, move16, kind)):
                    fine = False
                    break
                continue
            move16, kind = op & 0xFFFF, (op >> 16) & 7
            if not (_legal(board, hands, turn, kings, move16, in_check) and _checked_ok(board, move16, kind)):
                fine = False
                break
            if (gap or op & ANCHOR_BIT) and not _to_hcp(board, hands, turn, kings, hcp[move_index]):
                fine = False
                break
            to, origin = move16 & 0x7F, (move16 >> 7) & 0x7F
            moved, captured = (board[origin] if origin < 81 else 0), board[to]
            if not _push(board, hands, turn, kings, move16):
                fine = False
                break
            key ^= _ZOBRIST[board[to], to] ^ _ZOBRIST[captured, to]  # the empty square's key is 0
            if origin < 81:
                key ^= _ZOBRIST[moved, origin]
            mover = turn
            turn = 1 - turn
            plies += 1
            in_check = _attacked(board, kings[turn], 1 - turn)
            checks[mover] = checks[mover] + 2 if in_check else 0  # cshogi's continuousCheck
            gap = _repetition(hand_history, keys, checks, plies, key, hands[turn], turn) == 1
            gaps[move_index] = LEAVES_GAP if gap else 0
            keys[plies % ring] = key
            hand_history[plies % ring] = hands[turn]
            move_index += 1
        if fine:
            ok[game] = 1


@njit(cache=True, nogil=True)
def walk_games(words, k, end, max_candidates, move_words, game_words, game_first_move):
    """`hcpe3_replay._walk`'s common case in compiled code: from word `k`, each game whose moves lie whole before
    word `end` and have at most `max_candidates` candidates each; their words go to the arrays given. Returns
    (games, moves, the word where it stopped): at `end`, or at a game that is cut or malformed, which the
    caller reads move by move."""
    games = 0
    moves = 0
    while end - k >= 18:  # a header: 36 bytes
        p = k + 18
        first = moves
        whole = True
        for _ in range(words[k + 16]):
            if p + 3 > end:
                whole = False
                break
            count = words[p + 2]
            if count > max_candidates:
                whole = False
                break
            move_words[moves] = p
            moves += 1
            p += 3 + 2 * count
        if not whole or p > end:
            return games, first, k
        game_words[games] = k
        game_first_move[games] = first
        games += 1
        k = p
    return games, moves, k


@njit(cache=True, nogil=True)
def replay_range(start_hcp, steps, moves, lead, out):
    """`hcpe3_compact.CompactPositions._replay_range` in compiled code: the hcp of consecutive positions into
    `out`, each from the one before by one move (`moves[lead + row - 1]`), or set from its anchor's
    `start_hcp[row]` where `steps[row]` is 0 (the first from its anchor and the `lead` moves after it). False
    where a position or a move is not plainly right (the caller then replays with cshogi)."""
    board = np.zeros(81, dtype=np.int64)
    hands = np.zeros((2, 7), dtype=np.int64)
    kings = np.zeros(2, dtype=np.int64)
    turn = 0
    for row in range(len(steps)):
        if row == 0 or steps[row] == 0:
            turn = _set_hcp(start_hcp[row], board, hands, kings)
            if turn < 0:
                return False
            if row == 0:
                for k in range(lead):
                    if not _push(board, hands, turn, kings, moves[k]):
                        return False
                    turn = 1 - turn
        else:
            if not _push(board, hands, turn, kings, moves[lead + row - 1]):
                return False
            turn = 1 - turn
        if not _to_hcp(board, hands, turn, kings, out[row]):  # material: checked by _set_hcp, kept by _push
            return False
    return True


class _SturdyCache(FunctionCache):
    """numba's on-disk cache of one function, where a cache file that cannot be read or written (damaged, cut
    short, another type of file at its name) is a miss rather than numba's exception: the function is compiled
    again, one line says so (once a process), and the unreadable index is removed so that the fresh compilation
    is kept. (numba has no option for this; its hook around each load and save is the place.)

    And keyed on the contents of every file the code is made of (`stamp`, from `sources_stamp`), which nothing
    public in numba gives. numba's stamp covers the function's own file alone (its contents in recent numba, 0.68;
    its mtime and size in the older releases pyproject.toml allows, 0.60), and numba's caching notes say that a
    change to a symbol defined in another file does not invalidate the cache. The loops read hcpe3_ops.py's
    constants, frozen into the code when it is compiled: an edit there alone would load the old code, and with it
    silently wrong planes. (NUMBA_CACHE_DIR only moves the cache.) The stamp and the guard below are numba's
    internals: test_decode_compiled.py holds them to their behaviour."""

    said = False

    def __init__(self, py_func, stamp: str):
        super().__init__(py_func)
        self._cache_file._source_stamp = stamp

    @contextlib.contextmanager
    def _guard_against_spurious_io_errors(self):
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - whatever numba met in the file: unpickling, I/O, a bad index
            index = Path(self._cache_file._index_path)
            if not self.said:
                self.said = True
                print(f"tideborn: numba's cache {index} cannot be used ({type(exc).__name__}: {exc}); compiling "
                      f"again", file=sys.stderr)
            with contextlib.suppress(OSError):
                index.unlink()


def sources_stamp(*sources: Path) -> str:
    """The hash of the files' contents: what a compilation of code made of them is cached under."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()


_STAMP = sources_stamp(Path(__file__), Path(__file__).with_name("hcpe3_ops.py"))
for _function in list(globals().values()):
    if isinstance(_function, Dispatcher):
        _function._cache = _SturdyCache(_function.py_func, _STAMP)
