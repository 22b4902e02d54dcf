"""The engine's thinkers never answer cshogi's one-ply mate from a position in check: cshogi's `mate_move_in_1ply`
is for positions not in check, and in this one (from a game the engine played against itself) it answers G*5b,
a mate of the other king that leaves black's own in check by the promoted knight on 4i: an illegal move."""

from __future__ import annotations

import threading

import cshogi
import pytest
import torch

from tideborn.config.schema import ModelSettings
from tideborn.match.players import TorchPlayer
from tideborn.match.search import Searcher
from tideborn.network.model import build_model
from tideborn.usi.thinking import Limits, PolicyThinker, SearchThinker

IN_CHECK = "lr3kb1+S/5Bs+N1/pp1pPpp+Lp/1gp6/8P/P6p1/1PPP1PPPR/+n2G1GS2/L1S1K+n1NL b GP 51"


@pytest.fixture(scope="module")
def player() -> TorchPlayer:
    torch.manual_seed(0)
    return TorchPlayer(build_model(ModelSettings(blocks=1, channels=8, value_channels=4, value_hidden=16)).eval())


def test_the_position_is_one_where_cshogi_answers_an_illegal_mate() -> None:
    board = cshogi.Board(IN_CHECK)
    assert board.is_check()
    mate = board.mate_move_in_1ply()
    assert mate and not board.is_legal(mate), "cshogi no longer answers an illegal mate here: a new premise is needed"


@pytest.mark.parametrize("thinker", ["policy", "search"])
def test_a_thinker_in_check_answers_a_legal_move(player: TorchPlayer, thinker: str) -> None:
    board = cshogi.Board(IN_CHECK)
    chosen = PolicyThinker(player) if thinker == "policy" else SearchThinker(Searcher(player), playouts=16)
    thought = chosen.think(board, Limits(playouts=16), threading.Event(), lambda info: None)
    assert thought.move in list(board.legal_moves), cshogi.move_to_usi(thought.move)
    assert thought.mate is None
