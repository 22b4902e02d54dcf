"""`tideborn run tensorboard`: a real run's step, eval and match figures (and a CUDA trainer's gpu figures) as
TensorBoard scalars, read back with TensorBoard's own reader; converting twice never doubles a point; a resumed
run shows the branch it resumed; `--follow` keeps up with a live run until it ends; without the extra, one line
says which to install."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from tests.helpers.common import (
    REPO_ROOT,
    TEACHER_CONFIG,
    TEMPLATE_SETS,
    assert_user_error,
    child_env,
    copy_run,
    events_of,
    settings_args,
    step_events,
    wait_until,
)
from tests.helpers.data import SAMPLE_GAMES
from tests.helpers.reliability import wait_for
from tideborn.cli import main as tideborn
from tideborn.data.tools.convert import convert_games
from tideborn.data.tools.split import split_games
from tideborn.rundir.events import EventWriter
from tideborn.rundir.files import PidRecord, boot_relative_start, this_host
from tideborn.rundir.kinds import Gpu, Match, RunStarted, Step
from tideborn.tools.tensorboard_scalars import SCALARS_FILE
from tideborn.trainer.cli import main as trainer

COMMAND = [sys.executable, "-m", "tideborn", "run", "tensorboard"]


def read_back(logdir: Path) -> EventAccumulator:
    """Every scalar in `logdir`, as TensorBoard itself loads it (no sampling)."""
    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def points(accumulator: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(point.step, point.value) for point in accumulator.Scalars(tag)]


def close(a: float, b: float) -> bool:
    """TensorBoard keeps a scalar as a float32."""
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run on the real sample games, trained in this process: steps, held-out evals and Elo matches."""
    root = tmp_path_factory.mktemp("tensorboard")
    convert_games(sorted((SAMPLE_GAMES / "wcsc28").glob("*.csa")), root / "games.hcpe", progress=False)
    split_games(root / "games.hcpe", root / "train.hcpe", root / "test.hcpe", test_fraction=0.2, seed=0,
                progress=False)
    run_dir = root / "run"
    rc = trainer(["train", *settings_args(
        run_dir, f"paths.data_root={json.dumps(str(root))}", 'data.train=["train.hcpe"]', 'data.test=["test.hcpe"]',
        "data.eval_positions=64", "data.workers=0", "optim.batch_size=16", "runtime.max_steps=4",
        "runtime.log_every=1", "runtime.eval_every=2", "runtime.checkpoint_every=2", "runtime.match_every=2",
        "runtime.match_games=2", 'runtime.progress="off"', config=TEACHER_CONFIG)])
    assert rc == 0
    return run_dir


