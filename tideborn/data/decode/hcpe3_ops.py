"""What the compiled loops share with their Python callers. The first open's two replay loops, the Python one
(`hcpe3_replay`, cshogi's board) and the compiled one (`compiled.play_games`), read the same ops and apply the same
rules; the decoder reads the compiled decode's statuses. All from here, a module with no imports: the compiled
loops must not import cshogi's loop, nor their callers numba."""

SLOW = 0
"""Status of a position that `compiled.decode_batch` leaves: the caller decodes it with cshogi."""
DONE = 1
"""Status of a position whose planes, hand/check values and label `compiled.decode_batch` wrote."""

MAX_LEGAL_MOVES = 593
"""The most legal moves a shogi position has: a larger candidateNum is a damaged file."""
REPETITION_PLIES = 16
"""How far back a repetition is looked for (cshogi's `is_draw(16)`, as dlshogi's `moveIsDraw`)."""

PLAIN, NEVER, PROMOTION, TO_LAST_RANK, TO_NEXT_TO_LAST_RANK = range(5)
"""How a candidate's legality is settled (`hcpe3_replay.candidate_checks`)."""
GOLD, KNIGHT = 7, 3
"""cshogi's piece types (pawn 1 ... rook 6, gold 7, king 8, promoted pieces above), as a move's bits 16-19
carry the type of the piece it moves."""
ALLOWED_PIECES = (0xFFFF, 0, (1 << GOLD) - 1, 0xFFFF & ~((1 << (KNIGHT + 1)) - 1), 0xFFFF & ~(1 << KNIGHT))
"""By check kind, a bit for each piece type (a move's bits 16-19) that may make such a move: any for PLAIN,
none for NEVER, below gold to promote, not a pawn, lance or knight to the last rank, not a knight to the
next-to-last."""
CHECK_BITS, ANCHOR_BIT, MOVE_OP = 0x7 << 16, 1 << 19, 1 << 20
"""A move's op in `_Plan.ops`: the move16, its check kind (bits 16-18), whether its position is an anchor (bit
19), a flag that it is a move (bit 20, above any candidate's op). Small, as every op: CPython compares and masks
ints below 2**30 on its fast path, and `_op_list` keeps an object for each possible op."""
