"""`tideborn.match.search`: the PUCT searcher gives a legal move with its figures, the same search twice for
the same seed, honours playouts, deadlines and stops, finds a mate in one, sees the rules' ends in the tree,
and searches many positions in one batch."""

from __future__ import annotations

import threading
import time

import cshogi
import pytest
import torch

from tideborn.config.schema import ModelSettings
from tideborn.match.search import Searcher, SearchInfo, SearchResult
from tideborn.network.model import build_model

MATE_IN_ONE = "4k4/9/4G4/9/9/9/9/9/4K4 b G 1"
"""Black drops the gold in hand on 5b: mate."""
MATED = "4k4/4G4/4G4/9/9/9/9/9/4K4 w - 1"
"""White to move, checkmated by the gold on 5b (defended by the one on 5c)."""
MIDGAME = "ln1g3nl/1r3kg2/p2pppsp1/2ps2p1p/1p7/2P1P1PP1/PPSP1PS1P/1BG2R3/LN2KG1NL b Bp 33"


@pytest.fixture(scope="module")
def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelSettings(blocks=1, channels=8, value_channels=4, value_hidden=16)).eval()


def usi(moves: list[int]) -> list[str]:
    return [cshogi.move_to_usi(move) for move in moves]


def test_think_gives_a_legal_move_its_line_and_figures_and_leaves_the_board_as_it_was(net):
    board = cshogi.Board(MIDGAME)
    before = (board.sfen(), len(board.history))
    result = Searcher(net).think(board, playouts=120)
    assert isinstance(result, SearchResult)
    assert result.move in list(board.legal_moves)
    assert result.decision is None
    assert result.nodes == 120
    assert result.pv[0] == result.move and result.depth == len(result.pv) >= 2
    assert result.seldepth >= result.depth
    assert 0.0 <= result.value <= 1.0
    line = board.copy()
    for move in result.pv:  # the best line is a sequence of legal moves
        assert line.is_legal(move), usi(result.pv)
        line.push(move)
    assert (board.sfen(), len(board.history)) == before


def test_the_same_seed_searches_the_same_and_a_temperature_draws_reproducibly(net):
    board = cshogi.Board(MIDGAME)
    first, second = (Searcher(net, seed=3).think(board, playouts=80) for _ in range(2))
    assert first.move == second.move and first.pv == second.pv and first.value == second.value
    drawn = [Searcher(net, seed=seed, temperature=10.0).think(board, playouts=40).move for seed in (1, 1, 2, 3, 4)]
    assert drawn[0] == drawn[1]
    assert len(set(drawn)) > 1, "a high temperature draws different moves for different seeds"


def test_a_mate_in_one_is_played_and_scored_as_a_win(net):
    board = cshogi.Board(MATE_IN_ONE)
    result = Searcher(net).think(board, playouts=50)
    assert usi([result.move]) == ["G*5b"]
    assert result.value == 1.0 and result.pv == [result.move]
    board.push(result.move)
    assert board.is_game_over()


def test_a_mated_side_gets_no_move_and_resigns(net):
    result = Searcher(net).think(cshogi.Board(MATED), playouts=10)
    assert result.move == 0 and result.decision == "resign" and result.value == 0.0


def test_the_draw_ply_makes_every_line_a_draw(net):
    """With one ply left before max moves, every move ends the game drawn: the search says 0.5."""
    result = Searcher(net).think(cshogi.Board(MIDGAME), playouts=40, plies_to_draw=1)
    assert result.value == pytest.approx(0.5)
    assert result.seldepth == 1


def test_a_passed_deadline_or_a_set_stop_still_gives_a_move_after_the_root_evaluation(net):
    board = cshogi.Board(MIDGAME)
    late = Searcher(net).think(board, deadline=time.monotonic() - 1.0)
    assert late.nodes == 0 and late.move in list(board.legal_moves)
    stop = threading.Event()
    stop.set()
    stopped = Searcher(net).think(board, stop=stop)
    assert stopped.nodes == 0 and stopped.move == late.move  # the policy's favourite


def test_a_deadline_ends_an_unbounded_search(net):
    start = time.monotonic()
    result = Searcher(net).think(cshogi.Board(MIDGAME), deadline=start + 0.3)
    assert result.nodes > 0
    # one forward pass of 16 leaves may run past the deadline; a generous bound for a busy machine
    assert 0.3 <= time.monotonic() - start < 10.0


def test_infos_come_at_most_every_half_second_and_a_stop_from_another_thread_ends_the_search(net):
    infos: list[SearchInfo] = []
    stop = threading.Event()

    def on_info(info: SearchInfo) -> None:
        infos.append(info)
        if len(infos) == 3:
            threading.Thread(target=stop.set).start()

    result = Searcher(net, batch_size=4).think(cshogi.Board(MIDGAME), stop=stop, on_info=on_info)
    assert len(infos) >= 3
    assert all(later.seconds - earlier.seconds >= 0.45 for earlier, later in zip(infos, infos[1:]))
    assert all(info.pv and info.depth == len(info.pv) for info in infos)
    assert result.nodes >= infos[2].nodes
    assert result.seconds < infos[2].seconds + 5.0


def test_search_many_gives_every_position_its_playouts_in_shared_batches(net):
    boards = [cshogi.Board(), cshogi.Board(MIDGAME), cshogi.Board(MATE_IN_ONE), cshogi.Board(MATED)]
    calls: list[int] = []
    searcher = Searcher(net)
    evaluate = searcher.player.evaluate

    def counted(features1, features2):
        calls.append(len(features1))
        return evaluate(features1, features2)

    searcher.player.evaluate = counted
    results = searcher.search_many(boards, playouts=32)
    assert [result.nodes for result in results[:2]] == [32, 32]
    assert results[0].move in list(boards[0].legal_moves) and results[1].move in list(boards[1].legal_moves)
    assert usi([results[2].move]) == ["G*5b"] and results[3].decision == "resign"
    assert max(calls) > 8, f"leaves of several trees share a forward pass: {calls}"
    again = Searcher(net).search_many(boards, playouts=32)
    assert [(r.move, r.pv, r.value) for r in results] == [(r.move, r.pv, r.value) for r in again]
