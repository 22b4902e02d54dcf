"""The replay behind an hcpe3 file's first open: every game's moves played with cshogi into the positions arrays.

What the Python loop per move keeps to is what only a board can answer: the selected move and each candidate
legal, the position packed (`to_hcp`: only at the compact cache's anchors, `anchor_starts`, unless every
position's hcp is asked for), the move played, the repetition looked for. Everything else is done
in bulk with numpy on a window of whole games: finding the MoveInfos (a short walk over the candidate
counts), reading evals, moves and visit counts, the policy labels (a table of `make_move_label` over every
move16 that can be legal), candidates repeated within a move, the CSR arrays.

Errors are those of a move-by-move reading, in the same order: the first bad move of the file is the one
named, whatever kind of check finds it.
"""

from __future__ import annotations

import typing

import cshogi
import numpy as np
from cshogi.dlshogi import make_move_label

from tideborn.data.features import sane_kings
from tideborn.errors import UserError

HEADER_SIZE, MOVE_INFO_SIZE, MOVE_VISITS_SIZE = 36, 6, 4
RESULT_MASK = 0x3
RESULT_UNKNOWN_BITS = 0xE0
MAX_LEGAL_MOVES = 593
REPETITIONS_SKIPPED = (cshogi.REPETITION_DRAW, cshogi.REPETITION_SUPERIOR, cshogi.REPETITION_INFERIOR)
REPETITION_PLIES = 16
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


PLAIN, NEVER, PROMOTION, TO_LAST_RANK, TO_NEXT_TO_LAST_RANK = range(5)
"""How a candidate's legality is settled (`candidate_checks`)."""
_GOLD, _KNIGHT = 7, 3
_NOT_PIECES = frozenset((15, 16, 31))
"""Piece codes of cshogi's board that are no piece (a "promoted gold" of either side, a white nothing)."""
"""cshogi's piece types (pawn 1 ... rook 6, gold 7, king 8, promoted pieces above), as a move's bits 16-19
carry the type of the piece it moves."""


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
        self.move_words: list[int] = []
        self.problem: UserError | None = None


