"""Outputs and the run files they meet (issue 22, musts 3, 4, 7 and 8): nothing in a run directory is read or
written through a link, at any moment; every output is checked before the work and fails in one line; match
openings mean what they say; a lost Elo baseline is said, not silently moved.

Links and deletions "mid-run" are made by a real in-process trainer's own save: the test wraps
`save_checkpoint` to act on the run directory right after a chosen save, before the trainer looks at its
match reference, which is the moment a planted link or a deleted file would meet it."""

from __future__ import annotations

import json
import os
import subprocess
import typing
from pathlib import Path

import pytest
import torch

from tests.helpers.common import assert_user_error, settings_args, train
from tideborn.network.checkpoint import CheckpointError, load_checkpoint
from tideborn.rundir.layout import MATCH_REFERENCE_FILE
from tideborn.safefile import write_atomically
from tideborn.tools import train_run
from tideborn.trainer import checkpointer
from tideborn.trainer.cli import main as trainer_main

MATCH_SETS = ("runtime.max_steps=6", "runtime.checkpoint_every=2", "runtime.match_every=2", "runtime.match_games=2",
              "optim.batch_size=16", "runtime.log_every=2", "data.workers=0")


def events_in(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def train_with(run_dir: Path, monkeypatch: pytest.MonkeyPatch, after_save: dict[int, typing.Callable[[], None]],
               *sets: str) -> int:
    """A real training run in this process; `after_save[step]` runs right after that step's checkpoint is
    written (and before the trainer keeps or reads its match reference)."""
    real_save = checkpointer.save_checkpoint

    def save(run: Path, step: int, payload: dict):
        saved = real_save(run, step, payload)
        if step in after_save:
            after_save[step]()
        return saved

    monkeypatch.setattr(checkpointer, "save_checkpoint", save)
    return trainer_main(["train", *settings_args(run_dir, *MATCH_SETS, *sets)])


def matches(run_dir: Path) -> list[tuple[int, int]]:
    return [(e["step"], e["reference_step"]) for e in events_in(run_dir) if e["kind"] == "match"]


def rebaselines(run_dir: Path) -> list[dict]:
    return [e for e in events_in(run_dir) if e["kind"] == "warning" and e.get("match_rebaseline")]


# -- must 3: no read or write of a run file follows a link ----------------------------------------------------

def test_a_dangling_reference_link_planted_mid_run_is_not_written_through(tmp_path, workdir, monkeypatch):
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    target = outside / "planted.pt"

    def plant() -> None:
        (run_dir / MATCH_REFERENCE_FILE).unlink()
        (run_dir / MATCH_REFERENCE_FILE).symlink_to(target)  # dangling: the old code copied the checkpoint there

    assert train_with(run_dir, monkeypatch, {4: plant}, "runtime.keep_checkpoints=3") == 0
    assert not target.exists() and list(outside.iterdir()) == []
    reference = run_dir / MATCH_REFERENCE_FILE
    assert not reference.is_symlink() and reference.is_file()
    assert load_checkpoint(reference)["step"] == 2  # restored from the run's first checkpoint, still there
    assert matches(run_dir) == [(2, 2), (4, 2), (6, 2)]
    warned = [e["message"] for e in events_in(run_dir) if e["kind"] == "warning"]
    assert any("symbolic link" in m and "restored from step-000000002.pt" in m for m in warned), warned
    assert rebaselines(run_dir) == []


def test_a_reference_linked_to_another_checkpoint_mid_run_is_never_read(tmp_path, workdir, monkeypatch):
    run_dir, other = tmp_path / "run", tmp_path / "other"
    assert trainer_main(["train", *settings_args(other, *MATCH_SETS[1:], "runtime.max_steps=4")]) == 0
    foreign = other / "step-000000004.pt"
    before = foreign.read_bytes()

    def plant() -> None:
        (run_dir / MATCH_REFERENCE_FILE).unlink()
        (run_dir / MATCH_REFERENCE_FILE).symlink_to(foreign)

    assert train_with(run_dir, monkeypatch, {4: plant}, "runtime.keep_checkpoints=3") == 0
    # Every match played the run's own reference, step 2; the old code read the foreign step 4 through the link.
    assert matches(run_dir) == [(2, 2), (4, 2), (6, 2)]
    assert foreign.read_bytes() == before and not (run_dir / MATCH_REFERENCE_FILE).is_symlink()


def test_run_checkpoints_are_read_without_following_a_link(tmp_path):
    real = tmp_path / "elsewhere.pt"
    torch.save({"format": "not-ours"}, real)
    link = tmp_path / MATCH_REFERENCE_FILE
    link.symlink_to(real)
    with pytest.raises(CheckpointError, match=r"is a symbolic link .* never reads"):
        load_checkpoint(link, run_file=True)
    fifo = tmp_path / "step-000000002.pt"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):  # and no hang: opened non-blocking
        load_checkpoint(fifo, run_file=True)


