"""The replay behind an hcpe3 file's first open: every game's moves played with cshogi into the positions arrays.

What the Python loop per move keeps to is what only a board can answer: the selected move and each candidate
legal, the position packed (`to_hcp`: only at the compact cache's anchors, `anchor_starts`, unless every
position's hcp is asked for), the move played, the repetition looked for. Everything else is done
in bulk with numpy on a window of whole games: finding the MoveInfos (a short walk over the candidate
counts), reading evals, moves and visit counts, the policy labels (a table of `make_move_label` over every
move16 that can be legal), candidates repeated within a move, the CSR arrays.

The loop itself is two: a game is played by `_play_fast`, one list of ops per window (each move's candidates
to try, then the move; `_Plan.ops`) with nothing per op but the cshogi calls, which gives up at the first
thing that is not plainly right; then by `_play_carefully`, the move-by-move loop, which names the first bad
move and plays on a board that no legal move makes. The CSR arrays of the compact layout are gathered window
by window and the file's arrays joined once, so that a first open holds them about once.

Errors are those of a move-by-move reading, in the same order: the first bad move of the file is the one
named, whatever kind of check finds it.
"""

from __future__ import annotations

import typing

import cshogi
import numpy as np
from cshogi.dlshogi import make_move_label

from tideborn.data.decode.features import material_problem, sane_kings
from tideborn.data.decode.hcpe3_ops import (
    ALLOWED_PIECES,
    ANCHOR_BIT,
    CHECK_BITS,
    MAX_LEGAL_MOVES,
    MOVE_OP,
    NEVER,
    PLAIN,
    PROMOTION,
    REPETITION_PLIES,
    TO_LAST_RANK,
    TO_NEXT_TO_LAST_RANK,
)
from tideborn.errors import UserError

HEADER_SIZE, MOVE_INFO_SIZE, MOVE_VISITS_SIZE = 36, 6, 4
RESULT_MASK = 0x3
RESULT_UNKNOWN_BITS = 0xE0
REPETITIONS_SKIPPED = (cshogi.REPETITION_DRAW, cshogi.REPETITION_SUPERIOR, cshogi.REPETITION_INFERIOR)
WINDOW_BYTES = 4 << 20
"""Bytes of whole games replayed at a time (a game longer than this gets a window of its own): as much as
`hcpe3.READ_CHUNK`, so a file is read in the same pieces as ever (and a cut under the reader is found)."""
_HEADER_WORDS, _INFO_WORDS = HEADER_SIZE // 2, MOVE_INFO_SIZE // 2
NO_LABEL = 0xFFFF
ANCHOR_EVERY = 8
"""Plies of a game between the compact cache's stored positions (`hcpe3_compact`): 32/8 bytes a position for
the hcp, fewer than 8 moves replayed per read."""
_label_table: np.ndarray | None = None
_candidate_checks: np.ndarray | None = None


def move_labels() -> np.ndarray:
    """[2, 65536] uint16: `make_move_label(move16, color)` of every move16 whose squares are on the board (a
    drop from one of the 7 hands); NO_LABEL elsewhere. A label is a function of the move16's squares,
    promotion and the side to move alone, so a table read replaces a call per candidate."""
    global _label_table
    if _label_table is None:
        table = np.full((2, 1 << 16), NO_LABEL, np.uint16)
        for to in range(81):
            for source in range(81 + 7):
                for promote in ((0, 1 << 14) if source < 81 else (0,)):
                    move16 = to | source << 7 | promote
                    table[0, move16] = make_move_label(move16, cshogi.BLACK)
                    table[1, move16] = make_move_label(move16, cshogi.WHITE)
        _label_table = table
    return _label_table


_NOT_PIECES = frozenset((15, 16, 31))
"""Piece codes of cshogi's board that are no piece (a "promoted gold" of either side, a white nothing)."""


