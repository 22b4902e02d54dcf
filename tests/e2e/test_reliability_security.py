"""Security: no code from a checkpoint ever runs, no argument is ever run by a shell, run-directory files
are never group- or world-writable, and a training process listens on no network port.

Already covered elsewhere and not repeated here (tests/unit/test_checkpoint.py): `load_checkpoint`, `train
--resume` and `--mode finetune` in-process, `config --from-checkpoint` and auto-resume past a hostile
newest checkpoint as real processes. Here: the same payload through `train_run start` (auto-resume,
`--resume`, fine-tune), `tideborn export`, and the TUI.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers.common import (
    REPO_ROOT,
    SMOKE_CONFIG,
    assert_user_error,
    child_env,
    describe,
    events_of,
    out_dir_set,
    settings_args,
)
from tests.helpers.reliability import (
    CreatesFile,
    launched_runs,
    process_gone,
    toml_string,
    tool,
    trainer_pid,
    wait_for,
    write_hostile_checkpoint,
)
from tideborn.rundir.kinds import TERMINAL_KINDS
from tideborn.rundir.layout import list_checkpoints
from tideborn.safefile import DIR_MODE, FILE_MODE

SMOKE_SETS = ("optim.batch_size=16", "runtime.log_every=1", "runtime.progress=plain")


@pytest.fixture
def launched():
    yield from launched_runs()


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint-looking file whose unpickling would create a marker file, and that marker."""
    twin_marker = tmp_path / "twin-marker"
    torch.save({"payload": CreatesFile(twin_marker)}, tmp_path / "twin.pt")
    torch.load(tmp_path / "twin.pt", weights_only=False)  # prove the payload is live: an unsafe load runs it
    assert twin_marker.exists()
    marker = tmp_path / "marker"
    return write_hostile_checkpoint(tmp_path / "hostile.pt", marker), marker


def start(launched: list[Path], run_dir: Path, *sets: str, extra: tuple[str, ...] = (),
          config: Path = SMOKE_CONFIG, umask: int | None = None, cwd: Path | None = None) -> int:
    launched.append(run_dir)
    result = tool("start", *settings_args(run_dir, *sets, config=config), *extra, umask=umask, cwd=cwd)
    assert result.returncode == 0, describe(result)
    return trainer_pid(run_dir)


def log_of(run_dir: Path) -> str:
    return (run_dir / "train.log").read_text(errors="replace")


# -- pickle payloads -----------------------------------------------------------------------------------------

def test_train_run_start_never_runs_a_pickle_payload(hostile, tmp_path: Path, launched) -> None:
    path, marker = hostile
    auto, named, finetune = tmp_path / "auto", tmp_path / "named", tmp_path / "finetune"
    auto.mkdir()
    shutil.copy(path, auto / "step-000000002.pt")  # the newest "checkpoint" of the run directory
    # Auto-resume skips the file (a warning) and trains from step 0.
    pid = start(launched, auto, *SMOKE_SETS, "runtime.max_steps=3")
    wait_for(lambda: process_gone(pid), f"trainer {pid} to exit")
    # --resume and a fine-tune's initial weights: start waits for its trainer, which refuses the file,
    # and says so itself (exit 2, the trainer's one line).
    for run_dir, sets, extra in ((named, (), ("--resume", str(path))),
                                 (finetune, (f"run.init_checkpoint={json.dumps(str(path))}",), ("--mode", "finetune"))):
        launched.append(run_dir)
        result = tool("start", *settings_args(run_dir, *SMOKE_SETS, *sets), *extra)
        assert result.returncode == 2, describe(result)
        assert_user_error(result.stderr, "refused: loading it would need pickle")

    assert not marker.exists()
    events = events_of(auto)
    warning = next(e["message"] for e in events if e["kind"] == "warning")
    assert "step-000000002.pt" in warning and "refused: loading it would need pickle" in warning
    assert events[0]["resumed_from"] is None and events[-1]["kind"] == "run_finished", log_of(auto)
    assert [step for step, _ in list_checkpoints(auto)] == [3]  # the hostile file left the listing:
    assert [p.name for p in (auto / "archive").glob("quarantine-*/*")] == ["step-000000002.pt"]  # kept aside
    assert "--resume" in log_of(named) and "refused: loading it would need pickle" in log_of(named)
    assert "run.init_checkpoint" in log_of(finetune) and "refused: loading it" in log_of(finetune)
    for run_dir in (named, finetune):
        assert "Traceback" not in log_of(run_dir) and not (run_dir / "events.jsonl").exists()
        assert list_checkpoints(run_dir) == []
        assert not (run_dir / "train.pid").exists()  # the trainer never held the directory: no run is recorded


