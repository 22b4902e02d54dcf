"""`tideborn usi` refuses a `go` with a negative limit in one `info string error` line and answers without a
search, and quotes a GUI's words in its error lines cut short and without control characters (a 5 MB token was
sent back whole, and an escape sequence reached the GUI's log and the terminal as it came)."""

from __future__ import annotations

import unicodedata

import cshogi
import pytest
import torch

from tests.helpers.usi import InProcessEngine
from tideborn.config.schema import ModelSettings
from tideborn.match.players import TorchPlayer
from tideborn.match.search import Searcher
from tideborn.network.model import build_model
from tideborn.usi.engine import Engine
from tideborn.usi.thinking import PolicyThinker, SearchThinker

HUGE = "x" * 5_000_000
LONGEST_ERROR_LINE = 400
"""Characters: an error line of the engine's own words and a few of the GUI's, cut short."""


@pytest.fixture(scope="module")
def player() -> TorchPlayer:
    torch.manual_seed(0)
    return TorchPlayer(build_model(ModelSettings(blocks=1, channels=8, value_channels=4, value_hidden=16)).eval())


@pytest.fixture
def engine(player: TorchPlayer):
    policy, searcher = PolicyThinker(player), Searcher(player)
    session = InProcessEngine(Engine("tiny", lambda count: policy if count <= 1 else SearchThinker(searcher, count),
                                     playouts=100_000))
    session.send("isready")
    session.expect("readyok")
    yield session
    session.close()


NEGATIVE = {  # go's fields: the error line's start
    "nodes -5": "go: nodes '-5' is negative",
    "btime -1 wtime 0 byoyomi 1000": "go: btime '-1' is negative",
    "btime 0 wtime -1000 byoyomi 1000": "go: wtime '-1000' is negative",
    "btime 0 wtime 0 byoyomi -1": "go: byoyomi '-1' is negative",
    "btime 0 wtime 0 binc -10 winc 0": "go: binc '-10' is negative",
    "btime 0 wtime 0 binc 0 winc -10": "go: winc '-10' is negative",
    "movetime -5": "go: unknown field 'movetime'",  # UCI's, not USI's: refused whatever its number
}


@pytest.mark.parametrize("fields", NEGATIVE)
def test_a_negative_limit_is_one_error_line_and_no_search(engine: InProcessEngine, fields: str) -> None:
    engine.send("position startpos")
    engine.send(f"go {fields}")
    line, before = engine.expect("bestmove")
    errors = [text for text in before if text.startswith("info string")]
    assert len(errors) == 1 and errors[0].startswith(f"info string error: {NEGATIVE[fields]}"), before
    infos = [text for text in before if text.startswith("info depth")]
    assert infos and all(" nodes 0 " in text for text in infos), infos  # the net's first evaluation, no playout
    assert cshogi.Board().is_legal(cshogi.Board().move_from_usi(line.split()[1]))


@pytest.mark.parametrize("command", [pytest.param(command, id=name) for name, command in {
    "go-nodes-huge": f"go nodes {HUGE}", "go-field-huge": f"go {HUGE}", "command-huge": HUGE,
    "option-name-huge": f"setoption name {HUGE} value 1", "option-value-huge": f"setoption name Playouts value {HUGE}",
    "option-value-5001-digits": f"setoption name NetworkDelay value {'9' * 5001}",
    "after-startpos-huge": f"position startpos {HUGE}", "move-huge": f"position startpos moves {HUGE}",
    "sfen-huge": f"position sfen {HUGE} b - 1", "go-escapes": "go nodes 5\x1b[2J\x1b]0;owned\x07",
    "command-escapes": "\x1b[31mgo\x00\u202e", "go-c1-control": "go byoyomi \x9b1m",
}.items()])
def test_the_guis_words_are_quoted_cut_short_and_without_control_characters(engine: InProcessEngine,
                                                                            command: str) -> None:
    engine.send(command)
    line, _ = engine.expect("info string error")
    message = engine.err.getvalue().splitlines()[-1]
    assert message.startswith("tideborn usi: ") and message.split(": ", 1)[1] == line.split(": ", 1)[1]
    for text in (line, message):
        assert len(text) <= LONGEST_ERROR_LINE, text[:200]
        assert not [char for char in text if unicodedata.category(char) in ("Cc", "Cf")], repr(text)
    if HUGE in command:
        assert "'xxxx" in line, line  # the word is still shown, cut short
    engine.send("isready")
    engine.expect("readyok")  # and the engine plays on