def candidate_checks() -> np.ndarray:
    """[2, 65536] uint8, by side to move and move16: what besides `Board.is_legal` settles whether a candidate
    is one of the position's legal moves (as `Board.legal_moves` lists them). `is_legal` alone accepts a
    promotion of any piece from anywhere and a pawn, lance or knight moved or dropped where it can never
    move again; what the move16 alone rules out is NEVER (no move at all, a promotion outside the zone, such
    a drop), and what depends on the piece moved is PROMOTION (a pawn to a rook), TO_LAST_RANK (not a pawn,
    lance or knight) or TO_NEXT_TO_LAST_RANK (not a knight); PLAIN is `is_legal` alone."""
    global _candidate_checks
    if _candidate_checks is None:
        move16 = np.arange(1 << 16)
        to, source, promote = move16 & 0x7F, move16 >> 7 & 0x7F, move16 >> 14 & 1
        drop = source >= 81
        table = np.full((2, 1 << 16), PLAIN, np.uint8)
        for color in (cshogi.BLACK, cshogi.WHITE):
            # cshogi's squares run file by file, rank 0 (black's far side) first; ranks from the mover's side
            rank_to = to % 9 if color == cshogi.BLACK else 8 - to % 9
            rank_from = source % 9 if color == cshogi.BLACK else 8 - source % 9
            in_zone = (rank_to <= 2) | (~drop & (rank_from <= 2))
            hand = source - 81  # a drop's hand piece: pawn 0, lance 1, knight 2, ...
            row = table[color]
            row[~drop & (rank_to == 1) & (promote == 0)] = TO_NEXT_TO_LAST_RANK
            row[~drop & (rank_to == 0) & (promote == 0)] = TO_LAST_RANK
            row[promote == 1] = PROMOTION
            row[(promote == 1) & ~in_zone] = NEVER
            row[drop & (((rank_to == 0) & (hand <= 1)) | ((rank_to <= 1) & (hand == 2)))] = NEVER
            row[move_labels()[color] == NO_LABEL] = NEVER
        _candidate_checks = table
    return _candidate_checks


UNDECODABLE_START = "undecodable start position (no position of shogi's 40 pieces)"


def anchor_starts(game: np.ndarray, ply: np.ndarray, anchor_every: int = ANCHOR_EVERY) -> np.ndarray:
    """Which of the kept positions (their game and ply, in file order) the compact cache stores whole: every
    `anchor_every`-th ply of a game, and any position that does not follow the one before it by one move (a
    game's first, the one after a left-out repetition). By ply, not by place in the file, so that the replay
    knows before playing a game's moves which positions it must pack (`to_hcp` is most of a move's cost)."""
    game, ply = np.asarray(game, dtype=np.int64), np.asarray(ply, dtype=np.int64)
    starts = ply % anchor_every == 0
    if len(starts):
        starts[0] = True
        starts[1:] |= (game[1:] != game[:-1]) | (ply[1:] != ply[:-1] + 1)
    return starts


def truncated(path, game: int, offset: int, what: str, need: int, size: int, at: int | None = None) -> UserError:
    return UserError(f"{path}: game {game} (byte {offset}): truncated {what}: needs {need} bytes at byte "
                     f"{offset if at is None else at}, the file ends at {size}; the file is cut short or is not hcpe3")


_LEAVES_GAP = tuple(kind in REPETITIONS_SKIPPED for kind in cshogi.REPETITION_TYPES)
"""By `Board.is_draw`'s answer: whether the position is left out (the next one is then an anchor)."""
_op_objects: np.ndarray | None = None
_op_made: np.ndarray | None = None


def _op_list(ops: np.ndarray) -> list[int]:
    """`ops.tolist()`, each value one shared int object. A window holds a few thousand distinct ops among
    hundreds of thousands, and an int object made for each (as `tolist` does, then freed) cost as much as
    all the numpy work on the window; numpy gathers and lists object pointers ten times faster."""
    global _op_objects, _op_made
    if _op_objects is None or _op_made is None:
        _op_objects = np.full(MOVE_OP << 1, None, dtype=object)
        _op_made = np.zeros(MOVE_OP << 1, np.bool_)
    if not _op_made[ops].all():  # new ops: after a process's first windows, rarely
        seen = np.zeros(len(_op_made), np.bool_)
        seen[ops] = True
        values = np.flatnonzero(seen & ~_op_made)
        _op_objects[values] = values.tolist()
        _op_made[values] = True
    return _op_objects[ops].tolist()


