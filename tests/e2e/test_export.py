"""`tideborn export`: a checkpoint becomes an ONNX model the engine can load, with a dynamic batch, its
origin in the metadata, and outputs that match PyTorch; a model that does not match is never published,
and bad input is one line and exit status 2 with nothing written."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import numpy_helper

import tideborn
from tests.helpers.common import REPO_ROOT, assert_user_error, child_env, console_script, describe, tree
from tideborn.cli import main as tideborn_main
from tideborn.config.load import load_settings
from tideborn.export import onnx_export
from tideborn.export.interface import INPUT_NAMES, METADATA_KEYS, OUTPUT_NAMES
from tideborn.export.onnx_export import ExportInputError, choose_weights, export_onnx, reference_module
from tideborn.export.parity import ParityError, check_parity, parity_positions
from tideborn.network.checkpoint import load_checkpoint, save_checkpoint
from tideborn.trainer.device import resolve_device
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.state import TrainingState

SMOKE_STEP = "step-000000004.pt"


def run_onnx(path: Path, features1: np.ndarray, features2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    policy, value = session.run(list(OUTPUT_NAMES), {"features1": features1, "features2": features2})
    return policy, value


def torch_outputs(module: torch.nn.Module, features1: np.ndarray, features2: np.ndarray):
    with torch.no_grad():
        return tuple(t.numpy() for t in module(torch.from_numpy(features1), torch.from_numpy(features2)))


def plant_policy_bias_offset(model: onnx.ModelProto, delta: float) -> None:
    """Add `delta` to the first policy-bias entry: policy logit 0 then differs by exactly `delta`."""
    bias = next(init for init in model.graph.initializer if list(init.dims) == [2187])
    values = numpy_helper.to_array(bias).copy()
    values[0] += delta
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))


# -- the smoke net through the CLI ----------------------------------------------------------------

@pytest.fixture(scope="module")
def smoke_export(template_run: Path, tmp_path_factory: pytest.TempPathFactory):
    """`tideborn export` (the console script) of the 4-step smoke run's last checkpoint."""
    out_dir = tmp_path_factory.mktemp("export")
    checkpoint = template_run / SMOKE_STEP
    result = subprocess.run([str(console_script()), "export", "--checkpoint", str(checkpoint),
                             "--out", str(out_dir / "model.onnx")], cwd=out_dir, env=child_env(),
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, describe(result)
    return checkpoint, out_dir / "model.onnx", result


def test_the_smoke_checkpoint_exports_with_named_io_a_dynamic_batch_and_its_metadata(smoke_export) -> None:
    checkpoint, model_path, result = smoke_export
    assert "raw weights (the checkpoint has no EMA weights)" in result.stdout
    assert "value as a logit" in result.stdout and "parity with onnxruntime" in result.stdout
    assert result.stderr == ""
    assert sorted(p.name for p in model_path.parent.iterdir()) == ["model.onnx"]  # no temp, no .failed

    model = onnx.load(str(model_path))
    onnx.checker.check_model(model)
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*model.graph.input, *model.graph.output]}
    batch = shapes["features1"][0]
    assert isinstance(batch, str) and batch, "the batch dimension must be symbolic"
    assert shapes == {"features1": [batch, 62, 9, 9], "features2": [batch, 57, 9, 9],
                      "policy": [batch, 2187], "value": [batch]}
    assert [v.name for v in model.graph.input] == list(INPUT_NAMES)

    metadata = {p.key: p.value for p in model.metadata_props}
    assert set(METADATA_KEYS) <= set(metadata)
    payload = load_checkpoint(checkpoint)
    assert json.loads(metadata["tideborn.settings"]) == payload["settings"]
    assert [metadata[f"tideborn.{key}"] for key in ("step", "weights", "value")] == ["4", "raw", "logit"]
    assert metadata["tideborn.version"] == tideborn.__version__

    # Batch sizes the exporter never saw, on positions the parity check did not use.
    reference = reference_module(payload, "raw", "logit")
    features1, features2 = parity_positions(8, seed=1234)
    for rows in (slice(0, 1), slice(1, 8)):
        policy, value = run_onnx(model_path, features1[rows], features2[rows])
        n = rows.stop - rows.start
        assert policy.shape == (n, 2187) and value.shape == (n,)
        expected_policy, expected_value = torch_outputs(reference, features1[rows], features2[rows])
        assert np.abs(policy - expected_policy).max() <= 1e-4
        assert np.abs(value - expected_value).max() <= 1e-4


