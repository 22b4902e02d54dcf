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
import sys
import typing
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_user_error, child_env, describe, settings_args
from tideborn.errors import UserError
from tideborn.rundir import MATCH_REFERENCE_FILE, write_atomically
from tideborn.tools import train_run
from tideborn.trainer import loop
from tideborn.trainer.checkpoint import CheckpointError, load_checkpoint
from tideborn.trainer.cli import main as trainer_main

MATCH_SETS = ("runtime.max_steps=6", "runtime.checkpoint_every=2", "runtime.match_every=2", "runtime.match_games=2",
              "optim.batch_size=16", "runtime.log_every=2", "data.workers=0")


def events_in(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def train_with(run_dir: Path, monkeypatch: pytest.MonkeyPatch, after_save: dict[int, typing.Callable[[], None]],
               *sets: str) -> int:
    """A real training run in this process; `after_save[step]` runs right after that step's checkpoint is
    written (and before the trainer keeps or reads its match reference)."""
    real_save = loop.save_checkpoint

    def save(run: Path, step: int, payload: dict):
        saved = real_save(run, step, payload)
        if step in after_save:
            after_save[step]()
        return saved

    monkeypatch.setattr(loop, "save_checkpoint", save)
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
    from tui.widgets.header import elo_curve_text

    assert "(origin moved at step 4: vs step 4)" in elo_curve_text(report["elo_curve"], False,
                                                                   report["elo_rebaselines"])


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
