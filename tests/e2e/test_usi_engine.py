"""`tideborn usi`: driven by cshogi's USI client through a whole game, and through a game on the clock at byoyomi
100 without losing on time; it hears `stop` while it thinks (`go infinite`, `go ponder`), answers a bad option
or position with an `info string` and plays on, exits 0 at the end of input, and refuses a bad model in one line."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import cshogi
import pytest
from cshogi.usi import Engine as CshogiEngine

from tests.helpers.common import assert_user_error
from tests.helpers.usi import UsiPipe, engine_script, tiny_checkpoint
from tideborn.errors import UserError
from tideborn.usi.cli import main as usi_main
from tideborn.usi.engine import parse_go
from tideborn.usi.thinking import Clock, move_budget_ms, value_to_cp

MAX_PLIES = 256


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("usi"))


@pytest.fixture(scope="module")
def client(model: Path):
    """cshogi's USI client with `tideborn usi` behind it, as a GUI starts it (an executable script)."""
    engine = CshogiEngine(str(engine_script(model.parent / "engine.sh", model)))
    yield engine
    engine.quit()


def _fields(line: str) -> dict:
    """An `info` line's depth, nodes, score kind and value, and pv."""
    words = line.split()
    fields = {name: words[words.index(name) + 1] for name in ("depth", "nodes", "score") if name in words}
    if "score" in words:
        fields["score_value"] = int(words[words.index("score") + 2])
    if "pv" in words:
        fields["pv"] = words[words.index("pv") + 1:]
    return fields


def _play_game(engine: CshogiEngine, go, plies: int = MAX_PLIES) -> tuple[str, list[str], list[dict]]:
    """The engine plays both sides from the start position until the rules end the game (as tideborn match
    judges it) or it resigns or declares; returns how it ended, the moves and the last info of each move."""
    board, seen, moves, infos = cshogi.Board(), Counter(), [], []
    seen[board.zobrist_hash()] += 1
    engine.usinewgame()
    while len(moves) < plies:
        engine.position(moves)
        lines: list[str] = []
        bestmove, _ = go(engine, board, lines.append)
        info = [line for line in lines if line.startswith("info depth")]
        assert info, lines
        infos.append(_fields(info[-1]))
        if bestmove in ("resign", "win"):
            return bestmove, moves, infos
        move = board.move_from_usi(bestmove)
        assert move and board.is_legal(move), (bestmove, board.sfen())
        board.push(move)
        moves.append(bestmove)
        seen[board.zobrist_hash()] += 1
        if board.is_game_over():
            return "mate", moves, infos
        if seen[board.zobrist_hash()] >= 4:
            return "repetition", moves, infos
        if board.is_nyugyoku():
            return "entering king", moves, infos
    return "max moves", moves, infos


def test_cshogi_usi_client_plays_a_whole_game(client: CshogiEngine):
    assert client.name.startswith("tideborn")
    options = client.usi()
    assert any(line.startswith("option name Playouts type spin") for line in options), options
    client.setoption("Playouts", 1)
    client.isready()
    ended, moves, infos = _play_game(client, lambda engine, board, listen: engine.go(byoyomi=1000, listener=listen))
    assert len(moves) >= 8 and ended in ("mate", "repetition", "entering king", "max moves", "resign"), ended
    assert all({"depth", "nodes", "score", "pv"} <= info.keys() for info in infos)
    assert all(info["score"] in ("cp", "mate") and info["pv"] for info in infos)


def test_on_the_clock_at_byoyomi_100_it_never_loses_on_time(client: CshogiEngine):
    # A search of 5,000 playouts takes seconds with this net: only the engine's own deadline keeps it within
    # byoyomi 100. The clock is kept as a GUI keeps it: a move's time past the byoyomi comes off the main time
    # (1 s each here, the slack a busy test machine's scheduling needs), and a side loses when it runs out.
    client.setoption("Playouts", 5000)
    # Nothing kept back for a GUI's network (its default is 100 ms, all of byoyomi 100): the budget is then the
    # byoyomi less twice the net's measured latency, so the engine searches even on a busy machine, and only its
    # own deadline keeps it within the byoyomi.
    client.setoption("NetworkDelay", 0)
    client.isready()
    clock = {cshogi.BLACK: 1000, cshogi.WHITE: 1000}
    spent: list[int] = []

    def go(engine, board, listen):
        started = time.monotonic()
        answer = engine.go(btime=clock[cshogi.BLACK], wtime=clock[cshogi.WHITE], byoyomi=100, listener=listen)
        elapsed = int((time.monotonic() - started) * 1000)
        spent.append(elapsed)
        over = max(0, elapsed - 100)
        assert over <= clock[board.turn], f"lost on time at move {len(spent)}: {elapsed} ms, {spent}"
        clock[board.turn] -= over
        return answer

    ended, moves, infos = _play_game(client, go, plies=60)
    assert len(moves) >= 8, ended
    assert max(int(info["nodes"]) for info in infos) > 1  # it did search within its time, not only the policy


@pytest.fixture(scope="module")
def pipe(model: Path):
    engine = UsiPipe([str(engine_script(model.parent / "search.sh", model, "--playouts", "64"))], model.parent)
    engine.send("usi")
    engine.expect("usiok")
    yield engine
    engine.close()


