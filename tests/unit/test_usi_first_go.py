"""`tideborn usi`'s first `go` of a session searches for the time it is given, with a checkpoint and with its ONNX
export. It was cut short: a `position` (or `go`, `isready`) read while a search ran stopped that search at its next
batch, so a client that sent its next commands without waiting for `bestmove` (or whose commands queued up while the
engine loaded its net) had its first search answered from 0-16 playouts in a few milliseconds. Now such a command
waits for a search that ends by itself; and the net is warmed up and timed at `isready` on the thread that searches,
not on the main thread before the first command, where torch's latency read 10-50 times what a search's batch cost
and took that twice from every budget."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from tests.helpers.usi import InProcessEngine, tiny_checkpoint
from tideborn.export.onnx_export import export_onnx
from tideborn.match import players
from tideborn.network.checkpoint import load_checkpoint
from tideborn.usi.engine import DEFAULT_NETWORK_DELAY_MS
from tideborn.usi.session import open_engine

PLAYOUTS = 1_000_000
"""Far more than a tiny net searches in a second on any machine: the clock, not the Playouts cap, ends a search."""
BYOYOMI_MS = 1000


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 1x8 checkpoint and its ONNX export (value as a logit)."""
    root = tmp_path_factory.mktemp("usifirstgo")
    checkpoint = tiny_checkpoint(root)
    export_onnx(load_checkpoint(checkpoint), root / "tiny.onnx")
    return {"checkpoint": checkpoint, "onnx": root / "tiny.onnx"}


def _field(line: str, name: str) -> int:
    words = line.split()
    return int(words[words.index(name) + 1])


@pytest.mark.parametrize("kind", ["checkpoint", "onnx"])
def test_the_first_go_of_a_session_searches_until_its_deadline(nets: dict[str, Path], kind: str) -> None:
    engine = InProcessEngine(open_engine(nets[kind], playouts=PLAYOUTS))
    try:
        engine.send("usi")
        engine.expect("usiok")
        engine.send("isready")
        line, _ = engine.expect("info string search, measured latency")
        latency_ms = float(re.search(r"latency ([0-9.]+) ms", line).group(1))
        engine.expect("readyok")
        # Two moves' commands at once, as the issue's script sent them: the second position and go come while the
        # first go thinks (and would have stopped it).
        for _ in range(2):
            engine.send("position startpos")
            engine.send(f"go btime 0 wtime 0 byoyomi {BYOYOMI_MS}")
        budget_ms = BYOYOMI_MS - DEFAULT_NETWORK_DELAY_MS - 2 * latency_ms  # docs/match.md's time rule
        for number in (1, 2):
            _, before = engine.expect("bestmove")
            last = [line for line in before if line.startswith("info depth")][-1]
            # The engine's own report: searched from the go until its deadline (the time counts from the go, as the
            # deadline does; 2 ms for the latency's rounding in the info string). A busy machine gets fewer
            # playouts in that time, never less time.
            assert _field(last, "time") >= budget_ms - 2, (number, last, f"budget {budget_ms:.1f} ms")
            assert _field(last, "nodes") > 0, (number, last)
    finally:
        engine.close()


def test_the_net_is_warmed_up_and_timed_at_isready_on_the_thread_that_searches(nets: dict[str, Path],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[threading.Thread] = []  # the thread of every forward pass

    def load_player(*args, **kwargs):
        player = real_load_player(*args, **kwargs)
        evaluate = player.evaluate

        def recorded(features1, features2):
            passes.append(threading.current_thread())
            return evaluate(features1, features2)

        player.evaluate = recorded
        return player

    real_load_player = players.load_player
    monkeypatch.setattr(players, "load_player", load_player)
    engine = InProcessEngine(open_engine(nets["checkpoint"], playouts=64))
    try:
        assert passes == []  # loading runs no pass on the thread that reads commands
        engine.send("isready")
        engine.expect("readyok")
        warm_up = list(passes)
        engine.send("position startpos")
        engine.send("go nodes 64")
        engine.expect("bestmove")
        search = passes[len(warm_up):]
        assert warm_up and search
        (thinking,) = set(warm_up)  # before readyok, on one thread
        assert set(search) == {thinking} and thinking is not engine.thread
    finally:
        engine.close()


def test_after_ponderhit_the_search_gets_its_whole_budget(nets: dict[str, Path]) -> None:
    """`ponderhit` starts the clock of the `go ponder` command from then; its deadline was counted from the `go
    ponder`, already past after a second of pondering, so the real search was answered at once."""
    engine = InProcessEngine(open_engine(nets["checkpoint"], playouts=PLAYOUTS))
    try:
        engine.send("isready")
        line, _ = engine.expect("info string search, measured latency")
        latency_ms = float(re.search(r"latency ([0-9.]+) ms", line).group(1))
        engine.expect("readyok")
        engine.send("position startpos")
        engine.send(f"go ponder btime 0 wtime 0 byoyomi {BYOYOMI_MS}")
        for _ in range(3):  # a search's info lines come every half second: a second or more of pondering
            engine.expect("info depth")
        engine.send("ponderhit")
        _, before = engine.expect("bestmove")
        last = [line for line in before if line.startswith("info depth")][-1]
        budget_ms = BYOYOMI_MS - DEFAULT_NETWORK_DELAY_MS - 2 * latency_ms
        assert _field(last, "time") >= budget_ms - 2, (last, f"budget {budget_ms:.1f} ms")
    finally:
        engine.close()