def _walk(words: memoryview, base: int, size: int, at_file_end: bool, first_game: int, path) -> tuple[_Window, int]:
    """The games that lie whole in `words` (the file from byte `base`), and the word where the next game
    starts. A game cut by the window's end is left for the next window, unless the file ends there: then it
    is the problem (after its moves before the cut)."""
    window, end, k = _Window(), len(words), 0
    moves, games, firsts = window.move_words, window.game_words, window.game_first_move
    append = moves.append
    game = first_game
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
        firsts.append(moves_before)
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
            "game_offsets", "hcp", "eval", "move16", "result", "label", "game", "ply", "cand_counts",
            "cand_move16", "cand_label", "cand_visits")}
        self.games = 0
        self.repetitions = 0

    def replay(self, data: bytes, at: int, base: int, size: int, at_file_end: bool) -> int:
        """Replay the whole games in `data[at:]` (the file from byte `base`); the bytes used (a game cut by
        the end of `data` is left for the next call, unless the file ends there)."""
        words = memoryview(data)[at:at + (len(data) - at) // 2 * 2].cast("H")
        window, used_words = _walk(words, base, size, at_file_end, self.games, self.path)
        if not window.game_words and window.problem is None:
            return 0
        array = np.frombuffer(data, "<u2", len(words), at)
        moves = np.asarray(window.move_words, dtype=np.int64)
        selected, counts = array[moves], array[moves + 2].astype(np.int64)
        cand_starts = np.zeros(len(moves) + 1, np.int64)
        np.cumsum(counts, out=cand_starts[1:])
        cand_words = np.repeat(moves + _INFO_WORDS - 2 * cand_starts[:-1], counts) + 2 * np.arange(cand_starts[-1])
        cand_moves = array[cand_words]
        cand_visits = array[cand_words + 1]
        owner = np.repeat(np.arange(len(moves)), counts)
        # a candidate that is the selected move is as legal as the selected move: only the others are tried
        file_bytes = np.frombuffer(data, np.uint8, len(words) * 2, at)
        headers = 2 * np.asarray(window.game_words, dtype=np.int64)
        header_bytes = file_bytes[headers[:, None] + np.arange(HEADER_SIZE)[None, :]]
        game_of_move = np.repeat(np.arange(len(headers)),
                                 np.diff(np.asarray(window.game_first_move + [len(moves)], dtype=np.int64)))
        ply = np.arange(len(moves)) - np.asarray(window.game_first_move, dtype=np.int64)[game_of_move]
        # the first bit of a HuffmanCodedPos is the side to move; it alternates with each move
        turns = (header_bytes[game_of_move, 0] & 1).astype(np.int64) ^ (ply & 1)
        cand_turns = turns[owner]
        checks = candidate_checks()[cand_turns, cand_moves].astype(np.int64)
        # a candidate that is the selected move is as legal as the selected move, unless is_legal alone cannot
        # tell: only the others are tried
        to_try = np.flatnonzero((cand_moves != selected[owner]) | (checks != PLAIN))
        try_starts = np.searchsorted(owner[to_try], np.arange(len(moves) + 1))
        tried = (cand_moves[to_try].astype(np.int64) | checks[to_try] << 16).tolist()
        selected_checks = candidate_checks()[turns, selected].tolist()
        kings_ok = sane_kings(np.ascontiguousarray(header_bytes[:, :32])).tolist()
        hcp = np.empty((len(moves), 32), np.uint8)
        repeating: list[int] = []
        failure, done = None, len(moves)
        # a position after a left-out repetition is an anchor too: the loop packs it on seeing the repetition
        anchor_at = None if self.every_hcp else (ply % ANCHOR_EVERY == 0).tolist()
        try:
            self._replay_moves(window, header_bytes, kings_ok, selected.tolist(), selected_checks, tried,
                               try_starts.tolist(), hcp, repeating, base, anchor_at)
        except _BadMove as bad:
            failure, done = UserError(bad.text), bad.move_index
        repeated = _first_repeated(cand_moves, owner, cand_starts, done)
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
        self._keep(window, base, array, moves, selected, counts, cand_moves, cand_visits, header_bytes, hcp, kept,
                   turns, game_of_move, ply)
        return 2 * used_words

    def _replay_moves(self, window: _Window, header_bytes: np.ndarray, kings_ok: list[bool], selected: list[int],
                      selected_checks: list[int],
                      tried: list[int], try_starts: list[int], hcp: np.ndarray, repeating: list[int],
                      base: int, anchor_at: list[bool] | None) -> None:
        """The loop a board is needed for; a bad move is `_BadMove`. `hcp` is filled where `anchor_at` (by
        move) says, and after each repetition; everywhere when it is None."""
        board = self.board
        push, to_hcp, from_move16, is_legal, is_draw = (board.push, board.to_hcp, board.move_from_move16,
                                                        board.is_legal, board.is_draw)
        first_moves = window.game_first_move + [len(selected)]
        skipped = REPETITIONS_SKIPPED
        for game_index, k in enumerate(window.game_words):
            game = self.games + game_index
            offset = base + 2 * k
            where = f"{self.path}: game {game} (byte {offset})"
            first = first_moves[game_index]
            header = header_bytes[game_index]
            move_num, result = int(header[32]) | int(header[33]) << 8, int(header[34])
            if result & RESULT_MASK not in (cshogi.DRAW, cshogi.BLACK_WIN, cshogi.WHITE_WIN):
                raise _BadMove(f"{where}: result byte {result:#04x} out of range (bits 0-1 must be 0 draw, "
                               f"1 black win or 2 white win); the file is not hcpe3 or is misaligned", first)
            if result & RESULT_UNKNOWN_BITS:
                raise _BadMove(f"{where}: result byte {result:#04x} has unknown bits set ({result & 0xE0:#04x}; "
                               f"only bits 0-4 are defined: result, sennichite, nyugyoku, max moves); the file "
                               f"is not hcpe3 or is misaligned", first)
            if not kings_ok[game_index]:
                raise _BadMove(f"{where}: undecodable start position (king squares off the board); the file "
                               f"is not hcpe3 or is misaligned", first)
            try:
                board.set_hcp(np.ascontiguousarray(header[:32]))
            except RuntimeError as exc:
                raise _BadMove(f"{where}: undecodable start position ({exc})", first) from None
            # A board holding a piece code that is no piece (15: a "promoted gold", from a damaged start
            # position or a selected move is_legal lets through) crashes is_legal on some moves: the
            # candidates of such a game are looked up in the legal moves, as every candidate once was.
            sane = _NOT_PIECES.isdisjoint(board.pieces)
            after_gap = False
            for move_index in range(first, first_moves[game_index + 1]):
                chosen = selected[move_index]
                move = from_move16(chosen) if chosen else 0
                if not move or not is_legal(move):
                    what = "empty" if not chosen else f"{chosen:#06x}, illegal"
                    raise _BadMove(f"{where}: move {move_index - first} of {move_num}: selected move {what} "
                                   f"in the replayed position ({board.sfen()}); the file is corrupt or misaligned",
                                   move_index)
                check = selected_checks[move_index]
                if check != PLAIN and sane:
                    # is_legal took it; if the legal moves do not hold it (a gold promoted, a pawn left on
                    # the last rank), the board is one no legal move makes, from here to the game's end
                    piece = move >> 16 & 0xF
                    sane = check != NEVER and (piece < _GOLD if check == PROMOTION else piece > _KNIGHT
                                               if check == TO_LAST_RANK else piece != _KNIGHT)
                if not sane:
                    legal = {m & 0xFFFF for m in board.legal_moves}
                for candidate in tried[try_starts[move_index]:try_starts[move_index + 1]]:
                    if not sane:
                        candidate &= 0xFFFF
                        if candidate in legal:
                            continue
                    elif candidate < 0x10000:
                        if is_legal(from_move16(candidate)):
                            continue
                    else:
                        check, candidate = candidate >> 16, candidate & 0xFFFF
                        if check != NEVER:
                            full = from_move16(candidate)
                            if is_legal(full):
                                piece = full >> 16 & 0xF
                                if (piece < _GOLD if check == PROMOTION else
                                        piece > _KNIGHT if check == TO_LAST_RANK else piece != _KNIGHT):
                                    continue
                    raise _BadMove(f"{where}: move {move_index - first} of {move_num}: candidate "
                                   f"{candidate:#06x} is not a legal move in the replayed position "
                                   f"({board.sfen()})", move_index)
                if anchor_at is None or after_gap or anchor_at[move_index]:
                    to_hcp(hcp[move_index])
                push(move)
                # After the move, not `move_is_draw(move, 16)` before it: cshogi's `move_is_draw` misses the
                # superior and inferior repetitions (a returned position with more or fewer pieces in hand),
                # which dlshogi's `moveIsDraw` finds and skips; `is_draw` after the move finds all three.
                after_gap = is_draw(REPETITION_PLIES) in skipped
                if after_gap:
                    repeating.append(move_index)

    def _keep(self, window: _Window, base: int, array: np.ndarray, moves: np.ndarray, selected: np.ndarray,
              counts: np.ndarray, cand_moves: np.ndarray, cand_visits: np.ndarray, header_bytes: np.ndarray,
              hcp: np.ndarray, kept: np.ndarray, turns: np.ndarray, game_of_move: np.ndarray, ply: np.ndarray
              ) -> None:
        rows = np.flatnonzero(kept)
        self.repetitions += len(moves) - len(rows)
        parts = self.parts
        parts["game_offsets"].append(base + 2 * np.asarray(window.game_words, dtype=np.int64))
        if self.every_hcp:
            parts["hcp"].append(hcp[rows])
        else:  # windows hold whole games: the anchors here are those of the whole file
            parts["hcp"].append(hcp[rows[anchor_starts(game_of_move[rows], ply[rows])]])
        parts["eval"].append(array[moves[rows] + 1].view(np.int16))
        parts["move16"].append(selected[rows])
        parts["result"].append(header_bytes[game_of_move[rows], 34])
        if self.every_hcp:  # the compact layout computes the labels at read
            turn = turns[rows]
            labels = self.labels[turn, selected[rows]]
            for row in np.flatnonzero(labels == NO_LABEL).tolist():  # stray high bits is_legal ignores (as ever)
                labels[row] = make_move_label(int(selected[rows[row]]), int(turn[row]))
            parts["label"].append(labels)
        parts["game"].append((self.games + game_of_move[rows]).astype(np.int32))
        parts["ply"].append(ply[rows].astype(np.uint16))
        parts["cand_counts"].append(counts[rows])
        take = np.repeat(kept, counts)
        kept_moves = cand_moves[take]
        parts["cand_move16"].append(kept_moves)
        if self.every_hcp:
            parts["cand_label"].append(self.labels[np.repeat(turns, counts)[take], kept_moves])
        parts["cand_visits"].append(cand_visits[take])
        self.games += len(window.game_words)

    def arrays(self) -> dict[str, np.ndarray]:
        def joined(name: str, dtype: typing.Any, shape: tuple[int, ...] = ()) -> np.ndarray:
            pieces = self.parts[name]
            return np.concatenate(pieces).astype(dtype, copy=False) if pieces else np.empty((0, *shape), dtype)

        counts = joined("cand_counts", np.int64)
        offsets = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        if not self.every_hcp:
            game, ply = joined("game", np.int32), joined("ply", np.uint16)
            starts = anchor_starts(game, ply)
            rows = np.flatnonzero(starts)
            hcp = joined("hcp", np.uint8, (32,))
            if len(hcp) != len(rows):
                raise RuntimeError(f"{self.path}: {len(hcp)} anchors packed for {len(rows)} (a replay bug)")
            return {
                "game_offsets": joined("game_offsets", np.int64), "hcp": hcp,
                "anchor_position": rows.astype(np.int64), "anchor_game": game[rows].astype(np.int32),
                "anchor_ply": ply[rows], "anchor_result": joined("result", np.uint8)[rows],
                "anchor": (np.cumsum(starts) - 1).astype(np.uint32),
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


def _first_repeated(cand_moves: np.ndarray, owner: np.ndarray, cand_starts: np.ndarray, before: int
                    ) -> tuple[int, int] | None:
    """(move index, the candidate) of the first move before `before` whose candidates hold one move16 twice,
    the candidate named being the first that appears again, as a reading in order finds it; None if none."""
    within = int(cand_starts[before])
    if within == 0:
        return None
    keys = owner[:within] << 16 | cand_moves[:within].astype(np.int64)
    ordered = np.sort(keys)
    if not (ordered[1:] == ordered[:-1]).any():  # the usual answer, for the price of a sort
        return None
    order = np.argsort(keys, kind="stable")
    again = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if not len(again):
        return None
    second = order[again + 1]  # the later of each equal pair, in file order
    first_move = int(owner[second].min())
    candidates = second[owner[second] == first_move]
    return first_move, int(cand_moves[candidates.min()])
