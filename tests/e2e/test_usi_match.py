"""`tideborn match` with `usi:PATH` sides: `tideborn usi` itself as the external engine, engines that crash, hang
or play an illegal move mid-match (that game lost, the reason in the report and the CSA record, the engine
started again, the match played on), and engines refused before any game (not executable, garbage, no usiok,
an option it does not have): one line, exit status 2. An engine that floods its pipes costs the match no memory,
and its own text (its name, its last words) is shown and saved without escape sequences and cut short."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from cshogi import CSA

from tests.helpers.common import assert_user_error
from tests.helpers.usi import engine_script, fake_engine, run_with_peak_memory, tiny_checkpoint
from tideborn.match.cli import describe
from tideborn.match.cli import main as match_main
from tideborn.match.engine_output import ENGINE_TEXT_CHARS

RULE_ENDS = {"mate", "repetition", "perpetual check", "entering king", "max moves"}
FLOOD_MIB = 512
"""What the flooding engine writes on each pipe, in one line: far past the bound below, as the issue's were."""
PEAK_MIB = 1024
"""The most a match of a tiny net against it may take: torch and the net are about 400 MiB on a CPU build."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("usimatch"))


def _match(capsys, *args: str) -> dict:
    code = match_main([*args, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_tideborn_usi_is_an_external_engine_of_a_match(model: Path, tmp_path: Path, capsys):
    engine = engine_script(tmp_path / "tideborn-usi", model)
    report = _match(capsys, str(model), f"usi:{engine}", "--games", "4", "--max-moves", "40",
                    "--engine-byoyomi", "100", "--engine-option", "2:Playouts=0", "--save-games", str(tmp_path / "g"))
    second = report["second"]
    assert second["kind"] == "usi" and second["path"] == f"usi:{engine}"
    assert second["engine"].startswith("tideborn") and second["options"] == {"Playouts": "0"}
    assert second["restarts"] == 0 and report["engines"]["go"] == "go btime 0 wtime 0 byoyomi 100"
    assert report["games"] == 4 and set(report["ends"]) <= RULE_ENDS and report["incidents"] == []
    assert report["moves"] > 4 * 10
    records = sorted((tmp_path / "g").glob("game-*.csa"))
    assert len(records) == 4
    assert "usi/tideborn" in records[0].read_text()


@pytest.mark.parametrize("behaviour, reason, csa_end, detail", [
    ("crash", "engine crashed", "%CHUDAN", r"exit status 3; its last words on stderr: 'fake engine: crashing"),
    ("hang", "engine timed out", "%TIME_UP", r"no bestmove within 1\.5 s"),
    ("illegal", "illegal move", "%ILLEGAL_MOVE", r"played '5e5d', not a legal move"),
])
def test_a_misbehaving_engine_loses_that_game_only_and_is_restarted(model, tmp_path, capsys, behaviour, reason,
                                                                     csa_end, detail):
    engine = fake_engine(tmp_path, behaviour, on_go=3)
    report = _match(capsys, str(model), f"usi:{engine}", "--games", "4", "--max-moves", "24", "--parallel", "1",
                    "--engine-byoyomi", "100", "--engine-timeout", "1500", "--save-games", str(tmp_path / "g"))
    assert report["games"] == 4 and report["ends"].get(reason) == 1, report["ends"]
    assert set(report["ends"]) - {reason} <= RULE_ENDS
    [incident] = report["incidents"]
    assert incident["reason"] == reason and incident["game"] == 1
    assert f"usi:{engine}" in incident["detail"]
    assert re.search(detail, incident["detail"]), incident["detail"]
    assert report["wins"] >= 1  # game 1: the checkpoint plays black, the engine forfeits on its third move
    assert report["second"]["restarts"] == (0 if behaviour == "illegal" else 1)
    record = (tmp_path / "g" / "game-0001.csa").read_text()
    assert csa_end in record and f"'result black wins by {reason}" in record and "'detail " in record
    parsed = CSA.Parser.parse_file(str(tmp_path / "g" / "game-0001.csa"))[0]
    assert len(parsed.moves) == 5  # black's three moves, the engine's two before it forfeited


def _refused(capsys, *args: str) -> str:
    code = match_main(list(args))
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", captured
    return captured.err


def test_an_engine_that_cannot_play_is_refused_before_any_game(model: Path, tmp_path: Path, capsys):
    games = tmp_path / "games"
    common = ("--games", "2", "--save-games", str(games))
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\necho usiok\n")
    cases = [
        (f"usi:{tmp_path / 'missing'}", (), r"usi:.*missing: no such engine"),
        (f"usi:{plain}", (), r"not-executable: not an executable file"),
        (f"usi:{fake_engine(tmp_path, 'garbage')}", (),
         r"engine-garbage: not a USI engine: it answered 'Welcome to my chess program!' to 'usi'"),
        (f"usi:{fake_engine(tmp_path, 'nousiok')}", (), r"engine-nousiok: it exited before usiok \(exit status 1"),
        (f"usi:{fake_engine(tmp_path, 'silent')}", ("--engine-start-timeout", "1000"),
         r"engine-silent: no usiok within 1 s"),
        (f"usi:{fake_engine(tmp_path, 'options')}", (), r"engine-options: not a USI engine: it declared more than "
                                                        r"1,000 options$"),
        (f"usi:{fake_engine(tmp_path, 'crash', 1)}", ("--engine-option", "Hash=64"),
         r"--engine-option Hash=64: the engine has no option 'Hash' \(its options: Depth\)"),
        (f"usi:{fake_engine(tmp_path, 'crash', 1)}", ("--engine-option", "1:Depth=2"),
         r"--engine-option 1:Depth=2: player 1 is not a usi:PATH engine \(engines: 2\)"),
        (str(model), ("--engine-option", "Depth=2"), r"--engine-option Depth=2: no player is a usi:PATH engine"),
    ]
    for side, extra, pattern in cases:
        assert_user_error(_refused(capsys, str(model), side, *common, *extra), pattern)
        assert not games.exists() or not any(games.iterdir())
    with pytest.raises(SystemExit) as exited:
        match_main([str(model), str(model), "--engine-option", "Depth"])
    assert exited.value.code == 2
    assert_user_error(capsys.readouterr().err, r"--engine-option: expected \[N:\]NAME=VALUE; got 'Depth'")


def test_an_engine_flooding_its_pipes_costs_the_match_no_memory(model: Path, tmp_path: Path):
    """The issue's repro: 2.4 GB on stderr without a newline took `tideborn match` to a 7.4 GB peak, a 400 MB line on
    stdout to 1.8 GB. Here 512 MiB of one line on each (and the bestmove after stdout's): the match's peak stays
    under 1 GiB, and both games are played through."""
    engine = fake_engine(tmp_path, "flood", FLOOD_MIB)
    result, peak_mib = run_with_peak_memory(
        [sys.executable, "-m", "tideborn", "match", str(model), f"usi:{engine}", "--games", "2", "--max-moves", "8",
         "--parallel", "1", "--engine-timeout", "600000", "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["games"] == 2 and report["incidents"] == [] and report["second"]["engine"] == "fake-flood"
    assert peak_mib < PEAK_MIB, f"tideborn match peaked at {peak_mib} MiB"


def _clean(text: str) -> None:
    for line in text.splitlines():
        assert line.isprintable(), f"a control character in {line!r}"
    assert not re.search(r"n{%d}|w{%d}" % (ENGINE_TEXT_CHARS, ENGINE_TEXT_CHARS), text), "an engine's text uncut"


def test_an_engines_text_is_shown_and_saved_without_escapes_and_cut_short(model: Path, tmp_path: Path, capsys):
    """The issue's repro: an `id name` with escape sequences cleared the screen and set the window title, and its
    5,000 characters went into every saved CSA file. Its name, and its last words on stderr as it crashes in game 1,
    go into the report, the text a terminal shows and the saved games printable and at most 100 characters."""
    engine = fake_engine(tmp_path, "hostile")
    report = _match(capsys, str(model), f"usi:{engine}", "--games", "2", "--max-moves", "12", "--parallel", "1",
                    "--engine-byoyomi", "100", "--save-games", str(tmp_path / "g"))
    name = report["second"]["engine"]
    assert name.startswith("red nnnn") and name.endswith("...") and len(name) == ENGINE_TEXT_CHARS
    [incident] = report["incidents"]
    assert incident["reason"] == "engine crashed" and "its last words on stderr: 'dying red www" in incident["detail"]
    _clean(f"{name}\n{incident['detail']}")  # as --json saves them
    _clean(describe(report))  # what `tideborn match` prints without --json
    records = sorted((tmp_path / "g").glob("game-*.csa"))
    assert len(records) == 2
    for record in records:
        text = record.read_text()
        assert f"usi/{name}" in text
        _clean(text)