def test_stop_ends_an_infinite_search_and_ponderhit_starts_the_clock(pipe: UsiPipe):
    pipe.send("isready")
    pipe.expect("readyok")
    pipe.send("position startpos moves 7g7f 3c3d")
    pipe.send("go infinite")
    early = pipe.nothing_for(1.5)  # searching, and stdin still read: nothing answered until stop
    assert not any(line.startswith("bestmove") for line in early), early
    pipe.send("stop")
    line, before = pipe.expect("bestmove")
    assert any(" pv " in info for info in before + early)
    board = cshogi.Board("lnsgkgsnl/1r5b1/pppppp1pp/6p2/9/2P6/PP1PPPPPP/1B5R1/LNSGKGSNL b - 3")
    assert board.is_legal(board.move_from_usi(line.split()[1]))
    pipe.send("go ponder btime 0 wtime 0 byoyomi 200")
    early = pipe.nothing_for(1.0)
    assert not any(line.startswith("bestmove") for line in early), early
    pipe.send("ponderhit")
    pipe.expect("bestmove")


def test_bad_option_or_position_is_an_info_string_and_the_engine_plays_on(pipe: UsiPipe):
    pipe.send("setoption name Hashish value 3")
    line, _ = pipe.expect("info string")
    assert "no option 'Hashish'" in line and "Playouts" in line
    pipe.send("setoption name Playouts value lots")
    line, _ = pipe.expect("info string")
    assert "Playouts" in line and "'lots' is not a whole number" in line
    pipe.send("position sfen lnsgkgsnl/9/ppppppppp b - 1")
    line, _ = pipe.expect("info string")
    assert "not a SFEN position" in line
    pipe.send("go byoyomi 100")
    assert pipe.expect("bestmove")[0] == "bestmove resign"  # no position to play in: never a guessed move
    pipe.send("position startpos moves 7g7f 7g7f")
    assert "move 2, '7g7f', is not a legal move" in pipe.expect("info string")[0]
    pipe.send("isready")
    pipe.expect("readyok")
    pipe.send("position startpos")
    pipe.send("go nodes 8")
    line, _ = pipe.expect("bestmove")
    assert cshogi.Board().is_legal(cshogi.Board().move_from_usi(line.split()[1]))
    assert pipe.proc.poll() is None


def test_end_of_input_is_quit_with_exit_status_0(model: Path):
    engine = UsiPipe([str(engine_script(model.parent / "eof.sh", model))], model.parent)
    try:
        engine.send("usi")
        engine.expect("usiok")
        engine.send("position startpos")
        engine.send("go infinite")
        engine.proc.stdin.close()  # the GUI went away mid-search
        assert engine.proc.wait(timeout=120) == 0
        assert "Traceback" not in engine.proc.stderr.read()
    finally:
        engine.close()


def test_a_bad_model_or_argument_is_one_line_and_exit_2(model: Path, tmp_path: Path, capsys):
    assert usi_main([str(tmp_path / "missing.onnx")]) == 2
    assert_user_error(capsys.readouterr().err, r"missing\.onnx: no such ONNX model")
    (tmp_path / "notes.txt").write_text("not a net")
    assert usi_main([str(tmp_path / "notes.txt")]) == 2
    assert_user_error(capsys.readouterr().err, r"notes\.txt")
    with pytest.raises(SystemExit) as exited:
        usi_main([str(model), "--playouts", "-1"])
    assert exited.value.code == 2
    assert_user_error(capsys.readouterr().err, r"--playouts: must be 0 or more")


def test_time_rule_keeps_the_margin_and_never_spends_more_than_is_left():
    black, white = cshogi.BLACK, cshogi.WHITE
    assert move_budget_ms(Clock(byoyomi=100), black, margin_ms=120) == 0  # one evaluation at once
    assert move_budget_ms(Clock(byoyomi=1000), black, margin_ms=120) == 880
    assert move_budget_ms(Clock(btime=40_000, wtime=0, byoyomi=0), black, margin_ms=100) == 900
    assert move_budget_ms(Clock(btime=40_000, wtime=0, byoyomi=0), white, margin_ms=100) == 0
    assert move_budget_ms(Clock(btime=0, wtime=60_000, binc=0, winc=2000), white, margin_ms=100) == 3400
    assert move_budget_ms(Clock(btime=200, wtime=200, byoyomi=0), black, margin_ms=100) == 0  # 5 ms - margin
    assert move_budget_ms(Clock(), black, margin_ms=100) is None  # go nodes / infinite: no clock
    assert value_to_cp(0.0) == 0 and value_to_cp(1.0) == 756 and value_to_cp(-1e9) == -30000


def test_go_fields_are_read_or_refused_by_name():
    go = parse_go("btime 1000 wtime 2000 binc 10 winc 20 byoyomi 100 nodes 64".split())
    assert go.clock == Clock(1000, 2000, 10, 20, 100) and go.nodes == 64 and not go.infinite
    assert parse_go(["infinite"]).infinite and parse_go("ponder byoyomi 5".split()).ponder
    for words, message in ((["byoyomi"], "byoyomi without a number"), (["nodes", "x"], "'x' is not a whole"),
                           (["mate", "1000"], "go mate"), (["depth", "3"], "unknown field 'depth'")):
        with pytest.raises(UserError, match=message):
            parse_go(words)