def test_export_never_runs_a_pickle_payload(hostile, tmp_path: Path, capsys, monkeypatch) -> None:
    try:
        import tideborn.export.cli  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"tideborn export is not available here ({exc})")
    from tideborn.cli import main as tideborn_main

    path, marker = hostile
    out = tmp_path / "model.onnx"
    # The console script's entry point, in this process: a payload that ran would create the marker here just
    # the same (test_export.py runs `tideborn export` as the installed console script).
    monkeypatch.chdir(tmp_path)
    code = tideborn_main(["export", "--checkpoint", str(path), "--out", str(out)])
    printed, said = capsys.readouterr()
    assert code == 2, f"exit {code}\n--- stdout\n{printed}\n--- stderr\n{said}"
    assert "refused: loading it would need pickle" in said and "Traceback" not in said
    assert not marker.exists() and not out.exists()


TUI_READS_A_RUN = r'''
import json, pkgutil, importlib, sys
from pathlib import Path
import tideborn.tui
for module in pkgutil.walk_packages(tideborn.tui.__path__, "tideborn.tui."):
    importlib.import_module(module.name)
from tideborn.tui.follow import RunFollower
follower = RunFollower(Path(sys.argv[1]), use_nvml=False)
messages = follower.poll() + follower.poll()
print(json.dumps({"torch": "torch" in sys.modules, "messages": [type(m).__name__ for m in messages]}))
'''


