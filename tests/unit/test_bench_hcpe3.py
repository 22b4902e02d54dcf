"""The hcpe3 benchmark runs (its tideborn part, at tiny size) and its cross-check compares for real.

Figures are never asserted: speed is the benchmark's output, not a test (docs/benchmarks.md). dlshogi's
compiled module is not a dependency, so its part is reached only through the error a bad build gives.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from benchmarks import hcpe3 as bench_hcpe3
from benchmarks.hcpe3_check import cross_check
from benchmarks.hcpe3_file import reference_moves
from tests.helpers.common import REPO_ROOT
from tideborn.data.cache.hcpe3 import cache_path

SAMPLES = REPO_ROOT / "samples" / "games" / "wcsc28"


def some_games(folder: Path, count: int) -> Path:
    folder.mkdir()
    for game in sorted(SAMPLES.glob("*.csa"))[:count]:
        shutil.copy(game, folder)
    return folder


def test_pipeline_prints_tideborn_figures_without_dlshogi(tmp_path: Path, capsys) -> None:
    games = some_games(tmp_path / "games", 3)
    code = bench_hcpe3.main(["pipeline", "--games", str(games), "--batch-size", "64", "--batches", "2",
                             "--repeats", "2", "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3 games" in out and "tideborn positions" in out
    for line in ("tideborn, cold open (replay, cache)", "tideborn, warm open (cache mapped)", "tideborn, 0 workers"):
        assert line in out, out
    assert "pos/s" in out.split("tideborn, 0 workers")[1]
    assert "dlshogi" not in out  # no build given: tideborn's figures only
    assert list(games.iterdir()) == sorted(games.glob("*.csa"))  # nothing written among the inputs


def test_a_file_it_makes_reads_the_same_in_tideborn_and_the_plain_replay(tmp_path: Path, capsys) -> None:
    made = tmp_path / "made.hcpe3"
    assert bench_hcpe3.main(["make", str(made), "--games", str(some_games(tmp_path / "games", 8))]) == 0
    assert "8 games" in capsys.readouterr().out
    assert bench_hcpe3.main(["check", str(made)]) == 0
    out = capsys.readouterr().out
    assert "all readings agree" in out, out
    assert not cache_path(made).exists()  # the check decodes without leaving a cache beside the file


def test_a_measuring_child_finds_the_benchmarks_outside_the_checkouts_root(tmp_path: Path, monkeypatch) -> None:
    """The benchmarks are no installed package: a child started as `-m benchmarks.hcpe3` gets the checkout on its
    path, so a run started from another folder still measures instead of failing in the child."""
    made = tmp_path / "made.hcpe3"
    assert bench_hcpe3.main(["make", str(made), "--games", str(some_games(tmp_path / "games", 2))]) == 0
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    figures = bench_hcpe3.tideborn_decode_in_child(made, batch_size=16, batches=1, seed=0)
    assert set(figures) == {"positions_per_second", "positions_per_cpu_second"}


def test_the_cross_check_names_the_game_and_move_of_a_difference(tmp_path: Path) -> None:
    made = tmp_path / "made.hcpe3"
    bench_hcpe3.main(["make", str(made), "--games", str(some_games(tmp_path / "games", 2))])
    moves = reference_moves(made)
    target = next(i for i, m in enumerate(moves) if m.game == 1 and m.ply == 15)
    # A reading that disagrees on one eval and one candidate's visits: what tideborn reads must now differ there.
    changed = moves[target].candidates.copy()
    changed["visitNum"][0] += 7
    moves[target] = dataclasses.replace(moves[target], eval=moves[target].eval + 1, candidates=changed)
    lines, agree = cross_check(made, moves)
    report = "\n".join(lines)
    assert not agree
    assert "tideborn: eval differs: 1 (first: game 1 move 15)" in report, report
    assert "tideborn: candidates differ: 1 (first: game 1 move 15)" in report, report


def test_a_dlshogi_build_without_the_module_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    code = bench_hcpe3.main(["pipeline", "--dlshogi-build", str(tmp_path), "--workers", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"bench_hcpe3: error: --dlshogi-build {tmp_path}: no cppshogi"), err


def test_all_sample_games_read_as_dlshogi_rules_say(tmp_path: Path, capsys) -> None:
    """Superior and inferior repetitions are left out as dlshogi does (11 positions of the sample games, the first
    at game 8 move 30: cshogi's `move_is_draw` before the move missed them; `is_draw` after it finds them)."""
    made = tmp_path / "samples.hcpe3"
    assert bench_hcpe3.main(["make", str(made), "--games", str(SAMPLES)]) == 0
    code = bench_hcpe3.main(["check", str(made)])
    out = capsys.readouterr().out
    assert code == 0 and "all readings agree" in out, out


def test_a_cut_short_file_is_one_line_naming_the_game_and_exit_2(tmp_path: Path, capsys) -> None:
    made = tmp_path / "made.hcpe3"
    bench_hcpe3.main(["make", str(made), "--games", str(some_games(tmp_path / "games", 3))])
    capsys.readouterr()
    cut = tmp_path / "cut.hcpe3"
    cut.write_bytes(made.read_bytes()[:-3])
    for command in (["check", str(cut)], ["pipeline", "--file", str(cut), "--workers", "0", "--repeats", "1"]):
        assert bench_hcpe3.main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"bench_hcpe3: error: {cut}: game 2: the file ends inside"), err
