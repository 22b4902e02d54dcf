"""`runtime.export_every`: weights for the engine during a run, in RUN_DIR/export/ (tideborn/trainer/engine_export.py).

Real in-process runs on a tiny synthetic network: the exports land at the cadence, every `latest.onnx` a reader
opens while the run goes on loads in onnxruntime, the keep bound holds, a model file the run cannot write is a
`warning` and the run finishes, a resumed run keeps the cadence, and exporting does not change what is trained.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import onnx
import onnxruntime
import pytest
import torch

from tideborn.config.schema import RuntimeSettings, SettingError
from tideborn.network.checkpoint import load_checkpoint
from tideborn.rundir.events import read_events
from tideborn.rundir.kinds import Export, parse_event
from tideborn.rundir.layout import ARCHIVE_DIR, EVENTS_FILE, EXPORT_DIR, LATEST_EXPORT_FILE, export_name, list_exports
from tideborn.trainer.cli import main
from tideborn.trainer.duties import Duties
from tideborn.trainer.engine_export import prune_exports

TINY_RUN = """
[run]
network = "resnet2x32"
[data]
kind = "synthetic"
[optim]
batch_size = 8
optimizer = "sgd"
ema_decay = 0.9
[runtime]
device = "cpu"
progress = "off"
log_every = 1
checkpoint_every = 3
keep_checkpoints = 10
"""


def train_args(tmp_path: Path, run_dir: Path, *sets: str) -> list[str]:
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_RUN)
    args = ["train", "--config", str(config), "--set", f"runtime.out_dir={json.dumps(str(run_dir))}"]
    for item in sets:
        args += ["--set", item]
    return args


def exports_of(run_dir: Path) -> list[dict]:
    return [e for e in read_events(run_dir / EVENTS_FILE) if e["kind"] == "export"]


def warnings_of(run_dir: Path) -> list[str]:
    return [e["message"] for e in read_events(run_dir / EVENTS_FILE) if e["kind"] == "warning"]


class LatestReader(threading.Thread):
    """An engine's side: reopens latest.onnx again and again while the run goes on, and loads every model it has
    not seen in onnxruntime. A half-written or missing-in-the-middle model would fail to load here."""

    def __init__(self, latest: Path):
        super().__init__(daemon=True)
        self.latest = latest
        self.done = threading.Event()
        self.steps_seen: list[int] = []
        self.failures: list[str] = []

    def run(self) -> None:
        last = b""
        while True:
            finished = self.done.is_set()  # one more look once the run is over: its last model counts too
            try:
                data = self.latest.read_bytes()
            except FileNotFoundError:
                if self.steps_seen:  # once there, it must stay there: a rename replaces it, never a delete
                    self.failures.append("latest.onnx vanished during the run")
                data = last
            if data != last:
                last = data
                try:
                    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
                    step = session.get_modelmeta().custom_metadata_map["tideborn.step"]
                    self.steps_seen.append(int(step))
                except Exception as exc:  # noqa: BLE001 - any failure to load is what the test reports
                    self.failures.append(f"{type(exc).__name__}: {exc}")
            if finished:
                return
            self.done.wait(0.005)


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LatestReader]:
    """One run of 5 steps exporting every 2 (and at the end), keeping 2 step models, read by an engine as it goes."""
    tmp_path = tmp_path_factory.mktemp("exported")
    run_dir = tmp_path / "run"
    reader = LatestReader(run_dir / EXPORT_DIR / LATEST_EXPORT_FILE)
    reader.start()
    try:
        code = main(train_args(tmp_path, run_dir, "runtime.max_steps=5", "runtime.export_every=2",
                               "runtime.export_keep=2"))
    finally:
        reader.done.set()
        reader.join(timeout=60)
    assert code == 0
    return run_dir, reader


def test_a_run_exports_at_each_multiple_and_at_its_end_with_latest_the_newest(exported_run):
    run_dir, _ = exported_run
    folder = run_dir / EXPORT_DIR
    events = exports_of(run_dir)
    assert [e["step"] for e in events] == [2, 4, 5]
    for event in events:
        assert event["path"] == str(folder / export_name(event["step"]))
        assert event["latest"] == str(folder / LATEST_EXPORT_FILE)
        assert event["weights"] == "ema"  # the run keeps an EMA: that is what the engine gets
        assert event["policy_max_abs_diff"] <= 1e-4 and event["value_max_abs_diff"] <= 1e-4
        record = parse_event(event)
        assert isinstance(record, Export) and record.latest == event["latest"]
    latest = folder / LATEST_EXPORT_FILE
    assert latest.is_file() and not latest.is_symlink()
    assert os.path.samefile(latest, folder / export_name(5))
    model = onnx.load(str(latest))
    assert {p.key: p.value for p in model.metadata_props}["tideborn.step"] == "5"
    assert [e["kind"] for e in read_events(run_dir / EVENTS_FILE)][-1] == "run_finished"


def test_every_latest_onnx_an_engine_opens_during_the_run_loads(exported_run):
    _, reader = exported_run
    assert reader.failures == []
    assert reader.steps_seen and reader.steps_seen[-1] == 5
    assert reader.steps_seen == sorted(set(reader.steps_seen))  # never an older model after a newer one


def test_only_the_newest_step_models_are_kept_and_nothing_half_written_is_left(exported_run):
    run_dir, _ = exported_run
    folder = run_dir / EXPORT_DIR
    assert [step for step, _ in list_exports(folder)] == [4, 5]
    assert sorted(p.name for p in folder.iterdir()) == [LATEST_EXPORT_FILE, export_name(4), export_name(5)]
    assert [e["pruned"] for e in exports_of(run_dir)] == [[], [], [str(folder / export_name(2))]]


def test_exporting_leaves_training_as_it_was(exported_run, tmp_path: Path):
    run_dir, _ = exported_run
    plain = tmp_path / "plain"
    assert main(train_args(tmp_path, plain, "runtime.max_steps=5")) == 0
    exported = load_checkpoint(run_dir / "step-000000005.pt")
    without = load_checkpoint(plain / "step-000000005.pt")
    for key, tensor in without["model"].items():
        assert torch.equal(exported["model"][key], tensor), key
    # What a resume restores: the generators, which building the network for the parity check would have moved on.
    assert torch.equal(exported["rng"]["torch"], without["rng"]["torch"])
    assert exported["rng"]["python"] == without["rng"]["python"]
    losses = [[e["loss"] for e in read_events(d / EVENTS_FILE) if e["kind"] == "step"] for d in (run_dir, plain)]
    assert losses[0] == losses[1]


def test_a_model_file_the_run_cannot_write_is_a_warning_and_the_run_finishes(tmp_path: Path):
    run_dir = tmp_path / "run"
    occupied = run_dir / EXPORT_DIR / export_name(4)
    occupied.mkdir(parents=True)  # a directory where step 4's model goes: a real condition, nothing mocked
    code = main(train_args(tmp_path, run_dir, "runtime.max_steps=6", "runtime.export_every=2"))
    assert code == 0
    assert [e["step"] for e in exports_of(run_dir)] == [2, 6]
    (warning,) = [text for text in warnings_of(run_dir) if "export" in text]
    assert f"ONNX export of step 4 to {occupied} failed" in warning and "is a directory" in warning
    assert occupied.is_dir()  # someone else's: left as it was
    assert os.path.samefile(run_dir / EXPORT_DIR / LATEST_EXPORT_FILE, run_dir / EXPORT_DIR / export_name(6))
    assert [e["kind"] for e in read_events(run_dir / EVENTS_FILE)][-1] == "run_finished"


def test_a_link_planted_as_the_export_folder_is_never_written_through(tmp_path: Path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir.mkdir()
    (run_dir / EXPORT_DIR).symlink_to(elsewhere)
    assert main(train_args(tmp_path, run_dir, "runtime.max_steps=2", "runtime.export_every=2")) == 0
    assert list(elsewhere.iterdir()) == []
    (warning,) = warnings_of(run_dir)
    assert "ONNX export of step 2" in warning and "symbolic link" in warning
    assert exports_of(run_dir) == []


def test_a_resumed_run_keeps_the_cadence_and_the_keep_bound(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = train_args(tmp_path, run_dir, "runtime.max_steps=6", "runtime.export_every=2", "runtime.export_keep=2")
    assert main([*args, "--stop-at-step", "3"]) == 0  # 3: not a multiple, and not the run's end: no export there
    assert [e["step"] for e in exports_of(run_dir)] == [2]
    assert main(args) == 0  # resumes from step 3
    assert [e["step"] for e in exports_of(run_dir)] == [2, 4, 6]
    folder = run_dir / EXPORT_DIR
    assert [step for step, _ in list_exports(folder)] == [4, 6]
    assert os.path.samefile(folder / LATEST_EXPORT_FILE, folder / export_name(6))


def test_a_fresh_start_archives_the_old_runs_exports(tmp_path: Path):
    run_dir = tmp_path / "run"
    old = run_dir / EXPORT_DIR / LATEST_EXPORT_FILE
    old.parent.mkdir(parents=True)
    old.write_bytes(b"the old run's model")
    assert main([*train_args(tmp_path, run_dir, "runtime.max_steps=1"), "--fresh"]) == 0
    assert not (run_dir / EXPORT_DIR).exists()  # an engine must not take the old run's model for this one's
    (archived,) = (run_dir / ARCHIVE_DIR).glob(f"fresh-*/{EXPORT_DIR}/{LATEST_EXPORT_FILE}")
    assert archived.read_bytes() == b"the old run's model"


def test_pruning_keeps_the_newest_the_one_latest_names_and_an_abandoned_branchs_models(tmp_path: Path):
    folder = tmp_path / EXPORT_DIR
    folder.mkdir()
    for step in (1, 2, 3, 4, 5, 9):
        (folder / export_name(step)).write_bytes(b"model %d" % step)
    latest = folder / LATEST_EXPORT_FILE
    os.link(folder / export_name(2), latest)  # latest.onnx still the model of step 2 (its update failed since)
    pruned, problems = prune_exports(folder, 2, folder / export_name(5), latest)
    assert problems == []
    assert sorted(p.name for p in pruned) == [export_name(1), export_name(3)]
    assert [step for step, _ in list_exports(folder)] == [2, 4, 5, 9]  # 9: past the newest, not this lineage's


def test_the_engine_export_is_due_at_its_multiples_and_when_the_run_finishes():
    def due(duties: Duties) -> list[int]:
        return [step for step in range(1, duties.horizon.max_steps + 1)
                if not (duties.horizon.stop_at_step and step > duties.horizon.stop_at_step)
                and duties.engine_export.should_run(step, duties.horizon.finished(step))]

    runtime = RuntimeSettings(max_steps=25, export_every=10)
    assert due(Duties.of(runtime, None, evaluating=False, main=True, cuda=False)) == [10, 20, 25]
    assert due(Duties.of(runtime, 15, evaluating=False, main=True, cuda=False)) == [10]  # an attempt's end is not
    assert due(Duties.of(runtime, None, evaluating=False, main=False, cuda=False)) == []  # rank 0 alone exports
    assert due(Duties.of(RuntimeSettings(max_steps=25), None, evaluating=False, main=True, cuda=False)) == []


@pytest.mark.parametrize(("settings", "pattern"), [
    ({"export_every": -1}, r"runtime\.export_every: must be >= 0"),
    ({"export_keep": 0}, r"runtime\.export_keep: must be >= 1"),
])
def test_bad_export_settings_name_the_key(settings: dict, pattern: str):
    with pytest.raises(SettingError, match=pattern):
        RuntimeSettings(**settings)


def test_the_cadence_need_not_be_a_multiple_of_the_checkpoints():
    assert RuntimeSettings(checkpoint_every=1000, export_every=250).export_every == 250