def test_the_tui_never_loads_a_checkpoint(hostile, template_run: Path, tmp_path: Path) -> None:
    """The TUI shows checkpoints by name, size and age only: it imports no torch at all, so it cannot
    unpickle one. Every tui module is imported, and the run follower reads a run whose newest checkpoint
    is the hostile file."""
    path, marker = hostile
    run_dir = shutil.copytree(template_run, tmp_path / "run")
    shutil.copy(path, run_dir / "step-000000009.pt")
    result = subprocess.run([sys.executable, "-c", TUI_READS_A_RUN, str(run_dir)], cwd=REPO_ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, describe(result)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["torch"] is False and "EventsArrived" in report["messages"], report
    assert not marker.exists()


# -- shell metacharacters --------------------------------------------------------------------------------------

def test_shell_metacharacters_in_paths_and_overrides_are_passed_as_argv_never_run(tmp_path: Path,
                                                                                    launched) -> None:
    # Every command names its marker relative to the working directory, `markers`, where train_run (and so
    # the trainer, and any shell either of them might start) runs: a marker there means a shell ran.
    markers, victim = tmp_path / "markers", tmp_path / "victim"
    markers.mkdir()
    victim.mkdir()
    (victim / "keep").write_text("still here")
    nasty = ("$(touch a) `touch b`; touch c; rm -rf ../victim | touch d && touch e 'single' \"double\" "
             "back\\slash\nnew line")
    config = tmp_path / "cfg $(touch f) `touch g`; touch h 'q' \"d\"\n.toml"
    shutil.copy(SMOKE_CONFIG, config)
    run_dir = tmp_path / "run $(touch i); touch j `touch k` 'q' \"d\" \nnl | cat && x"
    bare = "$(touch l);touch m"
    overrides = (f"paths.data_root={toml_string(nasty)}", f"run.init_checkpoint={bare}", "runtime.max_steps=2",
                 *SMOKE_SETS)

    control = tmp_path / "control" / "cwd"  # the payloads are live: a shell given them does create markers
    control.mkdir(parents=True)
    (control.parent / "victim").mkdir()
    for payload in (nasty, bare, config.name, run_dir.name):
        subprocess.run(f"echo {payload}", shell=True, cwd=control, capture_output=True, timeout=30)
    assert set("abcdefghijklm") <= set(os.listdir(control)) and not (control.parent / "victim").exists()

    pid = start(launched, run_dir, *overrides, config=config, cwd=markers)
    wait_for(lambda: process_gone(pid), "the trainer to finish")

    assert sorted(os.listdir(markers)) == [], "a shell ran part of an argument"
    assert (victim / "keep").read_text() == "still here"
    events = events_of(run_dir)
    assert events[-1]["kind"] == "run_finished", log_of(run_dir)
    settings = events[0]["settings"]
    assert settings["paths"]["data_root"] == nasty  # the literal string, round-tripped
    assert settings["run"]["init_checkpoint"] == bare
    assert settings["runtime"]["out_dir"] == str(run_dir)
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["config"] == str(config) and launch["overrides"] == [out_dir_set(run_dir), *overrides]
    argv = json.loads((run_dir / "train.pid").read_text())["argv"]
    assert str(config) in argv and f"paths.data_root={toml_string(nasty)}" in argv
    status = tool("status", "--out-dir", str(run_dir), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "finished", describe(status)


# -- permissions and the network -----------------------------------------------------------------------------

def listening(pid: int) -> list:
    """Sockets of the process and its children that listen (on any address)."""
    process = psutil.Process(pid)
    found = []
    for each in [process, *process.children(recursive=True)]:
        found += [c for c in each.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    return found


def test_run_directory_files_are_never_group_or_world_writable_and_nothing_listens(tmp_path: Path,
                                                                                   launched) -> None:
    """Files 0o644 and directories 0o755 under the usual umask 022 and under a permissive 000 alike (a
    stricter umask still narrows them). Both runs side by side; each is checked for sockets while it trains."""
    runs = {umask: tmp_path / f"umask{umask:03o}" / "runs" / "run" for umask in (0o022, 0o000)}
    pids = {umask: start(launched, run_dir, *SMOKE_SETS, "runtime.max_steps=100000", "runtime.checkpoint_every=2",
                         umask=umask) for umask, run_dir in runs.items()}
    for umask, run_dir in runs.items():
        wait_for(lambda: list_checkpoints(run_dir), "the first checkpoint")
        assert listening(pids[umask]) == []
        assert psutil.Process(pids[umask]).net_connections(kind="inet") == []  # not even an outgoing one

    for umask, run_dir in runs.items():
        stopped = tool("stop", "--out-dir", str(run_dir), "--timeout", "120")
        assert stopped.returncode == 0, describe(stopped)
        assert events_of(run_dir)[-1]["kind"] in TERMINAL_KINDS
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in [run_dir, *run_dir.iterdir()]}
        for name in ("train.pid", "launch.json", "train.log", "events.jsonl", ".trainer.lock"):
            assert modes[name] == FILE_MODE, (umask, name, oct(modes[name]))
        assert any(name.startswith("step-") for name in modes)
        for name, mode in modes.items():
            assert mode & (stat.S_IWGRP | stat.S_IWOTH) == 0, f"{name} is {oct(mode)} under umask {umask:03o}"
            assert mode == (DIR_MODE if name == "run" else FILE_MODE), (umask, name, oct(mode))
        assert stat.S_IMODE(run_dir.parent.stat().st_mode) == DIR_MODE  # parents `start` created, too