@pytest.mark.parametrize("delta, caught", [(1e-3, True), (3e-5, False)])
def test_the_parity_check_catches_a_planted_mismatch_and_only_beyond_the_tolerance(
        smoke_export, tmp_path: Path, delta: float, caught: bool) -> None:
    checkpoint, model_path, _ = smoke_export
    model = onnx.load(str(model_path))
    plant_policy_bias_offset(model, delta)
    planted = tmp_path / "planted.onnx"
    onnx.save(model, str(planted))
    reference = reference_module(load_checkpoint(checkpoint), "raw", "logit")

    if caught:
        with pytest.raises(ParityError, match=r"is 0\.001 for policy and .* for value over 16 positions at "
                                              r"batch sizes 1 and 16 \(tolerance 0\.0001, fp32\)"):
            check_parity(planted, reference)
    else:
        result = check_parity(planted, reference)
        assert result.policy_max_abs_diff == pytest.approx(delta, rel=0.05)
        assert result.value_max_abs_diff <= 1e-6


def test_a_model_that_fails_the_check_is_left_under_failed_and_out_keeps_the_previous_one(
        template_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    real_to_onnx = onnx_export.to_onnx

    def faulty_exporter(module):
        model = real_to_onnx(module)
        plant_policy_bias_offset(model, 0.01)
        return model

    monkeypatch.setattr(onnx_export, "to_onnx", faulty_exporter)
    out = tmp_path / "model.onnx"
    out.write_bytes(b"the previous, good model")

    code = tideborn_main(["export", "--checkpoint", str(template_run / SMOKE_STEP), "--out", str(out)])

    assert code == 1
    line = assert_user_error(capsys.readouterr().err, r"^tideborn export: error: parity check failed: ")
    assert "is 0.01 for policy" in line and f"left at {out}.failed, not at {out}" in line
    assert out.read_bytes() == b"the previous, good model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.failed"]
    onnx.checker.check_model(onnx.load(str(tmp_path / "model.onnx.failed")))


# -- a 10x192 net with EMA weights, in process ------------------------------------------------------

@pytest.fixture(scope="module")
def ema_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A resnet10x192 checkpoint after 2 steps with an EMA (decay 0.5), saved by the trainer's own code."""
    run_dir = tmp_path_factory.mktemp("ema-run")
    # A small learning rate: at the default 0.1, two batch-4 steps already blow the logits up past 1e15.
    settings = load_settings(None, ['runtime.device="cpu"', "optim.batch_size=4", "optim.ema_decay=0.5",
                                    "optim.lr=0.001", 'data.kind="synthetic"'], {"network": "resnet10x192"},
                             environ={}, cwd=run_dir).settings
    state = TrainingState(settings, resolve_device(settings.runtime), DistEnv())
    state.restore(StartPoint())
    for _ in range(2):  # the first update copies the weights; the second makes the average differ
        state.train_step()
    return save_checkpoint(run_dir, 2, state.payload(2)).path


def test_a_10x192_checkpoint_exports_its_ema_weights_by_default(ema_checkpoint: Path, tmp_path: Path) -> None:
    payload = load_checkpoint(ema_checkpoint)
    out = tmp_path / "net.onnx"

    report = export_onnx(payload, out, value="probability")

    assert (report.weights, report.value, report.step, report.path) == ("ema", "probability", 2, out)
    assert report.policy_max_abs_diff <= 1e-4 and report.value_max_abs_diff <= 1e-4
    event = json.loads(json.dumps(report.event_fields()))
    assert event["weights"] == "ema" and event["bytes"] == out.stat().st_size > 10_000_000
    features1, features2 = parity_positions(5, seed=99)
    policy, value = run_onnx(out, features1, features2)
    assert ((0 <= value) & (value <= 1)).all()
    ema_policy, ema_value = torch_outputs(reference_module(payload, "ema", "probability"), features1, features2)
    raw_policy, _ = torch_outputs(reference_module(payload, "raw", "probability"), features1, features2)
    assert np.abs(policy - ema_policy).max() <= 1e-4 and np.abs(value - ema_value).max() <= 1e-4
    assert np.abs(raw_policy - ema_policy).max() > 1e-3, "the test cannot tell EMA from raw weights"
    metadata = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert metadata["tideborn.weights"] == "ema" and metadata["tideborn.value"] == "probability"
    assert json.loads(metadata["tideborn.settings"])["model"] == {"blocks": 10, "channels": 192, "activation": "relu",
                                                                 "value_channels": 27, "value_hidden": 256}


def test_weights_auto_means_ema_when_present_and_raw_otherwise() -> None:
    assert choose_weights({"ema": {"n_averaged": torch.tensor(1)}}) == "ema"
    assert choose_weights({"ema": None}) == choose_weights({}) == "raw"
    assert choose_weights({"ema": {"x": torch.zeros(1)}}, "raw") == "raw"
    with pytest.raises(ExportInputError, match=r"no EMA weights .* --weights raw"):
        choose_weights({"ema": None}, "ema")


