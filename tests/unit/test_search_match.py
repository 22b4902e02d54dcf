"""`tideborn match --mode search`: at equal net, a PUCT search of 64 playouts beats the policy's own moves by an
Elo interval above zero; search games are the same for the same seed; the command line plays them and reports
how; bad --playouts and --mode input is one line and exit status 2 before any game."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.helpers.common import TEACHER_CONFIG, assert_user_error, settings_args, trainer_in_process
from tests.helpers.data import SAMPLE_GAMES
from tideborn.data.tools.convert import convert_games
from tideborn.match.cli import main as match_main
from tideborn.match.elo import estimate, format_elo
from tideborn.match.openings import load_openings
from tideborn.match.play import new_games, play
from tideborn.match.players import load_player

STEPS = 150
STRENGTH_GAMES = 16
STRENGTH_MAX_MOVES = 128


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1x16 net trained in this process for 150 steps on the WCSC28 games: its value means something (a random
    net's would be noise for the search to follow), at a few seconds' cost."""
    root = tmp_path_factory.mktemp("search-match")
    convert_games(sorted((SAMPLE_GAMES / "wcsc28").glob("*.csa")), root / "games.hcpe", progress=False)
    result = trainer_in_process("train", *settings_args(
        root / "run", f"paths.data_root={json.dumps(str(root))}", 'data.train=["games.hcpe"]', "data.test=[]",
        "model.blocks=1", "model.channels=16", "data.workers=0", f"runtime.max_steps={STEPS}",
        f"runtime.checkpoint_every={STEPS}", 'runtime.progress="plain"', config=TEACHER_CONFIG), cwd=root)
    assert result.returncode == 0, result.stderr
    return root / "run" / f"step-{STEPS:09d}.pt"


def games_for(count: int, seed: int):
    openings = load_openings(None)
    random.Random(seed).shuffle(openings)
    return new_games(openings, count // 2, seed)


def test_search_at_64_playouts_beats_policy_play_at_equal_net(checkpoint):
    player = load_player(checkpoint)
    games = games_for(STRENGTH_GAMES, seed=0)
    play((player, player), games, parallel=STRENGTH_GAMES, max_moves=STRENGTH_MAX_MOVES, mode=("search", "policy"),
         playouts=64)
    scores = [game.score_of_first() for game in games]
    result = estimate(scores, list(zip(scores[0::2], scores[1::2])))
    summary = (f"search vs policy: +{result.wins} ={result.draws} -{result.losses}, Elo {format_elo(result.elo)} "
               f"[{format_elo(result.elo_low)}, {format_elo(result.elo_high)}] ({result.model})")
    print(summary)
    assert result.elo_low > 0, summary


def test_search_games_are_the_same_for_the_same_seed(checkpoint):
    player = load_player(checkpoint)

    def moves(seed: int) -> list[list[int]]:
        games = games_for(4, seed)
        play((player, player), games, parallel=4, max_moves=30, mode="search", playouts=16, temperature=1.0)
        return [game.moves for game in games]

    first = moves(seed=5)
    assert moves(seed=5) == first
    assert moves(seed=6) != first  # other openings, other draws


def test_the_command_line_plays_search_games_and_says_how(checkpoint, capsys):
    code = match_main([str(checkpoint), str(checkpoint), "--mode", "search", "--playouts", "8", "--games", "2",
                       "--max-moves", "24", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["mode"] == "search" and report["playouts"] == 8 and report["games"] == 2
    assert report["policy"] == "PUCT search, 8 playouts a move, most visited"
    assert match_main([str(checkpoint), str(checkpoint), "--games", "2", "--max-moves", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["playouts"] is None  # policy mode has none


@pytest.mark.parametrize(("args", "pattern"), [
    (["--mode", "search", "--playouts", "0"], r"argument --playouts: must be at least 1; got 0"),
    (["--mode", "search", "--playouts", "many"], r"argument --playouts: not a whole number: 'many'"),
    (["--mode", "search", "--playouts", "100001"], r"argument --playouts: at most 100,000"),
    (["--playouts", "8"], r"--playouts 8: playouts are for --mode search \(the mode is policy\)"),
    (["--mode", "value", "--playouts", "8"], r"--playouts 8: playouts are for --mode search"),
    (["--mode", "mcts"], r"argument --mode: invalid choice: 'mcts'"),
])
def test_bad_playouts_or_mode_is_one_line_and_exit_2_before_any_game(checkpoint, capsys, args, pattern):
    with pytest.raises(SystemExit) as exited:
        match_main([str(checkpoint), str(checkpoint), "--games", "2", *args])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_user_error(captured.err, r"^tideborn match: error: " + pattern)
