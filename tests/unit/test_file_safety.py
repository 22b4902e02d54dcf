"""One of each: one file-safety module (`tideborn.safefile`) creates, replaces and renames files for the whole
package, so the monitor's override file gets what run files get (fsync, no link written through or replaced);
one table of teacher-file extensions; one positive-number argument type. That nothing else in the package creates,
renames or links a file, or tells FIFOs and devices apart, is ruff's to hold (pyproject.toml, banned-api)."""

from __future__ import annotations

import argparse
import ast
import os
import shutil
from pathlib import Path

import pytest

from tideborn.errors import UserError
from tideborn.rundir.kinds import Step
from tideborn.tui.overrides import OverrideModel
from tideborn.tui.plan import LaunchPlan

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tideborn"


@pytest.fixture
def model(workdir: Path) -> OverrideModel:
    shutil.copy(ROOT / "configs" / "smoke.toml", workdir / "smoke.toml")
    return OverrideModel(LaunchPlan(config="smoke.toml", overrides=("runtime.max_steps=40",), cwd=workdir))


def test_the_override_file_is_fsynced_before_it_is_published(model, workdir, monkeypatch):
    """A power cut after the monitor says "saved" must not leave an empty or half file: the content is fsynced
    before the rename, and the directory after it."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    saved = model.save(Path("edited.toml"))
    assert "max_steps = 40" in saved.read_text()
    temp = f".edited.toml.tmp-{os.getpid()}"
    assert [Path(name).name for name in synced] == [temp, workdir.name], synced
    assert sorted(p.name for p in workdir.iterdir()) == ["edited.toml", "smoke.toml"]  # no temp file left


def test_the_override_file_refuses_a_planted_symlink(model, workdir):
    """The user names a file to write; a link found at that name is refused in one line naming it, and neither
    the link nor what it points to changes."""
    victim = workdir / "victim.toml"
    victim.write_text("precious\n")
    link = workdir / "edited.toml"
    link.symlink_to(victim)
    with pytest.raises(UserError, match=rf"{link} is a symbolic link \(to {victim}\); tideborn never writes"):
        model.save(Path("edited.toml"))
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in workdir.iterdir()) == ["edited.toml", "smoke.toml", "victim.toml"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another group needs root")
def test_the_event_writer_refuses_what_the_run_directory_check_refuses(tmp_path, capfd):
    """The event writer's check of a file put in place of events.jsonl is the run directory's own (ours alone):
    a file writable by a group that is not its owner's private one is not written to, as `check_run_dir` would
    refuse it at start."""
    from tideborn.rundir.events import EventWriter, read_events

    path = tmp_path / "events.jsonl"
    with EventWriter(path) as writer:
        writer.emit(Step, step=1)
        os.rename(path, tmp_path / "events.jsonl.1")
        path.write_bytes(b"")
        os.chown(path, -1, 4242)  # a gid no group on a test machine has: not the owner's private group
        path.chmod(0o664)
        writer.emit(Step, step=2)
    assert path.read_bytes() == b""
    assert [event["step"] for event in read_events(tmp_path / "events.jsonl.1")] == [1, 2]
    assert "events.jsonl is writable by others (mode 664)" in capfd.readouterr().err


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(encoding="utf-8"), str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def _defined(name: str) -> list[str]:
    """The modules of the package that define `name` at their top level (an assignment, a function, a class)."""
    where = []
    for path, tree in _modules():
        for node in tree.body:
            targets = getattr(node, "targets", [getattr(node, "target", None)])
            names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                     [target.id for target in targets if isinstance(target, ast.Name)])
            if name in names:
                where.append(str(path.relative_to(PACKAGE)))
    return where


@pytest.mark.parametrize("name", ["EXTENSION_KINDS", "open_regular", "file_type", "NotARegularFile", "user_text",
                                  "write_atomically", "make_dirs", "write_probe", "Progress", "positive_int",
                                  "writer_running", "remove_stale_temps", "whose", "open_run_file", "link_target"])
def test_each_file_rule_and_helper_is_written_once(name):
    assert len(_defined(name)) <= 1, _defined(name)


def test_one_table_of_extensions_serves_records_and_sources():
    from tideborn.data.formats import records
    from tideborn.data.sets import sources

    assert _defined("EXTENSION_KINDS") == ["data/formats/records.py"]
    assert sources.EXTENSION_KINDS is records.EXTENSION_KINDS
    assert {suffix: sources.file_kind(f"x{suffix}") for suffix in (".hcpe", ".bin", ".psv", ".hcpe3")} == {
        ".hcpe": "hcpe", ".bin": "psv", ".psv": "psv", ".hcpe3": "hcpe3"}
    # the fixed-size record readers take only record kinds: hcpe3 is games, read by its own reader
    kinds = [records.kind_from_extension(f"x{suffix}") for suffix in (".hcpe", ".bin", ".hcpe3")]
    assert kinds == ["hcpe", "psv", None]


def test_one_positive_number_type_for_every_command_line():
    from tideborn.cliparser import positive_int

    assert _defined("positive_int") == ["cliparser.py"] and _defined("_positive") == []
    assert positive_int("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at least 1; got 0"):
        positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"not a whole number: 'x'"):
        positive_int("x")


def test_a_killed_writer_not_yet_reaped_leaves_temp_and_scratch_files_the_next_writer_removes(tmp_path: Path) -> None:
    """A SIGKILLed pool's children stay zombies until their reaper gets to them (slow on a busy machine): their
    temp and scratch files are stale all the same, and the next writer removes them."""
    import subprocess
    import sys
    import time

    from tideborn.safefile import SCRATCH_MARK, remove_stale_scratch, remove_stale_temps, writer_running

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        stat_file = Path(f"/proc/{child.pid}/stat")
        if not stat_file.parent.is_dir():
            pytest.skip("no /proc here to tell a zombie by")
        deadline = time.monotonic() + 600  # a hang's guard only
        while stat_file.read_bytes().rsplit(b")", 1)[-1].split()[0] != b"Z":  # exited, not reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        target = tmp_path / "cache.positions"
        temp = tmp_path / f".cache.positions.tmp-{child.pid}"
        scratch = tmp_path / f".cache.positions{SCRATCH_MARK}{child.pid}-0"
        temp.write_bytes(b"half")
        scratch.write_bytes(b"half")
        assert not writer_running(child.pid) and writer_running(os.getpid())
        assert remove_stale_temps(target) == [temp] and remove_stale_scratch(target) == [scratch]
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    finally:
        child.wait()