class _Plan:
    """What the loop needs of a window's moves, worked out in bulk: each selected move and what besides
    `is_legal` settles it (`candidate_checks`), the candidates to try (`tried`, each a move16 with its kind in
    bits 16-18; `try_starts` by move), and which positions to pack (`anchor`). A candidate that is the
    selected move is as legal as the selected move, unless is_legal alone cannot tell: only the others are
    tried."""

    def __init__(self, selected: np.ndarray, turns: np.ndarray, counts: np.ndarray, cand_starts: np.ndarray,
                 cand_moves: np.ndarray, anchor: np.ndarray) -> None:
        table = candidate_checks().reshape(-1)  # by side to move << 16 | move16
        turn_keys = turns.astype(np.int32) << 16
        checks = table[np.repeat(turn_keys, counts) | cand_moves]
        to_try = (cand_moves != np.repeat(selected, counts)) | (checks != PLAIN)
        tried = np.flatnonzero(to_try)
        self.tried = cand_moves[tried] | checks[tried].astype(np.int32) << 16
        tried_before = np.zeros(len(to_try) + 1, np.int64)
        np.cumsum(to_try, out=tried_before[1:])
        self.try_starts = tried_before[cand_starts]
        self.selected = selected
        self.selected_checks = table[turn_keys | selected]
        self.anchor = anchor

    def ops(self, first_moves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The window as one array of ops for the fast loops: each move's candidates to try, then the move
        itself (an op of `MOVE_OP`; an empty move16 as NEVER, so that the fast loops leave it to the careful
        one); and where each game's ops start (one more: the end)."""
        n = len(self.selected)
        checks = np.where(self.selected == 0, NEVER, self.selected_checks).astype(np.int32)
        move_ops = MOVE_OP | self.anchor.astype(np.int32) * ANCHOR_BIT | checks << 16 | self.selected
        at_move = self.try_starts[1:] + np.arange(n)
        ops = np.empty(len(self.tried) + n, np.int32)
        is_candidate = np.ones(len(ops), np.bool_)
        is_candidate[at_move] = False
        ops[at_move] = move_ops
        ops[is_candidate] = self.tried
        return ops, self.try_starts[first_moves] + first_moves


class _BadMove(Exception):
    """A move (or its game's header) that fails a check, and the index of that move in the window."""

    def __init__(self, text: str, move_index: int):
        super().__init__(text)
        self.text, self.move_index = text, move_index


class _Window:
    """Whole games of one window: where each game and each move lies (in 16-bit words from the window's start;
    every record of hcpe3 is an even number of bytes), and the first structural problem found, if any."""

    def __init__(self) -> None:
        self.game_words: list[int] = []
        self.game_first_move: list[int] = []
        self.move_prefix = np.zeros(0, np.int64)
        """Where the moves of the games `compiled.walk_games` walked lie; `move_words` continues it."""
        self.move_words: list[int] = []
        self.problem: UserError | None = None

    def moves(self) -> np.ndarray:
        return np.concatenate([self.move_prefix, np.asarray(self.move_words, dtype=np.int64)])


def _walk(words: memoryview, base: int, size: int, at_file_end: bool, first_game: int, path) -> tuple[_Window, int]:
    """The games that lie whole in `words` (the file from byte `base`), and the word where the next game
    starts. A game cut by the window's end is left for the next window, unless the file ends there: then it
    is the problem (after its moves before the cut)."""
    window, end = _Window(), len(words)
    # The whole, sane games first, in compiled code (a Python loop over the moves was a sixth of a first open);
    # the loop below goes on from where it stopped: a game cut by the window's end, or one it must name.
    from tideborn.data.decode import compiled  # here: numba's import is for a process that opens hcpe3
    move_prefix = np.empty(end // 3 + 1, np.int64)  # a move is at least 3 words, a game 18
    game_prefix, first_prefix = np.empty(end // 18 + 1, np.int64), np.empty(end // 18 + 1, np.int64)
    walked, prefix_moves, k = compiled.walk_games(np.frombuffer(words, dtype=np.uint16), 0, end, MAX_LEGAL_MOVES,
                                                  move_prefix, game_prefix, first_prefix)
    window.move_prefix = move_prefix[:prefix_moves].copy()
    window.game_words, window.game_first_move = game_prefix[:walked].tolist(), first_prefix[:walked].tolist()
    del move_prefix, game_prefix, first_prefix
    moves, games, firsts = window.move_words, window.game_words, window.game_first_move
    append = moves.append
    game = first_game + walked
    while k < end or (at_file_end and base + 2 * k < size):
        if end - k < _HEADER_WORDS:
            if at_file_end:
                window.problem = truncated(path, game, base + 2 * k, "game header", HEADER_SIZE, size)
            return window, k
        moves_before = len(moves)
        p = k + _HEADER_WORDS
        try:  # the common case, in as few steps a move as can be: every move whole and sane
            for _ in range(words[k + 16]):
                count = words[p + 2]
                if count > MAX_LEGAL_MOVES:
                    raise IndexError
                append(p)
                p += _INFO_WORDS + 2 * count
            if p > end:
                raise IndexError
        except IndexError:
            del moves[moves_before:]
            problem, p = _game_problem(words, k, base, size, game, path, moves)
            if isinstance(problem, _Cut) and not at_file_end:  # the rest of the game is in the next window
                del moves[moves_before:]
                return window, k
            if problem is not None:
                window.problem = problem.error if isinstance(problem, _Sane) else UserError(str(problem))
        games.append(k)
        firsts.append(prefix_moves + moves_before)
        if window.problem is not None:
            return window, k
        k, game = p, game + 1
    return window, k


class _Cut(UserError):
    """A game cut by the window's end (an error only where the file ends there)."""


class _Sane(Exception):
    """A game that is malformed wherever the window ends (candidateNum past the most legal moves)."""

    def __init__(self, error: UserError):
        super().__init__(str(error))
        self.error = error


def _game_problem(words: memoryview, k: int, base: int, size: int, game: int, path, moves: list[int]
                  ) -> tuple[UserError | _Sane | None, int]:
    """The game at word `k` read move by move, as the fast walk could not: its moves before the problem go
    to `moves`; the problem is a `_Cut` (a truncation where the file ends, or more to read), a `_Sane`, or
    None when the game is whole after all. Also the word past the game."""
    end, offset = len(words), base + 2 * k
    move_num = words[k + 16]
    p = k + _HEADER_WORDS
    for i in range(move_num):
        if p + _INFO_WORDS > end:
            return _Cut(truncated(path, game, offset, f"move {i} of {move_num}", MOVE_INFO_SIZE, size,
                                  base + 2 * p).args[0]), p
        count = words[p + 2]
        if count > MAX_LEGAL_MOVES:
            return _Sane(UserError(f"{path}: game {game} (byte {offset}): move {i}: candidateNum {count} is more "
                                   f"than a position can have legal moves ({MAX_LEGAL_MOVES}); the file is corrupt "
                                   f"or misaligned")), p
        if p + _INFO_WORDS + 2 * count > end:
            reach = base + 2 * p + MOVE_INFO_SIZE + count * MOVE_VISITS_SIZE
            return _Cut(f"{path}: game {game} (byte {offset}): move {i}: candidateNum {count} reaches past the end "
                        f"of the file (byte {reach} of {size}); the file is cut short or is not hcpe3"), p
        moves.append(p)
        p += _INFO_WORDS + 2 * count
    return None, p


class ReplayedPositions:
    """The positions arrays of a file, window after window (`hcpe3.build_positions` gives their layout)."""

    def __init__(self, path, every_hcp: bool = True) -> None:
        """`every_hcp`: the full layout's hcp of every position; else only the anchors' (`anchor_starts`),
        and `arrays` gives the compact layout."""
        self.path = path
        self.every_hcp = every_hcp
        self.board = cshogi.Board()
        self.labels = move_labels()
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name in (
            ("game_offsets", "hcp", "eval", "move16", "result", "label", "game", "ply", "cand_counts",
             "cand_move16", "cand_label", "cand_visits") if every_hcp else
            ("game_offsets", "hcp", "anchor_position", "anchor_game", "anchor_ply", "anchor_result", "anchor",
             "eval", "move16", "cand_counts", "cand_move16", "cand_visits"))}
        self.games = 0
        self.positions = 0
        self.anchors = 0
        self.repetitions = 0

    def replay(self, data: bytes, at: int, base: int, size: int, at_file_end: bool) -> int:
        """Replay the whole games in `data[at:]` (the file from byte `base`); the bytes used (a game cut by
        the end of `data` is left for the next call, unless the file ends there)."""
        words = memoryview(data)[at:at + (len(data) - at) // 2 * 2].cast("H")
        window, used_words = _walk(words, base, size, at_file_end, self.games, self.path)
        if not window.game_words and window.problem is None:
            return 0
        array = np.frombuffer(data, "<u2", len(words), at)
        moves = window.moves()
        selected, counts = array[moves], array[moves + 2].astype(np.int64)
        cand_starts = np.zeros(len(moves) + 1, np.int64)
        np.cumsum(counts, out=cand_starts[1:])
        cand_words = np.repeat(moves + _INFO_WORDS - 2 * cand_starts[:-1], counts) + 2 * np.arange(cand_starts[-1])
        cand_moves = array[cand_words]
        cand_visits = array[cand_words + 1]
        file_bytes = np.frombuffer(data, np.uint8, len(words) * 2, at)
        headers = 2 * np.asarray(window.game_words, dtype=np.int64)
        header_bytes = file_bytes[headers[:, None] + np.arange(HEADER_SIZE)[None, :]]
        first_moves = np.asarray(window.game_first_move + [len(moves)], dtype=np.int64)
        game_of_move = np.repeat(np.arange(len(headers)), np.diff(first_moves))
        ply = np.arange(len(moves)) - first_moves[:-1][game_of_move]
        # the first bit of a HuffmanCodedPos is the side to move; it alternates with each move
        turns = (header_bytes[game_of_move, 0] & 1).astype(np.int64) ^ (ply & 1)
        plan = _Plan(selected, turns, counts, cand_starts, cand_moves,
                     np.ones(len(moves), np.bool_) if self.every_hcp else ply % ANCHOR_EVERY == 0)
        kings_ok = sane_kings(np.ascontiguousarray(header_bytes[:, :32])).tolist()
        hcp = np.empty((len(moves), 32), np.uint8)
        repeating: list[int] = []
        failure, done = None, len(moves)
        try:
            self._replay_moves(window, header_bytes, kings_ok, plan, first_moves, hcp, repeating, base)
        except _BadMove as bad:
            failure, done = UserError(bad.text), bad.move_index
        repeated = _first_repeated(cand_moves, counts, cand_starts, done)
        if repeated is not None:
            move, candidate = repeated
            game = int(np.searchsorted(window.game_first_move, move, side="right") - 1)
            move_num = int(header_bytes[game, 32]) | int(header_bytes[game, 33]) << 8
            raise UserError(f"{self.path}: game {self.games + game} (byte {base + 2 * window.game_words[game]}): "
                            f"move {int(ply[move])} of {move_num}: candidate {candidate:#06x} appears more than once "
                            f"among its {int(counts[move])}; the file is corrupt")
        if failure is not None:
            raise failure
        if window.problem is not None:
            raise window.problem
        kept = np.ones(len(moves), np.bool_)
        kept[repeating] = False
        self._keep(window, base, array, moves, selected, counts, cand_starts, cand_moves, cand_visits, header_bytes,
                   hcp, kept, turns, game_of_move, ply)
        return 2 * used_words

    def _replay_moves(self, window: _Window, header_bytes: np.ndarray, kings_ok: list[bool], plan: _Plan,
                      first_move_array: np.ndarray, hcp: np.ndarray, repeating: list[int], base: int) -> None:
        """The loop a board is needed for, game by game; a bad move is `_BadMove`. `hcp` is filled at the
        anchors (`plan.anchor`) and after each repetition. A game is played by `_play_fast`, and again by
        `_play_carefully` where that gives up: the careful loop names the first bad move, and plays on a
        board no legal move makes."""
        board = self.board
        op_array, op_start_array = plan.ops(first_move_array)
        first_moves = first_move_array.tolist()
        starts = np.ascontiguousarray(header_bytes[:, :32])
        result_bytes = header_bytes[:, 34]
        usable = (np.isin(result_bytes & RESULT_MASK, (cshogi.DRAW, cshogi.BLACK_WIN, cshogi.WHITE_WIN))
                  & (result_bytes & RESULT_UNKNOWN_BITS == 0) & np.asarray(kings_ok, dtype=np.bool_))
        played, gaps = self._play_compiled(starts, usable, first_move_array, op_array, op_start_array, hcp)
        op_starts = op_start_array.tolist()
        results = result_bytes.tolist()
        move_nums = (header_bytes[:, 32].astype(np.int64) | header_bytes[:, 33].astype(np.int64) << 8).tolist()
        for game_index, k in enumerate(window.game_words):
            first, last = first_moves[game_index], first_moves[game_index + 1]
            if played[game_index]:  # checked and played in compiled code, its anchors packed
                repeating.extend((np.flatnonzero(gaps[first:last]) + first).tolist())
                continue
            move_num, result = move_nums[game_index], results[game_index]
            if result & RESULT_MASK not in (cshogi.DRAW, cshogi.BLACK_WIN, cshogi.WHITE_WIN):
                raise _BadMove(f"{self._where(game_index, k, base)}: result byte {result:#04x} out of range (bits "
                               f"0-1 must be 0 draw, 1 black win or 2 white win); the file is not hcpe3 or is "
                               f"misaligned", first)
            if result & RESULT_UNKNOWN_BITS:
                raise _BadMove(f"{self._where(game_index, k, base)}: result byte {result:#04x} has unknown bits set "
                               f"({result & 0xE0:#04x}; only bits 0-4 are defined: result, sennichite, nyugyoku, "
                               f"max moves); the file is not hcpe3 or is misaligned", first)
            if not kings_ok[game_index]:
                raise _BadMove(f"{self._where(game_index, k, base)}: undecodable start position (king squares off "
                               f"the board); the file is not hcpe3 or is misaligned", first)
            start = starts[game_index]
            # A HuffmanCodedPos's 256 bits are all a set of 40 pieces needs: 32 damaged bytes that decode to more
            # of a kind (a third rook) made cshogi's decoder read past them, so what it built, or whether it met
            # an incorrect code, differed from one reading to the next. Such a start is refused with one
            # message whatever it holds, the same at every reading.
            try:
                board.set_hcp(start)
                decoded = material_problem(board) is None
            except RuntimeError:
                decoded = False
            if not decoded:
                raise _BadMove(f"{self._where(game_index, k, base)}: {UNDECODABLE_START}; the file is not hcpe3 or "
                               f"is misaligned", first)
            # A board holding a piece code that is no piece (15: a "promoted gold", from a damaged start
            # position or a selected move is_legal lets through) crashes is_legal on some moves: such a
            # board is never given to the fast loop, whose candidates are checked with is_legal alone.
            sane = _NOT_PIECES.isdisjoint(board.pieces)
            if sane:
                repeated_before = len(repeating)
                ops = _op_list(op_array[op_starts[game_index]:op_starts[game_index + 1]])
                if self._play_fast(ops, first, hcp, repeating):
                    continue
                del repeating[repeated_before:]
                # back to the start position by taking the moves back, cheaper than decoding it again
                for _ in range(len(board.history)):
                    board.pop()
            self._play_carefully(plan, first, last, self._where(game_index, k, base), move_num, sane, hcp,
                                 repeating)

    @staticmethod
    def _play_compiled(starts: np.ndarray, usable: np.ndarray, first_moves: np.ndarray, ops: np.ndarray,
                       op_starts: np.ndarray, hcp: np.ndarray) -> tuple[list[int], np.ndarray]:
        """Per game of the window, 1 where the compiled loop (`compiled.play_games`: `_play_fast`'s work)
        checked and played it, 0 where it left the game to the loops below (a usable game only: its result
        byte and kings are right); and per move, nonzero where a repetition leaves the position out."""
        # Imported here: numba's import is for a process that opens hcpe3.
        from tideborn.data.decode import compiled
        played = np.zeros(len(usable), dtype=np.uint8)
        gaps = np.zeros(len(hcp), dtype=np.uint8)
        compiled.play_games(starts, usable, first_moves, ops, op_starts, hcp, played, gaps)
        return played.tolist(), gaps

    def _where(self, game_index: int, word: int, base: int) -> str:
        """How a message names the window's game `game_index` (at `word`): made only for a message."""
        return f"{self.path}: game {self.games + game_index} (byte {base + 2 * word})"

    def _play_fast(self, ops: list[int], move_index: int, hcp: np.ndarray, repeating: list[int]) -> bool:
        """One game's moves (the first is the window's `move_index`) and candidates (`_Plan.ops`) checked and
        played, in as few steps as can be; False at the first thing that is not plainly right (an illegal
        move, a candidate is_legal alone cannot settle, a board no legal move makes), which
        `_play_carefully` then reads move by move."""
        board = self.board
        push, to_hcp, from_move16, is_legal, is_draw = (board.push, board.to_hcp, board.move_from_move16,
                                                        board.is_legal, board.is_draw)
        allowed, leaves_gap, plies = ALLOWED_PIECES, _LEAVES_GAP, REPETITION_PLIES
        move_op, check_bits, anchor_bit, never = MOVE_OP, CHECK_BITS, ANCHOR_BIT, NEVER  # locals: read per op
        gap = False
        for op in ops:
            if op < 0x10000:  # most ops: a candidate is_legal settles alone
                if is_legal(from_move16(op)):
                    continue
                return False
            if op < move_op:  # a candidate that is legal only if the piece it moves may make it
                if op >> 16 == never:  # not a move at all (squares off the board): never given to cshogi
                    return False
                full = from_move16(op & 0xFFFF)
                if is_legal(full) and allowed[op >> 16] >> (full >> 16 & 0xF) & 1:
                    continue
                return False
            move = from_move16(op & 0xFFFF)
            if not is_legal(move) or op & check_bits and not allowed[op >> 16 & 7] >> (move >> 16 & 0xF) & 1:
                return False
            if gap or op & anchor_bit:
                to_hcp(hcp[move_index])
            push(move)
            # After the move, not `move_is_draw(move, 16)` before it: cshogi's `move_is_draw` misses the
            # superior and inferior repetitions (a returned position with more or fewer pieces in hand),
            # which dlshogi's `moveIsDraw` finds and skips; `is_draw` after the move finds all three.
            gap = leaves_gap[is_draw(plies)]
            if gap:
                repeating.append(move_index)
            move_index += 1
        return True

    def _play_carefully(self, plan: _Plan, first: int, last: int, where: str, move_num: int, sane: bool,
                        hcp: np.ndarray, repeating: list[int]) -> None:
        """Moves `first` to `last` (one game, its start position set) one check at a time, as the file is
        read move by move: the first bad move is `_BadMove`; on a board no legal move makes (not `sane`),
        the candidates are looked up in the legal moves."""
        board = self.board
        push, to_hcp, from_move16, is_legal, is_draw = (board.push, board.to_hcp, board.move_from_move16,
                                                        board.is_legal, board.is_draw)
        selected = plan.selected[first:last].tolist()
        selected_checks = plan.selected_checks[first:last].tolist()
        anchor_at = plan.anchor[first:last].tolist()
        try_starts = plan.try_starts[first:last + 1]
        tried = plan.tried[try_starts[0]:try_starts[-1]].tolist()
        try_starts = (try_starts - try_starts[0]).tolist()
        after_gap = False
        for here in range(last - first):
            move_index = first + here
            chosen = selected[here]
            move = from_move16(chosen) if chosen else 0
            if not move or not is_legal(move):
                what = "empty" if not chosen else f"{chosen:#06x}, illegal"
                raise _BadMove(f"{where}: move {here} of {move_num}: selected move {what} in the replayed position "
                               f"({board.sfen()}); the file is corrupt or misaligned", move_index)
            check = selected_checks[here]
            if check != PLAIN and sane:
                # is_legal took it; if the legal moves do not hold it (a gold promoted, a pawn left on
                # the last rank), the board is one no legal move makes, from here to the game's end
                sane = bool(ALLOWED_PIECES[check] >> (move >> 16 & 0xF) & 1)
            if not sane:
                legal = {m & 0xFFFF for m in board.legal_moves}
            for candidate in tried[try_starts[here]:try_starts[here + 1]]:
                if not sane:
                    candidate &= 0xFFFF
                    if candidate in legal:
                        continue
                else:
                    check, candidate = candidate >> 16, candidate & 0xFFFF
                    if check != NEVER:
                        full = from_move16(candidate)
                        if is_legal(full) and ALLOWED_PIECES[check] >> (full >> 16 & 0xF) & 1:
                            continue
                raise _BadMove(f"{where}: move {here} of {move_num}: candidate {candidate:#06x} is not a legal "
                               f"move in the replayed position ({board.sfen()})", move_index)
            if after_gap or anchor_at[here]:
                to_hcp(hcp[move_index])
            push(move)
            after_gap = is_draw(REPETITION_PLIES) in REPETITIONS_SKIPPED
            if after_gap:
                repeating.append(move_index)

    def _keep(self, window: _Window, base: int, array: np.ndarray, moves: np.ndarray, selected: np.ndarray,
              counts: np.ndarray, cand_starts: np.ndarray, cand_moves: np.ndarray, cand_visits: np.ndarray,
              header_bytes: np.ndarray, hcp: np.ndarray, kept: np.ndarray, turns: np.ndarray,
              game_of_move: np.ndarray, ply: np.ndarray) -> None:
        rows = np.flatnonzero(kept)
        self.repetitions += len(moves) - len(rows)
        parts = self.parts
        parts["game_offsets"].append(base + 2 * np.asarray(window.game_words, dtype=np.int64))
        if self.every_hcp:
            parts["hcp"].append(hcp[rows])
            parts["result"].append(header_bytes[game_of_move[rows], 34])
            # the compact layout computes the labels at read
            turn = turns[rows]
            labels = self.labels[turn, selected[rows]]
            for row in np.flatnonzero(labels == NO_LABEL).tolist():  # stray high bits is_legal ignores (as ever)
                labels[row] = make_move_label(int(selected[rows[row]]), int(turn[row]))
            parts["label"].append(labels)
            parts["game"].append((self.games + game_of_move[rows]).astype(np.int32))
            parts["ply"].append(ply[rows].astype(np.uint16))
        else:
            # The compact layout's per-anchor arrays, window by window: windows hold whole games, so the anchors
            # here are those of the whole file, and no array of the whole file is needed to find them (a game
            # and a ply a position, 6 bytes, and their int64 copies, were most of the first open's memory).
            starts = anchor_starts(game_of_move[rows], ply[rows])
            at = rows[starts]
            parts["hcp"].append(hcp[at])
            parts["anchor_position"].append(self.positions + np.flatnonzero(starts))
            parts["anchor_game"].append((self.games + game_of_move[at]).astype(np.int32))
            parts["anchor_ply"].append(ply[at].astype(np.uint16))
            parts["anchor_result"].append(header_bytes[game_of_move[at], 34])
            anchor = np.cumsum(starts, dtype=np.uint32)  # >= 1: a window's first position is an anchor
            anchor += np.uint32(self.anchors)
            anchor -= np.uint32(1)
            parts["anchor"].append(anchor)
            self.anchors += len(at)
        parts["eval"].append(array[moves[rows] + 1].view(np.int16))
        parts["move16"].append(selected[rows])
        parts["cand_counts"].append(counts[rows].astype(np.uint16))  # at most MAX_LEGAL_MOVES
        self.positions += len(rows)
        # the candidates of the positions kept: the ranges between the few left out (a mask over all of them
        # cost a pass more, and a copy, for a handful of repetitions)
        left_out = np.flatnonzero(~kept)
        bounds = np.column_stack([cand_starts[left_out], cand_starts[left_out + 1]]).reshape(-1).tolist()
        pieces = list(zip([0, *bounds[1::2]], [*bounds[0::2], len(cand_moves)]))
        kept_moves = np.concatenate([cand_moves[a:b] for a, b in pieces])
        parts["cand_move16"].append(kept_moves)
        if self.every_hcp:
            cand_turns = np.repeat(turns, counts)
            parts["cand_label"].append(self.labels[np.concatenate([cand_turns[a:b] for a, b in pieces]),
                                                   kept_moves])
        parts["cand_visits"].append(np.concatenate([cand_visits[a:b] for a, b in pieces]))
        self.games += len(window.game_words)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the whole file (once: each array's windows are let go as it is joined, so that the
        file's arrays are never held twice)."""
        def joined(name: str, dtype: typing.Any, shape: tuple[int, ...] = ()) -> np.ndarray:
            pieces = self.parts.pop(name)
            return np.concatenate(pieces).astype(dtype, copy=False) if pieces else np.empty((0, *shape), dtype)

        counts = joined("cand_counts", np.uint16)
        offsets = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, dtype=np.int64, out=offsets[1:])
        del counts
        if not self.every_hcp:
            return {
                "game_offsets": joined("game_offsets", np.int64), "hcp": joined("hcp", np.uint8, (32,)),
                "anchor_position": joined("anchor_position", np.int64), "anchor_game": joined("anchor_game", np.int32),
                "anchor_ply": joined("anchor_ply", np.uint16), "anchor_result": joined("anchor_result", np.uint8),
                "anchor": joined("anchor", np.uint32),
                "eval": joined("eval", np.int16), "move16": joined("move16", np.uint16), "cand_offsets": offsets,
                "cand_move16": joined("cand_move16", np.uint16), "cand_visits": joined("cand_visits", np.uint16),
            }
        return {
            "game_offsets": joined("game_offsets", np.int64),
            "hcp": joined("hcp", np.uint8, (32,)),
            "eval": joined("eval", np.int16),
            "move16": joined("move16", np.uint16),
            "result": joined("result", np.uint8),
            "label": joined("label", np.uint16),
            "game": joined("game", np.int32),
            "ply": joined("ply", np.uint16),
            "cand_offsets": offsets,
            "cand_move16": joined("cand_move16", np.uint16),
            "cand_label": joined("cand_label", np.uint16),
            "cand_visits": joined("cand_visits", np.uint16),
        }


def _first_repeated(cand_moves: np.ndarray, counts: np.ndarray, cand_starts: np.ndarray, before: int
                    ) -> tuple[int, int] | None:
    """(move index, the candidate) of the first move before `before` whose candidates hold one move16 twice,
    the candidate named being the first that appears again, as a reading in order finds it; None if none."""
    within = int(cand_starts[before])
    if within == 0:
        return None
    owner = np.repeat(np.arange(before, dtype=np.uint32), counts[:before])
    # The usual answer (none) for the price of a sort: of 32-bit keys, twice as fast as of 64-bit ones, a
    # block of 65,536 moves at a time (a move's number within its block, the candidate)
    short_keys = (owner & 0xFFFF) << 16 | cand_moves[:within]
    for block in range(0, before, 1 << 16):
        ordered = np.sort(short_keys[int(cand_starts[block]):int(cand_starts[min(block + (1 << 16), before)])])
        if (ordered[1:] == ordered[:-1]).any():
            break
    else:
        return None
    owner = owner.astype(np.int64)
    keys = owner << 16 | cand_moves[:within]
    order = np.argsort(keys, kind="stable")
    again = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if not len(again):
        return None
    second = order[again + 1]  # the later of each equal pair, in file order
    first_move = int(owner[second].min())
    candidates = second[owner[second] == first_move]
    return first_move, int(cand_moves[candidates.min()])