# -- bad input --------------------------------------------------------------------------------------

class CreatesFile:
    """Unpickling this creates `marker`: what a hostile "checkpoint" would do, minus the harm."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def bad_checkpoint(kind: str, tmp_path: Path, template_run: Path) -> Path:
    path = tmp_path / "input" / "step-000000004.pt"
    path.parent.mkdir()
    if kind == "missing":
        return path
    if kind == "truncated":
        path.write_bytes((template_run / SMOKE_STEP).read_bytes()[:5000])
    elif kind == "text":
        path.write_text("step 4 notes\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "foreign":
        torch.save({"weights": torch.zeros(3)}, path)
    elif kind == "pickle":
        torch.save({"format": "tideborn-checkpoint", "model": CreatesFile(tmp_path / "marker")}, path)
    elif kind == "nan":
        payload = load_checkpoint(template_run / SMOKE_STEP)
        payload["model"]["tower.0.conv1.weight"][0, 0, 0, 0] = math.nan
        return save_checkpoint(path.parent, 4, payload).path
    else:
        path.write_bytes((template_run / SMOKE_STEP).read_bytes())
    return path


@pytest.mark.parametrize("kind, extra, pattern", [
    ("missing", [], r"\S+/input/step-000000004\.pt: no such checkpoint$"),
    ("truncated", [], r"\S+/input/step-000000004\.pt: corrupt or truncated checkpoint"),
    ("text", [], r"\S+/input/step-000000004\.pt: not a checkpoint \(neither a PyTorch zip archive nor a pickle "
                 r"stream\)$"),
    ("empty", [], r"\S+/input/step-000000004\.pt: empty file, not a checkpoint$"),
    ("foreign", [], r"\S+/input/step-000000004\.pt: not a tideborn checkpoint$"),
    ("pickle", [], r"\S+/input/step-000000004\.pt: refused: loading it would need pickle to run code"),
    ("nan", [], r"the checkpoint's raw weights hold NaN or inf \(in tower\.0\.conv1\.weight\)"),
    ("good", ["--weights", "ema"],
     r"this checkpoint holds no EMA weights .*; export its raw weights with --weights raw$"),
    ("good", ["--out", "{tmp}/no/such/dir/model.onnx"], r"--out \S+: directory \S+/no/such/dir does not exist$"),
    ("good", ["--out", "{checkpoint}"], r"--out .* is the checkpoint itself"),
    ("good", ["--value", "percent"], r"argument --value: invalid choice: 'percent'"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(kind: str, extra: list[str], pattern: str,
                                                         template_run: Path, tmp_path: Path, capsys) -> None:
    checkpoint = bad_checkpoint(kind, tmp_path, template_run)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = ["export", "--checkpoint", str(checkpoint), "--out", str(out_dir / "model.onnx")]
    args += [item.format(tmp=tmp_path, checkpoint=checkpoint) for item in extra]
    before = tree(tmp_path / "input")

    try:
        code = tideborn_main(args)
    except SystemExit as exit_:  # argparse's usage errors leave through SystemExit
        code = exit_.code

    assert code == 2
    assert_user_error(capsys.readouterr().err, r"^tideborn export: error: " + pattern)
    assert tree(out_dir) == {} and tree(tmp_path / "input") == before
    assert not (tmp_path / "marker").exists(), "the pickle payload ran"


def test_the_export_cli_parses_without_torch_and_the_docs_name_the_interface() -> None:
    code = "import json, sys, tideborn.export.cli, tideborn.export.interface; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       env=child_env()).stdout)
    assert "torch" not in loaded and "onnx" not in loaded
    docs = (REPO_ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    for name in (*INPUT_NAMES, *OUTPUT_NAMES, *METADATA_KEYS, "tideborn export", "scripts/gpu-check.sh"):
        assert f"`{name}" in docs, f"docs/export.md does not mention `{name}`"


def test_a_run_can_export_its_final_weights_at_the_end(tmp_path):
    from tests.helpers.common import events_of, train

    run_dir = tmp_path / "run"
    train(run_dir, "runtime.max_steps=2", "optim.batch_size=16", "runtime.export_onnx=true", cwd=tmp_path)
    events = events_of(run_dir)
    (exported,) = [e for e in events if e["kind"] == "export"]
    assert exported["path"] == str(run_dir / "step-000000002.onnx")
    assert exported["policy_max_abs_diff"] <= 1e-4 and exported["value_max_abs_diff"] <= 1e-4
    assert [e["kind"] for e in events][-1] == "run_finished"
    assert (run_dir / "step-000000002.onnx").stat().st_size == exported["bytes"]
