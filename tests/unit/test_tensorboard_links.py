"""`tideborn run tensorboard` never writes through a symbolic link, as the trainer never writes a linked `export/`:
a linked log directory (the default `RUN_DIR/tensorboard`, or a `--logdir`) or a link at its event file is one line
and exit 2, with nothing written where the link points. Real files and real links, in this process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.common import assert_user_error
from tideborn.rundir.events import EventWriter
from tideborn.rundir.kinds import Step
from tideborn.safefile import LinkRefused
from tideborn.tools import tensorboard_scalars, train_run
from tideborn.tools.tensorboard_scalars import SCALARS_FILE, ScalarFile, load_protos


def a_run(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True)
    with EventWriter(run_dir / "events.jsonl") as writer:
        writer.emit(Step, step=1, loss=2.0, policy_loss=1.5, value_loss=0.5, lr=0.1)
    return run_dir


def refused_link(capsys: pytest.CaptureFixture[str], link: Path, target: Path, *extra: str, run_dir: Path) -> None:
    assert train_run.main(["tensorboard", "--out-dir", str(run_dir), *extra]) == 2
    captured = capsys.readouterr()
    assert_user_error(captured.err, rf"^python -m tideborn\.tools\.train_run tensorboard: error: "
                                    rf"{re.escape(str(link))} is a symbolic link \(to {re.escape(str(target))}\); "
                                    r"tideborn never writes through a link: remove it$")
    assert "wrote" not in captured.out


def test_a_linked_tensorboard_folder_in_the_run_directory_is_refused(tmp_path, capsys):
    run_dir = a_run(tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "tensorboard").symlink_to(outside)
    refused_link(capsys, run_dir / "tensorboard", outside, run_dir=run_dir)
    refused_link(capsys, run_dir / "tensorboard", outside, "--follow", run_dir=run_dir)
    assert list(outside.iterdir()) == []  # not the event file, not a temp file, not a write probe
    assert (run_dir / "tensorboard").is_symlink()


def test_a_logdir_given_as_a_link_is_refused_too(tmp_path, capsys):
    run_dir = a_run(tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    link = tmp_path / "board"
    link.symlink_to(outside)
    refused_link(capsys, link, outside, "--logdir", str(link), run_dir=run_dir)
    assert list(outside.iterdir()) == []


def test_a_link_at_the_event_file_is_refused_and_left_as_it_was(tmp_path, capsys):
    run_dir = a_run(tmp_path / "run")
    theirs = tmp_path / "theirs"
    theirs.write_bytes(b"someone else's file")
    logdir = run_dir / "tensorboard"
    logdir.mkdir()
    (logdir / SCALARS_FILE).symlink_to(theirs)
    refused_link(capsys, logdir / SCALARS_FILE, theirs, run_dir=run_dir)
    assert theirs.read_bytes() == b"someone else's file"
    assert [p.name for p in logdir.iterdir()] == [SCALARS_FILE] and (logdir / SCALARS_FILE).is_symlink()


def test_a_link_planted_while_converting_is_refused_at_the_moment_of_use(tmp_path):
    """After the checks before the work: the file is not published over a link that appeared meanwhile."""
    logdir = tmp_path / "board"
    theirs = tmp_path / "theirs"
    theirs.write_bytes(b"someone else's file")
    with ScalarFile(logdir, load_protos()) as scalars:
        (logdir / SCALARS_FILE).symlink_to(theirs)
        with pytest.raises(LinkRefused, match=re.escape(f"{logdir / SCALARS_FILE} is a symbolic link")):
            scalars.publish()
    assert theirs.read_bytes() == b"someone else's file"
    assert [p.name for p in logdir.iterdir()] == [SCALARS_FILE]  # the link, and no temp file left


def test_a_plain_logdir_still_converts(tmp_path, capsys):
    """The refusals are of links only: the same run converts into a real folder."""
    run_dir = a_run(tmp_path / "run")
    assert train_run.main(["tensorboard", "--out-dir", str(run_dir)]) == 0
    assert "1 step" in capsys.readouterr().out
    assert [p.name for p in (run_dir / tensorboard_scalars.DEFAULT_LOGDIR).iterdir()] == [SCALARS_FILE]