def test_an_atomic_write_never_writes_into_a_hard_link_planted_at_its_temp_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.link(victim, run_dir / f".train.pid.tmp-{os.getpid()}")  # the old code opened it with O_TRUNC
    write_atomically(run_dir / "train.pid", lambda handle: handle.write(b"{}\n"))
    assert victim.read_text() == "precious\n"
    assert (run_dir / "train.pid").read_text() == "{}\n"
    assert sorted(p.name for p in run_dir.iterdir()) == ["train.pid"]


def test_an_output_temp_name_planted_as_a_link_is_not_followed(tmp_path):
    from tideborn.outputs import StagedOutputs

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "model.onnx"
    (tmp_path / f".model.onnx.tmp-{os.getpid()}").symlink_to(victim)
    with StagedOutputs() as staged:
        staged.write(out, lambda handle: handle.write(b"model"))
        staged.publish()
    assert victim.read_text() == "precious\n" and out.read_bytes() == b"model"


# -- must 8: a moved Elo baseline is said ----------------------------------------------------------------------

def test_a_deleted_reference_is_restored_from_the_runs_first_checkpoint(tmp_path, workdir, monkeypatch):
    run_dir = tmp_path / "run"
    assert train_with(run_dir, monkeypatch, {4: (run_dir / MATCH_REFERENCE_FILE).unlink},
                      "runtime.keep_checkpoints=3") == 0
    # The old code made the step-4 checkpoint the reference without a word: the curve's origin moved.
    assert matches(run_dir) == [(2, 2), (4, 2), (6, 2)]
    assert load_checkpoint(run_dir / MATCH_REFERENCE_FILE)["step"] == 2
    assert rebaselines(run_dir) == []