def test_a_real_run_reads_back_in_tensorboard_figure_for_figure(teacher_run, tmp_path, capsys):
    logdir = tmp_path / "board"
    assert tideborn(["run", "tensorboard", "--out-dir", str(teacher_run), "--logdir", str(logdir)]) == 0
    out = capsys.readouterr().out
    assert f"to {logdir / SCALARS_FILE}" in out and f"tensorboard --logdir {logdir}" in out
    assert [p.name for p in logdir.iterdir()] == [SCALARS_FILE]

    board = read_back(logdir)
    events = events_of(teacher_run)
    steps, evals, matches = ([e for e in events if e["kind"] == kind] for kind in ("step", "eval", "match"))
    assert len(steps) == 4 and len(evals) == 2 and len(matches) == 2
    for field, tag in (("loss", "train/loss"), ("policy_loss", "train/policy_loss"),
                       ("value_loss", "train/value_loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                       ("positions_per_second", "train/positions_per_second")):
        got = points(board, tag)
        assert [step for step, _ in got] == [e["step"] for e in steps], tag
        assert all(close(value, e[field]) for (_, value), e in zip(got, steps)), tag
    # the point's wall time is when the trainer wrote the event, not when it was converted
    assert [round(p.wall_time, 3) for p in board.Scalars("train/loss")] == [round(e["time"], 3) for e in steps]
    for field in ("policy_loss", "value_loss", "policy_accuracy", "policy_accuracy_legal", "policy_entropy"):
        got = points(board, f"eval/{field}")
        assert [step for step, _ in got] == [e["step"] for e in evals], field
        assert all(close(value, e[field]) for (_, value), e in zip(got, evals)), field
    elo = points(board, "match/elo")
    assert [step for step, _ in elo] == [2, 4] and elo[0][1] == 0.0  # the reference against itself: the origin
    assert close(elo[1][1], matches[1]["elo"])
    for bound in ("elo_low", "elo_high"):  # a 100%/0% score's bound is infinite: no point, never a fake one
        finite = [(e["step"], e[bound]) for e in matches if isinstance(e[bound], (int, float))]
        got = points(board, f"match/{bound}")
        assert [s for s, _ in got] == [s for s, _ in finite] and all(close(a, b) for (_, a), (_, b) in zip(got, finite))
    # the Custom Scalars tab draws the Elo curve inside its 95% interval
    config = board.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    chart = layout_pb2.Layout.FromString(config).category[0].chart[0]
    series = chart.margin.series[0]
    assert (series.value, series.lower, series.upper) == ("match/elo", "match/elo_low", "match/elo_high")


def test_converting_again_replaces_the_file_and_never_doubles_a_point(template_run, tmp_path, capsys):
    run_dir = copy_run(template_run, tmp_path / "run")
    for _ in range(2):
        assert tideborn(["run", "tensorboard", "--out-dir", str(run_dir)]) == 0
    logdir = run_dir / "tensorboard"  # the default: beside the run's own files
    assert [p.name for p in logdir.iterdir()] == [SCALARS_FILE]  # no temp file left either
    assert [step for step, _ in points(read_back(logdir), "train/loss")] == [1, 2, 3, 4]
    assert "scalars from 4 step, 0 eval, 0 match, 0 gpu events" in capsys.readouterr().out


def test_a_resumed_run_shows_the_branch_it_resumed_not_the_one_it_left(template_run, tmp_path, capsys):
    run_dir = copy_run(template_run, tmp_path / "run")
    # resumed from step 2 at another learning rate: steps 3 and 4 are trained again, differently
    rc = trainer(["train", *settings_args(run_dir, *TEMPLATE_SETS, "optim.lr=0.001"),
                  "--resume", str(run_dir / "step-000000002.pt")])
    assert rc == 0
    logged = [(e["step"], e["lr"]) for e in step_events(events_of(run_dir))]
    assert [step for step, _ in logged] == [1, 2, 3, 4, 3, 4]
    assert tideborn(["run", "tensorboard", "--out-dir", str(run_dir)]) == 0
    assert "(attempts resumed: 1;" in capsys.readouterr().out
    shown = points(read_back(run_dir / "tensorboard"), "train/lr")
    assert [step for step, _ in shown] == [1, 2, 3, 4]
    assert all(close(value, lr) for (_, value), (_, lr) in zip(shown, logged[:2] + logged[4:]))
    assert not close(shown[2][1], logged[2][1])  # not the abandoned branch's rate


def test_gpu_figures_and_a_diverged_loss_become_scalars(tmp_path, capsys):
    """A CUDA trainer's `gpu` events (written here with the trainer's own event writer) and a NaN loss."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with EventWriter(run_dir / "events.jsonl") as writer:
        writer.emit(Gpu, step=10, torch_peak_memory_bytes=3_000_000_000, torch_memory_allocated_bytes=None,
                    devices=[{"index": 0, "name": "NVIDIA H100", "utilization_percent": 97, "temperature_c": 71,
                              "memory_used_bytes": 60_000_000_000, "memory_total_bytes": 80_000_000_000,
                              "power_watts": None},
                             {"index": 1, "name": "NVIDIA H100", "utilization_percent": 12, "temperature_c": 40,
                              "memory_used_bytes": 1_000_000_000, "memory_total_bytes": 80_000_000_000,
                              "power_watts": 100.5}])
        writer.emit(Step, step=20, loss=float("nan"), policy_loss=1.0, value_loss=float("inf"), lr=0.1)
        writer.emit(Match, step=20, elo=float("inf"), elo_low=400.0, elo_high=float("inf"), score=1.0)
    assert tideborn(["run", "tensorboard", "--out-dir", str(run_dir)]) == 0
    board = read_back(run_dir / "tensorboard")
    assert points(board, "gpu/0/utilization_percent") == [(10, 97.0)]
    assert points(board, "gpu/1/power_watts") == [(10, 100.5)]
    assert points(board, "gpu/torch_peak_memory_bytes") == [(10, 3e9)]
    tags = board.Tags()["scalars"]
    assert "gpu/0/power_watts" not in tags and "gpu/torch_memory_allocated_bytes" not in tags  # null: no point
    assert "gpu/0/name" not in tags and "gpu/0/index" not in tags
    assert math.isnan(points(board, "train/loss")[0][1]) and math.isinf(points(board, "train/value_loss")[0][1])
    assert points(board, "match/elo_low") == [(20, 400.0)]
    assert "match/elo" not in tags and "match/elo_high" not in tags


def test_follow_keeps_up_with_a_live_run_until_it_ends_and_ctrl_c_keeps_the_file(start_trainer, tmp_path):
    run_dir = tmp_path / "run"
    trainer_process = start_trainer("train", *settings_args(
        run_dir, "runtime.max_steps=100000", "runtime.log_every=1", "runtime.checkpoint_every=100000",
        "optim.batch_size=16", 'runtime.progress="off"'))
    wait_until(lambda: len(step_events(events_of(run_dir))) >= 2, trainer_process, "the first steps")
    followers = {}
    for name in ("to_the_end", "interrupted"):
        followers[name] = subprocess.Popen([*COMMAND, "--out-dir", str(run_dir), "--logdir", str(tmp_path / name),
                                            "--follow"], cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
    try:
        board = tmp_path / "to_the_end" / SCALARS_FILE
        wait_until(board.exists, trainer_process, "the converted file")
        at_start = max(step for step, _ in points(read_back(board.parent), "train/loss"))
        # figures written after the conversion began reach the file while the follower runs
        wait_until(lambda: max(s for s, _ in points(read_back(board.parent), "train/loss")) > at_start + 2,
                   trainer_process, "steps followed", interval=0.2)
        assert followers["to_the_end"].poll() is None

        wait_until((tmp_path / "interrupted" / SCALARS_FILE).exists, trainer_process, "the other converted file")
        followers["interrupted"].send_signal(signal.SIGINT)
        out, err = followers["interrupted"].communicate(timeout=60)
        assert followers["interrupted"].returncode == 130, err
        assert "scalars from" in out and "Traceback" not in err
        assert points(read_back(tmp_path / "interrupted"), "train/loss")  # what it converted stays, whole

        trainer_process.send(signal.SIGTERM)
        assert trainer_process.wait() == 0
        out, err = followers["to_the_end"].communicate(timeout=60)  # the run ended: so does the follower
        assert followers["to_the_end"].returncode == 0, err
    finally:
        for follower in followers.values():
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert f"following {run_dir}" in out
    steps = step_events(events_of(run_dir))
    shown = points(read_back(board.parent), "train/loss")
    assert [step for step, _ in shown] == [e["step"] for e in steps]  # every step to the stop, each once
    assert all(close(value, e["loss"]) for (_, value), e in zip(shown, steps))
    assert [p.name for p in board.parent.iterdir()] == [SCALARS_FILE]


BLOCK_TENSORBOARD = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from tideborn.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_the_extra_one_line_says_which_to_install(template_run, tmp_path):
    logdir = tmp_path / "board"
    result = subprocess.run([sys.executable, "-c", BLOCK_TENSORBOARD, "run", "tensorboard", "--out-dir",
                             str(template_run), "--logdir", str(logdir)], cwd=REPO_ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert_user_error(result.stderr, r"^tideborn run tensorboard: error: .*needs the optional 'tensorboard' extra: "
                                     r"pip install 'tideborn\[tensorboard\]'")
    assert result.stdout == "" and not logdir.exists()


def test_the_command_loads_no_torch(template_run, tmp_path):
    """Like status, the conversion starts without paying for torch (TensorBoard's writer needs none)."""
    code = ("import sys; from tideborn.cli import main; rc = main(sys.argv[1:]); "
            "print('torch loaded' if 'torch' in sys.modules else 'no torch', rc)")
    result = subprocess.run([sys.executable, "-c", code, "run", "tensorboard", "--out-dir", str(template_run),
                             "--logdir", str(tmp_path / "board")], cwd=REPO_ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "no torch 0", result.stdout + result.stderr


def test_bad_places_are_one_line_each(template_run, tmp_path, capsys):
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert tideborn(["run", "tensorboard", "--out-dir", str(template_run), "--logdir", str(taken)]) == 2
    assert_user_error(capsys.readouterr().err, rf"--logdir {taken}: not a directory")
    assert tideborn(["run", "tensorboard", "--out-dir", str(tmp_path / "missing")]) == 3
    assert_user_error(capsys.readouterr().err, r"missing: no such directory")


def looks_live(run_dir: Path, pid: int) -> None:
    """A run directory whose trainer is `pid`, as `start` records it: status calls it running while `pid` lives."""
    run_dir.mkdir(parents=True)
    me = psutil.Process(pid)
    record = PidRecord(pid=pid, start_time=me.create_time(), host=this_host(), argv=["x"], started_at=time.time(),
                       **boot_relative_start(pid))
    (run_dir / "train.pid").write_text(json.dumps(record.to_dict()))
    with EventWriter(run_dir / "events.jsonl") as writer:
        writer.emit(RunStarted, step=0, pid=pid, host=this_host(), max_steps=1000)
        writer.emit(Step, step=1, loss=2.0, policy_loss=1.5, value_loss=0.5, lr=0.1)


def test_follow_says_so_and_exits_3_when_the_run_directory_is_renamed_away_or_removed(tmp_path):
    """The run goes on (its trainer, a stand-in here, lives throughout): only its directory leaves the path followed.
    Neither an end of the run nor a reason to wait for one there."""
    trainer_stand_in = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); "
                                         "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    followers: dict[str, subprocess.Popen] = {}
    try:
        assert trainer_stand_in.stdout is not None and trainer_stand_in.stdout.readline() == "ready\n"
        for how in ("renamed", "removed"):
            looks_live(tmp_path / how, trainer_stand_in.pid)
            followers[how] = subprocess.Popen([*COMMAND, "--out-dir", str(tmp_path / how), "--follow"], cwd=tmp_path,
                                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True)
        for how, follower in followers.items():
            board = tmp_path / how / "tensorboard" / SCALARS_FILE
            wait_for(lambda: board.exists() or follower.poll() is not None, f"the {how} run's converted file")
            assert follower.poll() is None, follower.communicate()
        (tmp_path / "renamed").rename(tmp_path / "elsewhere")
        shutil.rmtree(tmp_path / "removed")
        for how, follower in followers.items():
            # Checked at least once a second: the timeout only keeps a follower that never notices from hanging
            # the suite (the state waited for is its exit), generous for a busy machine.
            out, err = follower.communicate(timeout=120)
            assert follower.returncode == 3, (how, out, err)
            assert_user_error(err, rf"^tideborn run tensorboard: error: {re.escape(str(tmp_path / how))}: the run "
                                   r"directory is gone \(removed or renamed away\); stopped following it after 4 "
                                   r"scalars$")
            assert "wrote" not in out
        assert trainer_stand_in.poll() is None  # the run had not ended: the directory going is what was noticed
    finally:
        for process in (*followers.values(), trainer_stand_in):
            if process.poll() is None:
                process.kill()
            process.wait()
    # what was converted went with the directory, whole
    assert points(read_back(tmp_path / "elsewhere" / "tensorboard"), "train/loss") == [(1, 2.0)]
