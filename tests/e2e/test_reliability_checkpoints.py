"""Long-run integrity of the checkpoints: pruning never deletes what a run just wrote, files of an abandoned
branch or that do not load leave the listing (to archive/branch-* and archive/quarantine-*) so that the
next resume and `status` see only the run's own lineage, and a crafted or foreign checkpoint is one line
and exit status 2 on every path that names it, or skipped (with a warning) by automatic resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.helpers.common import (
    TEMPLATE_SETS,
    assert_user_error,
    copy_run,
    events_of,
    settings_args,
    step_events,
    terminal_events,
    train,
    tree,
)
from tideborn.cli import main as tideborn_main
from tideborn.network.checkpoint import load_checkpoint, prune_checkpoints
from tideborn.rundir.layout import ARCHIVE_DIR, list_checkpoints
from tideborn.tools import train_run
from tideborn.trainer.cli import main as trainer_main

NAME = "step-{:09d}.pt"


def archived(run_dir: Path, kind: str) -> dict[str, bytes]:
    """The files in run_dir/archive/KIND-*/ (one such folder expected), by name."""
    folders = sorted((run_dir / ARCHIVE_DIR).glob(f"{kind}-*"))
    assert len(folders) == 1, folders
    return {path.name: path.read_bytes() for path in folders[0].iterdir()}


def status_json(run_dir: Path, capsys) -> dict:
    capsys.readouterr()
    assert train_run.main(["status", "--out-dir", str(run_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# -- MUST 1: pruning and the run's lineage --------------------------------------------------------

def test_prune_keeps_the_checkpoint_just_written_and_ignores_later_steps(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8, 20, 30):
        (tmp_path / NAME.format(step)).write_bytes(b"x")
    saved = tmp_path / NAME.format(8)

    pruned = prune_checkpoints(tmp_path, 2, saved)

    assert pruned == [tmp_path / NAME.format(2), tmp_path / NAME.format(4)]
    assert [step for step, _ in list_checkpoints(tmp_path)] == [6, 8, 20, 30]
    assert prune_checkpoints(tmp_path, 1, saved) == [tmp_path / NAME.format(6)]
    assert saved.exists()


def test_a_run_resumed_past_an_unusable_newest_file_keeps_what_it_writes(template_run: Path, tmp_path: Path,
                                                                         capsys) -> None:
    # The repro, scaled down: the newest checkpoint truncated, a resume with keep_checkpoints=1.
    run_dir = copy_run(template_run, tmp_path / "run")
    newest = run_dir / NAME.format(4)
    torn = newest.read_bytes()[:100_000]
    newest.write_bytes(torn)
    sets = (*TEMPLATE_SETS, "runtime.max_steps=10", "runtime.keep_checkpoints=1", "runtime.checkpoint_every=1")
    history = len(events_of(run_dir))
    # Before any trainer has looked at it, status (which loads no checkpoint) flags it from its size.
    reported = status_json(run_dir, capsys)["last_checkpoint"]
    assert reported["step"] == 4 and reported["changed_since_saved"] is True and reported["bytes"] == len(torn)
    assert train_run.main(["status", "--out-dir", str(run_dir)]) == 0
    assert "CHANGED since it was saved (100,000 bytes" in capsys.readouterr().out

    result = train(run_dir, *sets, cwd=tmp_path, extra=["--stop-at-step", "6"])

    run = events_of(run_dir)[history:]
    assert run[0]["kind"] == "run_started" and run[0]["resumed_from"] == str(run_dir / NAME.format(2))
    warnings = [e["message"] for e in run if e["kind"] == "warning"]
    assert len(warnings) == 1 and "step-000000004.pt: corrupt or truncated" in warnings[0], warnings
    assert f"moved it to {run_dir / ARCHIVE_DIR}/quarantine-" in warnings[0]
    assert "step-000000004.pt" in result.stdout and "quarantine-" in result.stdout
    assert archived(run_dir, "quarantine") == {NAME.format(4): torn}  # kept as it was, for inspection
    stopped = terminal_events(run)
    assert [e["kind"] for e in stopped] == ["run_stopped"]
    assert stopped[0]["checkpoint"] == str(run_dir / NAME.format(6))
    assert [step for step, _ in list_checkpoints(run_dir)] == [6]  # the one just written survived pruning
    reported = status_json(run_dir, capsys)["last_checkpoint"]
    assert reported["path"] == str(run_dir / NAME.format(6)) and reported["changed_since_saved"] is False

    history = len(events_of(run_dir))
    train(run_dir, *sets, cwd=tmp_path)
    again = events_of(run_dir)[history:]
    assert again[0]["resumed_from"] == str(run_dir / NAME.format(6)) and again[0]["step"] == 6
    assert [e["kind"] for e in again if e["kind"] == "warning"] == []
    assert [e["step"] for e in step_events(again)] == [7, 8, 9, 10]


def test_resuming_an_older_checkpoint_moves_the_abandoned_branch_to_archive(template_run: Path,
                                                                            tmp_path: Path, capsys) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    branch = (run_dir / NAME.format(4)).read_bytes()
    sets = (*TEMPLATE_SETS, "runtime.max_steps=10", "runtime.keep_checkpoints=3", "runtime.checkpoint_every=1")
    history = len(events_of(run_dir))

    train(run_dir, *sets, cwd=tmp_path, extra=["--resume", str(run_dir / NAME.format(2)), "--stop-at-step", "3"])

    run = events_of(run_dir)[history:]
    warnings = [e["message"] for e in run if e["kind"] == "warning"]
    assert len(warnings) == 1 and "abandoned branch (step-000000004.pt)" in warnings[0], warnings
    assert f"{run_dir / ARCHIVE_DIR}/branch-" in warnings[0]
    assert archived(run_dir, "branch") == {NAME.format(4): branch}
    assert [step for step, _ in list_checkpoints(run_dir)] == [2, 3]
    assert status_json(run_dir, capsys)["last_checkpoint"]["step"] == 3

    history = len(events_of(run_dir))
    train(run_dir, *sets, cwd=tmp_path, extra=["--stop-at-step", "5"])  # a plain train: the new branch
    again = events_of(run_dir)[history:]
    assert again[0]["resumed_from"] == str(run_dir / NAME.format(3)) and again[0]["step"] == 3
    assert load_checkpoint(run_dir / NAME.format(4))["step"] == 4
    assert [step for step, _ in list_checkpoints(run_dir)] == [3, 4, 5]


# -- MUST 6: crafted and foreign checkpoints ------------------------------------------------------

def _set(path: tuple, value):
    def mutate(payload: dict) -> None:
        target = payload
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _delete(path: tuple):
    def mutate(payload: dict) -> None:
        target = payload
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return mutate


def _first_momentum(payload: dict) -> None:
    first = min(payload["optimizer"]["state"])
    payload["optimizer"]["state"][first]["momentum_buffer"] = torch.zeros(3)


# name -> (mutation of a real step-4 payload, what the one line must say after the file's name)
CRAFTED = {
    "missing key": (_delete(("rng",)), r"incomplete checkpoint, missing rng"),
    "step as text": (_set(("step",), "4"), r"step is str '4', not a whole number"),
    "negative step": (_set(("step",), -3), r"step -3 is out of range"),
    "model not a dict": (_set(("model",), [1, 2]), r"model is list, not a dict"),
    "settings of a wrong type": (_set(("settings", "optim", "lr"), "fast"),
                                 r"its settings: optim\.lr expects a number, got \"fast\""),
    "unknown setting": (_set(("settings", "model", "width"), 3), r"its settings: unknown key model\.width"),
    "absurd channels": (_set(("settings", "model", "channels"), 100_000),
                        r"model\.channels must be <= 8,192; got 100000"),
    "large channels, small weights": (_set(("settings", "model", "channels"), 4_096),
                                      r"model weight stem\.board_conv3x3\.weight is \[32, 62, 3, 3\], but its "
                                      r"settings \(model\.blocks=2, model\.channels=4096\) make it \[4096, 62, 3, 3\]"),
    "weights of another size": (_set(("model", "tower.0.conv1.weight"), torch.zeros(32, 32, 1, 1)),
                                r"model weight tower\.0\.conv1\.weight is \[32, 32, 1, 1\], but its settings"),
    "missing weight": (_delete(("model", "policy_head.bias.bias")),
                       r"model weights do not match .*: missing policy_head\.bias\.bias"),
    "weight not a tensor": (_set(("model", "value_head.fc2.bias"), [0.0]),
                            r"model weight value_head\.fc2\.bias is list, not a tensor"),
    "optimizer buffer of another size": (_first_momentum, r"optimizer momentum_buffer of parameter \d+ is \[3\]"),
    "scheduler with a foreign key": (_set(("scheduler", "optimizer"), 5),
                                    r"scheduler state has foreign key\(s\) 'optimizer'"),
    "scaler of another kind": (_set(("scaler",), {"scale": "big"}), r"scaler scale is 'big', not a finite number"),
    "rng state": (_set(("rng", "torch"), torch.zeros(3, dtype=torch.uint8)), r"rng torch state is unusable"),
    "data cursor": (_set(("data_cursor", "position"), -1), r"data_cursor position is -1"),
    "ema of another network": (_set(("ema",), {"n_averaged": torch.tensor(1)}), r"ema weights do not match"),
}


def craft(template_run: Path, path: Path, kind: str, step: int = 4) -> Path:
    """A copy of the template's step-4 checkpoint with one thing wrong, saved as `path` (step set to `step`)."""
    payload = torch.load(template_run / NAME.format(4), map_location="cpu", weights_only=True)
    payload["step"] = step
    CRAFTED[kind][0](payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_a_crafted_checkpoint_is_one_line_and_exit_2_on_every_path(kind: str, template_run: Path, tmp_path: Path,
                                                                   workdir: Path, capsys) -> None:
    checkpoint = craft(template_run, tmp_path / "input" / "crafted.pt", kind)
    problem = CRAFTED[kind][1]
    named = rf"\S*/input/crafted\.pt: {problem}"
    before = tree(tmp_path / "input")
    calls = {
        "train --resume": (trainer_main, ["train", *settings_args(tmp_path / "run"), "--resume", str(checkpoint)],
                           rf"^python -m tideborn\.trainer train: error: --resume {named}"),
        "config --from-checkpoint": (trainer_main, ["config", "--from-checkpoint", str(checkpoint)],
                                     rf"^python -m tideborn\.trainer \w+: error: {named}"),
        "export": (tideborn_main, ["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "m.onnx")],
                   rf"^tideborn export: error: {named}"),
    }
    for what, (main, argv, pattern) in calls.items():
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2, f"{what}: exit {code}\n{out}\n{err}"
        assert out == "", (what, out)
        assert_user_error(err, pattern)
    assert not (tmp_path / "run").exists() and not (tmp_path / "m.onnx").exists()
    assert tree(tmp_path / "input") == before


def test_automatic_resume_skips_every_crafted_checkpoint_for_the_newest_good_one(template_run: Path,
                                                                                 tmp_path: Path, capsys) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    kinds = sorted(CRAFTED)
    crafted = {}
    for offset, kind in enumerate(kinds, start=5):
        crafted[NAME.format(offset)] = (kind, craft(template_run, run_dir / NAME.format(offset), kind, offset))
    # A good checkpoint under another step's name (a copy over the wrong file) is refused as well.
    renamed = NAME.format(5 + len(kinds))
    (run_dir / renamed).write_bytes((run_dir / NAME.format(4)).read_bytes())
    contents = {name: (run_dir / name).read_bytes() for name in [*crafted, renamed]}
    history = len(events_of(run_dir))

    train(run_dir, *TEMPLATE_SETS, "runtime.max_steps=6", cwd=tmp_path)

    run = events_of(run_dir)[history:]
    assert run[0]["kind"] == "run_started" and run[0]["resumed_from"] == str(run_dir / NAME.format(4))
    warnings = [e["message"] for e in run if e["kind"] == "warning"]
    assert len(warnings) == len(contents), warnings
    for name, (kind, _) in crafted.items():
        line = next(w for w in warnings if f"{run_dir / name}:" in w)
        assert re.search(CRAFTED[kind][1], line), (kind, line)
    assert any(f"{run_dir / renamed}: holds step 4, not the step its name says" in w for w in warnings)
    assert archived(run_dir, "quarantine") == contents
    assert [e["kind"] for e in terminal_events(run)] == ["run_finished"]
    assert [step for step, _ in list_checkpoints(run_dir)] == [2, 4, 6]
    assert status_json(run_dir, capsys)["last_checkpoint"]["step"] == 6


def test_a_network_too_large_to_build_is_refused_in_the_settings(workdir: Path, capsys) -> None:
    # The same limits that refuse a crafted checkpoint's settings refuse a typo before anything is built.
    assert trainer_main(["config", "--set", "model.channels=100000"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_user_error(err, r"model\.channels must be <= 8,192; got 100000 \(from --set model\.channels=100000\)$")
