"""`python -m tideborn.data inspect|verify|convert|split` on real files: what users see and the files
they get. Game records are written here in CSA and KIF as engines and GUIs write them."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import cshogi
import numpy as np
import pytest
import torch

from tests.helpers.data import (
    HCPE,
    SAMPLE_GAMES,
    hcpe_records,
    psv_records,
    random_csa_games,
    random_positions,
    write_records,
)
from tideborn.config.load import load_settings
from tideborn.data.formats.game_index import index_path, read_index
from tideborn.data.tools.cli import main as data_main
from tideborn.data.tools.split import position_hashes
from tideborn.trainer.evaluation import Evaluator
from tideborn.trainer.state import teacher_batches

CSA_GAME = """V2.2
N+alpha
N-beta
'black_rate:alpha:2500.0
'white_rate:beta:2400.0
PI
+
+7776FU
T1
-3334FU
'** 120
+2726FU
-8384FU
%TORYO
"""

KIF_GAME = """手合割：平手
先手：先手さん
後手：後手さん
手数----指手---------消費時間--
   1 ７六歩(77)   ( 0:00/00:00:00)
   2 ３四歩(33)   ( 0:00/00:00:00)
   3 ２六歩(27)   ( 0:00/00:00:00)
   4 投了
まで3手で先手の勝ち
"""


def run_data_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m tideborn.data ARGS` as its own process: the entry point users type."""
    return subprocess.run([sys.executable, "-m", "tideborn.data", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def run_data(capfd, monkeypatch):
    """`python -m tideborn.data ARGS` run in this process (its `main`, in `cwd`), with what it wrote to stdout
    and stderr, file descriptors included: the tools' outputs and messages without a process start each."""

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        capfd.readouterr()
        try:
            code = data_main(list(args))
        except SystemExit as exit_:  # argparse's refusals, as the process would end
            code = exit_.code if isinstance(exit_.code, int) else 1
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess([sys.executable, "-m", "tideborn.data", *args], code, out, err)

    return run


def test_convert_writes_every_position_with_its_move_and_the_games_result(tmp_path, run_data):
    (tmp_path / "games").mkdir()
    (tmp_path / "games" / "a.csa").write_text(CSA_GAME, encoding="utf-8")
    (tmp_path / "games" / "b.kif").write_bytes(KIF_GAME.encode("cp932"))  # GUIs write KIF in Shift_JIS
    done = run_data("convert", "games", "--output", "out/all.hcpe", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "out/all.hcpe: 7 positions from 2 games" in done.stdout
    records = np.fromfile(tmp_path / "out" / "all.hcpe", dtype=HCPE)
    board, expected = cshogi.Board(), []
    for usi in ("7g7f", "3c3d", "2g2f", "8c8d"):
        expected.append((board.sfen(), board.move_from_usi(usi)))
        board.push_usi(usi)
    check = cshogi.Board()
    for i, (sfen, move) in enumerate(expected):
        check.set_hcp(records["hcp"][i])
        assert check.sfen().split(" ")[:3] == sfen.split(" ")[:3]  # hcp keeps no move number
        assert check.move_from_move16(int(records["bestMove16"][i]) & 0xFFFF) == move
    assert records["gameResult"][:4].tolist() == [cshogi.WHITE_WIN] * 4  # black resigned with black to move
    assert records["eval"][:4].tolist() == [0, -120, 0, 0]  # "'** 120" (black's view) went with move 2
    assert records["gameResult"][4:].tolist() == [cshogi.BLACK_WIN] * 3
    games = read_index(index_path(tmp_path / "out" / "all.hcpe"), len(records))
    assert [(g.first_record, g.records, g.plies, g.result) for g in games] == [
        (0, 4, 4, "white_win"), (4, 3, 3, "black_win")]


def test_convert_filters_games(tmp_path, run_data):
    games = tmp_path / "games"
    games.mkdir()
    (games / "a.csa").write_text(CSA_GAME, encoding="utf-8")
    (games / "a-copy.csa").write_text(CSA_GAME, encoding="utf-8")
    (games / "unrated.csa").write_text(CSA_GAME.replace("'black_rate:alpha:2500.0\n", "")
                                       .replace("'white_rate:beta:2400.0\n", "").replace("-8384FU\n", ""),
                                       encoding="utf-8")
    (games / "unfinished.csa").write_text(CSA_GAME.replace("%TORYO\n", ""), encoding="utf-8")
    (games / "handicap.kif").write_text(KIF_GAME.replace("平手", "香落ち").replace("７六歩(77)", "５二玉(51)"),
                                        encoding="utf-8")
    (games / "broken.csa").write_text("V2.2\nP1 garbage\n", encoding="utf-8")
    done = run_data("convert", "games", "-o", "all.hcpe", "--min-rating", "2450", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "all.hcpe: 3 positions from 1 games (5 games read in 6 files)" in done.stdout  # the unrated one
    assert "rated under 2450 2" in done.stdout and "duplicate" not in done.stdout  # the copy fell to the rating
    assert "no result 1" in done.stdout and "handicap or non-standard start 1" in done.stdout
    assert "broken.csa: skipped: cannot parse as CSA" in done.stderr
    done = run_data("convert", "games", "-o", "all.hcpe", "--include-handicap", "--min-ply", "4", cwd=tmp_path)
    assert "4 positions from 1 games" in done.stdout  # a.csa; its copy is a duplicate; the rest are short
    assert "duplicate 1" in done.stdout and "under 4 plies 2" in done.stdout


def test_split_keeps_games_whole_and_leaks_no_position(tmp_path, run_data):
    random_csa_games(tmp_path / "games", 30)
    assert run_data("convert", "games", "-o", "all.hcpe", cwd=tmp_path).returncode == 0
    done = run_data("split", "all.hcpe", "--train", "train.hcpe", "--test", "test.hcpe",
                    "--test-fraction", "0.3", "--seed", "5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "leakage check: 0 of" in done.stdout
    train = np.fromfile(tmp_path / "train.hcpe", dtype=HCPE)
    test = np.fromfile(tmp_path / "test.hcpe", dtype=HCPE)
    everything = np.fromfile(tmp_path / "all.hcpe", dtype=HCPE)
    assert not np.isin(position_hashes(test), position_hashes(train)).any()
    train_games = read_index(index_path(tmp_path / "train.hcpe"), len(train))
    test_games = read_index(index_path(tmp_path / "test.hcpe"), len(test))
    assert len(train_games) == 21 and 1 <= len(test_games) <= 9
    assert not {g.source for g in train_games} & {g.source for g in test_games}
    assert len(train) == sum(g.plies for g in train_games)  # train games complete
    assert len(test) < sum(g.plies for g in test_games)  # at least the initial position left test
    assert len(train) + len(test) < len(everything)


def test_split_needs_the_game_index(tmp_path):
    write_records(tmp_path / "all.hcpe", hcpe_records(random_positions(10)))
    # as its own process: the entry point and its name in the message are what users see
    done = run_data_process("split", "all.hcpe", "--train", "a.hcpe", "--test", "b.hcpe", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m tideborn.data split: error: all.games.csv: no game index; split needs the index that "
        "`convert` writes beside its output (game boundaries are not stored in hcpe records)"]


def test_verify_lists_planted_bad_records_and_fails(tmp_path, run_data):
    records = hcpe_records(random_positions(40, seed=9))
    records["bestMove16"][5] = 0
    records["bestMove16"][12] = (40 << 7) | 40  # 5e to 5e: never a legal move
    records["hcp"][20, 0] |= 0xFE
    records["gameResult"][25] = 9
    records["eval"][30] = -32768
    write_records(tmp_path / "bad.hcpe", records)
    write_records(tmp_path / "good.hcpe", hcpe_records(random_positions(30, seed=10)))
    (tmp_path / "cut.hcpe").write_bytes(records[:3].tobytes() + b"\x00" * 7)
    done = run_data("verify", "good.hcpe", "bad.hcpe", "cut.hcpe", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stdout.strip().splitlines()
    listed = [line for line in lines if line.startswith("bad.hcpe")]
    assert [line.split(": ")[1] for line in listed] == ["record 5", "record 12", "record 20", "record 25", "record 30"]
    assert "empty move" in listed[0] and "illegal in this position" in listed[1]
    assert "undecodable position" in listed[2] and "game result out of range" in listed[3]
    assert "eval -32768 out of range" in listed[4]
    assert any(line.startswith("cut.hcpe: size 121 bytes is not a multiple") for line in lines)
    assert lines[-1] == "verify: 73 records in 3 file(s): 6 bad"
    assert not any(line.startswith("good.hcpe") for line in lines)
    clean = run_data("verify", "good.hcpe", cwd=tmp_path)
    assert clean.returncode == 0 and clean.stdout.strip() == "verify: 30 records in 1 file(s): all good"


def test_inspect_reports_counts_results_evals_plies_and_duplicates(tmp_path, capsys):
    records = hcpe_records(random_positions(50, seed=6))
    records["gameResult"] = [cshogi.BLACK_WIN] * 30 + [cshogi.WHITE_WIN] * 15 + [cshogi.DRAW] * 5
    records["eval"] = [0] * 20 + [50] * 10 + [-5000] * 20
    records[40:45] = records[0:5]  # five repeated records (black wins, eval 0, in place of white wins at -5000)
    write_records(tmp_path / "a.hcpe", records)
    psv = psv_records(random_positions(20, seed=7))
    write_records(tmp_path / "b.bin", psv)
    assert data_main(["inspect", str(tmp_path / "a.hcpe"), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)["files"][0]
    assert report["records"] == 50
    assert report["results"] == {"black_win": 35, "white_win": 10, "draw": 5}
    assert sum(report["eval_histogram"]) == 50 and report["evals_zero"] == 25
    assert report["eval_histogram"][0] == 15 and report["eval_min"] == -5000
    assert report["duplicate_records"] == 5 and report["duplicate_positions"] >= 5
    assert report["plies"] is None
    assert data_main(["inspect", str(tmp_path / "b.bin")]) == 0
    text = capsys.readouterr().out
    plies = psv["gamePly"]
    assert f"plies:          {plies.min()}..{plies.max()} (from gamePly)" in text
    assert "b.bin: psv, 20 records (800 bytes)" in text


def test_inspect_takes_the_ply_range_from_the_game_index(tmp_path, run_data):
    random_csa_games(tmp_path / "games", 4, seed=3)
    assert run_data("convert", "games", "-o", "all.hcpe", cwd=tmp_path).returncode == 0
    done = run_data("inspect", "all.hcpe", cwd=tmp_path)
    games = read_index(index_path(tmp_path / "all.hcpe"), len(np.fromfile(tmp_path / "all.hcpe", dtype=HCPE)))
    lengths = [g.plies for g in games]
    assert f"plies:          {min(lengths)}..{max(lengths)} (from game index, 4 games)" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["inspect", "nothing/*.hcpe"], "FILE: 'nothing/*.hcpe' matches no files"),
    (["verify", "."], "is a directory; name the files in it"),
    (["convert", "missing-dir", "-o", "x.hcpe"], "missing-dir: no such file or directory"),
    (["convert", ".", "-o", "x.bin"], "name the output NAME.hcpe"),
])
def test_bad_arguments_get_one_line_and_exit_status_2(tmp_path, args, message, run_data):
    done = run_data(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr
    assert done.stdout == ""


def test_the_data_tools_do_not_import_torch():
    code = ("import sys, tideborn.data.tools.cli, tideborn.data.tools.checks, tideborn.data.tools.convert, "
            "tideborn.data.tools.split; print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_smoke_teacher_commands_make_the_files_its_config_reads(tmp_path, run_data):
    config = Path(__file__).resolve().parents[2] / "configs" / "smoke-teacher.toml"
    commands = [line.lstrip("# ").strip() for line in config.read_text(encoding="utf-8").splitlines()
                if line.startswith("#   python -m tideborn.data")]
    assert [shlex.split(c)[3] for c in commands] == ["convert", "split"]
    (tmp_path / "samples").symlink_to(SAMPLE_GAMES.parent)  # the real games that ship with the project
    for command in commands:
        args = shlex.split(command)[3:]
        done = run_data(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    settings = load_settings(config, [f"paths.data_root={str(tmp_path)!r}", "data.workers=0"], environ={}).settings
    with teacher_batches(settings, torch.device("cpu")) as data:
        assert len(data.next_batch()) == settings.optim.batch_size
    assert Evaluator(settings, torch.device("cpu")).positions > 0


KI2_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ki2"


@pytest.mark.parametrize(("name", "plies", "result"), [
    ("20091203.ki2", 172, cshogi.WHITE_WIN),  # まで172手で後手の勝ち
    ("denou3-1.ki2", 98, cshogi.WHITE_WIN),
])
def test_real_ki2_records_cshogi_cannot_read_convert(name, plies, result):
    from tideborn.data.formats.games import read_games

    [game] = read_games(KI2_FIXTURES / name)
    assert game.plies == plies and game.result == result
    board = cshogi.Board(game.sfen)
    for move in game.moves:
        assert board.is_legal(move)
        board.push(move)


def test_ki2_and_csa_with_shogi_server_client_lines_convert_from_the_command_line(tmp_path, run_data):
    games = tmp_path / "games"
    games.mkdir()
    for name in ("20091203.ki2", "denou3-1.ki2"):
        (games / name).write_bytes((KI2_FIXTURES / name).read_bytes())
    # a shogi-server client's record ends with `#RESIGN` or `#TIME_UP` and `#WIN`/`#LOSE`, not a `%` line
    samples = [path for path in sorted(SAMPLE_GAMES.glob("wcsc28/*.csa")) if "%TORYO" in path.read_text("utf-8-sig")]
    for path, ending in zip(samples, ("#RESIGN\n#LOSE", "#TIME_UP\n#LOSE"), strict=False):
        sample = path.read_text(encoding="utf-8-sig")
        (games / f"client-{ending[1:5]}.csa").write_text(sample.replace("%TORYO", ending), encoding="utf-8")
    done = run_data("convert", "games", "-o", "all.hcpe", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "from 4 games (4 games read in 4 files)" in done.stdout
    assert "({})" not in done.stdout + done.stderr


def test_nothing_convertible_is_named_not_printed_as_a_raw_dict(tmp_path, run_data):
    (tmp_path / "bad.ki2").write_text("先手：a\n▲９九玉\n", encoding="utf-8")
    done = run_data("convert", "bad.ki2", "-o", "all.hcpe", cwd=tmp_path)
    assert done.returncode == 2
    assert "({})" not in done.stderr and "unreadable files 1" in done.stderr and "bad.ki2" in done.stderr