def test_a_lost_reference_is_a_rebaseline_warning_shown_by_status_and_the_monitor(tmp_path, workdir, monkeypatch,
                                                                                  capsys):
    run_dir = tmp_path / "run"
    # keep_checkpoints=1: step 2 is pruned at step 4's save, so match-reference.pt is its only copy.
    assert train_with(run_dir, monkeypatch, {4: (run_dir / MATCH_REFERENCE_FILE).unlink},
                      "runtime.keep_checkpoints=1") == 0
    assert matches(run_dir) == [(2, 2), (4, 4), (6, 4)]
    [warning] = rebaselines(run_dir)
    assert (warning["step"], warning["old_reference_step"], warning["reference_step"]) == (4, 2, 4)
    assert "reference is now step 4" in warning["message"]
    # A resumed run keeps the new reference (the checkpoints carry its step) and says nothing more.
    assert trainer_main(["train", *settings_args(run_dir, *MATCH_SETS, "runtime.keep_checkpoints=1",
                                                 "runtime.max_steps=8")]) == 0
    assert matches(run_dir)[-1] == (8, 4) and len(rebaselines(run_dir)) == 1

    capsys.readouterr()
    assert train_run.main(["status", "--out-dir", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "elo origin  MOVED at step 4: the match reference (step 2) was lost, matches now play step 4" in text
    assert train_run.main(["status", "--out-dir", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["elo_rebaselines"] == [[4, 2, 4]]
    from tideborn.rundir.state import RunTracker
    from tideborn.tui.widgets.header import elo_curve_text

    tracker = RunTracker(run_dir)
    tracker.refresh()
    status = tracker.status()  # the typed status, as the monitor's header has it
    assert "(origin moved at step 4: vs step 4)" in elo_curve_text(status.elo_curve, False, status.elo_rebaselines)


def test_a_reference_replaced_by_another_checkpoint_is_a_rebaseline(tmp_path, workdir, monkeypatch):
    run_dir = tmp_path / "run"

    def replace() -> None:
        reference = run_dir / MATCH_REFERENCE_FILE
        reference.unlink()
        reference.write_bytes((run_dir / "step-000000004.pt").read_bytes())

    assert train_with(run_dir, monkeypatch, {4: replace}, "runtime.keep_checkpoints=3") == 0
    assert matches(run_dir) == [(2, 2), (4, 4), (6, 4)]
    [warning] = rebaselines(run_dir)
    assert (warning["old_reference_step"], warning["reference_step"]) == (2, 4)


# -- must 4: every output is checked before the work, and its failure is one line ------------------------------

@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run directory: four steps of the smoke net, with its events, checkpoints and match reference."""
    root = tmp_path_factory.mktemp("small-run")
    run_dir = root / "run"
    train(run_dir, "runtime.max_steps=4", "runtime.checkpoint_every=2", "runtime.match_every=2",
          "runtime.match_games=2", "optim.batch_size=16", "data.workers=0", cwd=root)
    return run_dir


def play(checkpoint: Path, *args: str) -> int:
    from tideborn.match.cli import main as match_main

    return match_main([str(checkpoint), str(checkpoint), "--games", "8", "--max-moves", "40", *args])


@pytest.fixture
def read_only_dir(small_filesystem) -> Path:
    mount_point, _ = small_filesystem
    subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
    return mount_point


@pytest.mark.parametrize("where", ["/proc/self", "/proc/self/games", "read-only"])
def test_save_games_where_nothing_can_be_written_is_refused_before_any_game(where, small_run, request, capsys):
    directory = request.getfixturevalue("read_only_dir") if where == "read-only" else Path(where)
    before = sorted(os.listdir(directory)) if directory.is_dir() else None
    # The old code played every game first, then raised an OSError traceback at the first save.
    assert play(small_run / "step-000000002.pt", "--save-games", str(directory)) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no game was played: the refusal comes first
    assert_user_error(err, rf"--save-games {directory}: cannot (write in|create)")
    assert (sorted(os.listdir(directory)) if directory.is_dir() else None) == before


def test_a_save_that_fails_mid_match_keeps_the_score_and_leaves_no_temp_file(small_run, small_filesystem, capsys):
    mount_point, resize = small_filesystem
    resize(8192)  # two pages: the probe's block fits, then two game files, and the third finds the disk full
    games = mount_point / "games"
    assert play(small_run / "step-000000002.pt", "--save-games", str(games), "--json") == 2
    out, err = capsys.readouterr()
    report = json.loads(out)  # the score is printed whole, every game counted
    assert report["wins"] + report["draws"] + report["losses"] == 8
    saved = sorted(p.name for p in games.iterdir())
    assert saved and len(saved) < 8 and all(name.startswith("game-") and name.endswith(".csa") for name in saved)
    assert report["games_saved"] == len(saved)
    assert_user_error(err, rf"could not write game-\d{{4}}\.csa \(No space left on device\); {len(saved)} of 8 "
                           "games saved, the score above counts all of them")


RUN_FILE_NAMES = ["events.jsonl", "train.log", "train.pid", "launch.json", ".trainer.lock", "match-reference.pt",
                  "step-000000002.pt", "step-000000900.pt"]


@pytest.mark.parametrize("name", RUN_FILE_NAMES)
def test_export_refuses_a_run_file_as_its_output_before_reading_the_checkpoint(name, small_run, capsys):
    from tideborn.export.cli import main as export_main

    out = small_run / name
    before = out.read_bytes() if out.exists() else None
    # The checkpoint is one the old code read (and exported, replacing the run file) before refusing anything.
    assert export_main(["--checkpoint", str(small_run / "step-000000004.pt"), "--out", str(out)]) == 2
    assert_user_error(capsys.readouterr().err, rf"--out {out}: {name} is the name of a run directory's own file")
    assert (out.read_bytes() if out.exists() else None) == before


def test_export_checks_its_output_directory_before_the_checkpoint(tmp_path, capsys):
    from tideborn.export.cli import main as export_main

    assert export_main(["--checkpoint", str(tmp_path / "absent.pt"), "--out", "/proc/self/model.onnx"]) == 2
    assert_user_error(capsys.readouterr().err, r"--out /proc/self/model\.onnx: cannot write in /proc/self")


async def test_the_monitors_export_dialog_refuses_a_run_file(small_run, tmp_path, monkeypatch):
    from textual.app import App

    from tideborn.tui.screens.checkpoints import CheckpointFile, ExportScreen

    monkeypatch.chdir(tmp_path)
    events = small_run / "events.jsonl"
    before = events.read_bytes()
    checkpoint = small_run / "step-000000002.pt"
    box = ExportScreen(CheckpointFile(2, checkpoint, checkpoint.stat().st_size, 0.0), tmp_path / "model.onnx")
    async with App().run_test() as pilot:
        pilot.app.push_screen(box)
        await pilot.pause()
        box.query_one("#export-path").value = str(events)
        await pilot.press("enter")
        await pilot.pause()
        assert pilot.app.screen is box  # not dismissed: no export was started
        assert "is the name of a run directory's own file" in str(box.query_one("#export-error").render())
    assert events.read_bytes() == before


# -- must 7: openings mean what they say -----------------------------------------------------------------------

START = "lnsgkgsnl/1r5b1/ppppppppp/9/9/9/PPPPPPPPP/1B5R1/LNSGKGSNL"


def openings_file(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "openings.sfen"
    path.write_text(f"# two good lines first, so the bad one is line 4\nstartpos\nstartpos moves 7g7f\n{line}\n")
    return path


def test_moves_after_a_position_are_played(tmp_path):
    from tideborn.match.openings import load_openings

    path = tmp_path / "openings.sfen"
    path.write_text(f"startpos moves 7g7f 3c3d\nposition startpos moves 2g2f\nsfen {START} w - 1 moves 3c3d\n"
                    f"position sfen {START} b - 1 moves 7g7f 3c3d 8h2b+\n")
    # The old code dropped the moves of the first two lines and refused the last two (a "SFEN" of 5+ fields).
    assert load_openings(path) == [
        "lnsgkgsnl/1r5b1/pppppp1pp/6p2/9/2P6/PP1PPPPPP/1B5R1/LNSGKGSNL b - 3",
        "lnsgkgsnl/1r5b1/ppppppppp/9/9/7P1/PPPPPPP1P/1B5R1/LNSGKGSNL w - 2",
        "lnsgkgsnl/1r5b1/pppppp1pp/6p2/9/9/PPPPPPPPP/1B5R1/LNSGKGSNL b - 2",
        "lnsgkgsnl/1r5+B1/pppppp1pp/6p2/9/2P6/PP1PPPPPP/7R1/LNSGKGSNL w B 4",
    ]


@pytest.mark.parametrize(("line", "why"), [
    ("startpos foo bar", r"'foo' after startpos; only 'moves' and USI moves may follow it"),
    ("startpos moves 7g7e", r"move 1, '7g7e', is not a legal move"),
    ("startpos moves 7g7f 7g7f", r"move 2, '7g7f', is not a legal move"),
    ("position startpos moves 7g7f zz", r"move 2, 'zz', is not a USI move"),
    (f"sfen {START} b - 1 moves 5a4b", r"move 1, '5a4b', is not a legal move"),
    ("lnsgkgsPl/1r5b1/pppppppp1/9/9/9/PPPPPPPP1/1B5R1/LNSGKGSNL b - 1", r"a black pawn on its last rank \(2a\)"),
    ("4k3L/9/9/9/9/9/9/9/4K4 b - 1", r"a black lance on its last rank \(1a\)"),
    ("4k4/9/9/9/9/9/9/9/4K3l b - 1", r"a white lance on its last rank \(1i\)"),
    ("4k4/9/9/9/9/9/9/n8/4K4 b - 1", r"a white knight on its last two ranks \(9h\)"),
    ("4k4/N8/9/9/9/9/9/9/4K4 b - 1", r"a black knight on its last two ranks \(9b\)"),
    ("lnsgkgsnl/1r5b1/ppppppppp/9/9/P8/PPPPPPPP1/1B5R1/LNSGKGSNL b - 1", r"two unpromoted black pawns on file 9"),
    ("4k4/9/9/9/9/9/9/4r4/4K4 w - 1", r"black, not to move, is in check"),
])
def test_an_opening_line_that_does_not_mean_a_position_is_refused_naming_file_and_line(line, why, tmp_path, capsys):
    from tideborn.match.cli import main as match_main

    path = openings_file(tmp_path, line)
    assert match_main([str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--openings", str(path)]) == 2
    out, err = capsys.readouterr()
    assert_user_error(err, rf"{path}:4: .*{why}")
    assert out == ""  # nothing from cshogi's C++ checks leaks onto stdout


def test_promoted_pieces_may_stand_anywhere(tmp_path):
    from tideborn.match.openings import load_openings

    path = openings_file(tmp_path, "4k2+P+L/+N8/9/9/9/9/P8/9/4K4 b - 1")  # a promoted pawn, lance, knight; one pawn
    assert len(load_openings(path)) == 3
