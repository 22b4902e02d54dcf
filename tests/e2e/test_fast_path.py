"""The fast path as far as a CPU goes: bf16 autocast trains with finite losses, and the GPU check's
code path (`benchmarks.gpu`) runs in its CPU form and writes its figures. Speed itself is a
benchmark (`scripts/gpu-check.sh`), never a test."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu as bench_gpu
from benchmarks import gpu_runs
from tests.helpers.common import REPO_ROOT, child_env, describe, events_of, step_events, terminal_events, train
from tideborn.rundir.kinds import as_float


def test_bf16_autocast_trains_on_the_cpu_with_finite_falling_losses(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, 'runtime.precision="bf16"', "runtime.max_steps=6", "runtime.log_every=1",
          "optim.batch_size=32", "runtime.progress=plain", cwd=tmp_path)

    events = events_of(run_dir)
    started = next(e for e in events if e["kind"] == "run_started")
    assert started["precision"] == "bf16" and started["device"] == "cpu, bf16, channels_last"
    losses = [as_float(e["loss"]) for e in step_events(events)]
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0], losses
    assert [e["kind"] for e in terminal_events(events)] == ["run_finished"]


# What a stock PyTorch image (the lent GPU machines' among them) lacks of the project's dependencies.
NOT_ON_A_PYTORCH_IMAGE = ("cshogi", "tomlkit", "textual", "watchfiles")


def test_the_gpu_check_runs_its_cpu_version_and_writes_json_and_markdown(tmp_path: Path) -> None:
    # Through the script, as on a GPU machine, with the packages a PyTorch image lacks made unimportable
    # (in the smoke run's own process too): the check must need only torch, numpy and psutil.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        f"import sys\nfor name in {NOT_ON_A_PYTORCH_IMAGE!r}:\n    sys.modules[name] = None\n")
    env = child_env({"PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join([str(blocker), str(REPO_ROOT)])})
    probe = subprocess.run([sys.executable, "-c", "import cshogi"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "cshogi" in probe.stderr, describe(probe)

    out = tmp_path / "gpu-check"
    script = REPO_ROOT / "scripts" / "gpu-check.sh"
    result = subprocess.run(["bash", str(script), str(out), "--device", "cpu", "--quick"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, describe(result)

    results = json.loads((out / "results.json").read_text())
    assert results["finished"] is True
    # Few, flat files: a lent GPU machine hands back at most eight.
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md", "smoke-events.jsonl",
                                                     "smoke-train.log"]
    assert "run_finished" in (out / "smoke-events.jsonl").read_text()
    assert "cshogi is not installed" in results["teacher"]["skipped"]  # said, not silently left out
    assert "## Teacher-data run" in (out / "results.md").read_text()
    smoke = results["smoke"]
    assert (smoke["exit_code"], smoke["terminal"], smoke["steps"]) == (0, "run_finished", 20)
    assert smoke["device_used"] == "cpu, fp32, channels_last"
    assert results["models"]["resnet2x32"]["flops_per_position"] > 0
    rows = {row["variant"]: row for row in results["sweep"]}
    assert set(rows) == {"default", "bf16"}
    for row in rows.values():
        assert row["status"] == "ok" and row["model"] == "resnet2x32" and row["batch_size"] == 32
        assert row["min"] <= row["positions_per_second"] <= row["max"] and row["min"] > 0
        assert len(row["reps"]) == 3 and math.isfinite(row["final_loss"])
        assert row["mfu"] is None  # no peak FLOP/s for a CPU unless --peak-tflops gives one

    markdown = (out / "results.md").read_text()
    assert "## Smoke run" in markdown and "terminal event `run_finished`" in markdown
    assert "### resnet2x32" in markdown and "| 32 | default |" in markdown and "| 32 | bf16 |" in markdown
    assert "## Switch effects" in markdown


def test_a_configuration_that_does_not_fit_the_budget_is_listed_as_skipped(tmp_path: Path, capsys) -> None:
    code = bench_gpu.main(["--device", "cpu", "--skip-smoke", "--budget-seconds", "0", "--peak-tflops", "1",
                           "--out", str(tmp_path)])

    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["variant"], r["status"]) for r in results["sweep"]] == [("default", "skipped"), ("bf16", "skipped")]
    assert results["sweep"][0]["reason"].startswith("time budget")
    assert results["device"]["peak_bf16_flops"] == 1e12 and results["device"]["peak_source"] == "--peak-tflops"
    assert "| 32 | default | skipped | time budget" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H200", 989), ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA A10", 125), ("NVIDIA GeForce RTX 4070 Ti", 80), ("NVIDIA GeForce RTX 4070 Ti SUPER", 88),
    ("NVIDIA GeForce RTX 4090", 165), ("Some Future GPU", None),
])
def test_mfu_uses_the_dense_bf16_peak_of_the_named_gpu(name: str, tflops: int | None) -> None:
    peak, _ = bench_gpu.peak_flops(name)
    assert peak == (tflops * 1e12 if tflops else None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_the_gpu_check_without_cuda_says_so_in_one_line(tmp_path: Path, capsys) -> None:
    assert bench_gpu.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_gpu: error: CUDA is not available") and "--device cpu" in err
    assert len(err.splitlines()) == 1 and not any(tmp_path.iterdir())


def test_compile_time_is_reported_as_an_event(tmp_path):
    """With CUDA graphs asked for (runtime.compile_mode), which the CPU leaves out: the step marks its start
    for them, and the run trains as with the default mode."""
    from tests.helpers.common import events_of, train

    run_dir = tmp_path / "run"
    # in a process of its own: torch.compile's caches and settings would stay behind in the test process
    train(run_dir, "runtime.max_steps=2", "optim.batch_size=8", "runtime.compile=true",
          'runtime.compile_mode="reduce-overhead"', cwd=tmp_path, process=True)
    (compiled,) = [e for e in events_of(run_dir) if e["kind"] == "compile"]
    assert compiled["step"] == 1 and compiled["first_step_seconds"] > 0
    assert events_of(run_dir)[-1]["kind"] == "run_finished"


@pytest.mark.parametrize("capability, requested, expected", [
    ((9, 0), "auto", "bf16"), ((8, 6), "auto", "bf16"), ((7, 0), "auto", "fp16"), ((6, 1), "auto", "fp32"),
    ((8, 0), "bf16", "bf16"), ((7, 5), "fp16", "fp16"),
    ((7, 5), "bf16", 'runtime.precision="bf16": GPU 1 has no native bf16'),
])
def test_auto_precision_takes_bf16_only_where_the_training_gpu_has_it_natively(
        monkeypatch, capability: tuple[int, int], requested: str, expected: str) -> None:
    # The choice itself, with the CUDA queries answered as a two-GPU machine would (no GPU here; the real
    # CUDA path runs in scripts/gpu-check.sh). GPU 0 is always Hopper: the answer must come from the
    # training device, cuda:1, not from the current device.
    from tideborn.config.schema import RuntimeSettings
    from tideborn.errors import UserError
    from tideborn.trainer.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"GPU {torch.device(device).index}")
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: capability if torch.device(device).index == 1 else (9, 0))
    runtime = RuntimeSettings(device="cuda:1", precision=requested)
    if expected.startswith("runtime."):
        with pytest.raises(UserError, match=expected):
            resolve_device(runtime)
    else:
        assert resolve_device(runtime).precision == expected


def test_the_sweep_measures_the_defaults_first_then_every_switch_at_the_middle_batch() -> None:
    plan = bench_gpu.Plan("cuda", ("resnet10x192", "resnet20x256"), (256, 1024, 2048), reps=5, warmup_steps=3,
                          rep_seconds=0.3, budget_seconds=400)
    order = [(model, batch, variant.name) for model, batch, variant in bench_gpu.schedule(plan)]
    assert order[:6] == [(m, b, "default") for m in plan.models for b in plan.batch_sizes]
    cuda_flips = [v.name for v in bench_gpu.variants()[1:] if "cuda" in v.devices]
    assert order[6:6 + len(cuda_flips)] == [("resnet10x192", 1024, name) for name in cuda_flips]
    assert {"no channels_last", "no fused_optimizer", "compile", "clip + ema", "fp16"} <= set(cuda_flips)
    # Every switch at every size, except the production-setting checks, which run at the middle size only.
    middle_only = {v.name for v in bench_gpu.variants() if v.middle_batch_only}
    for model in plan.models:
        for name in cuda_flips:
            sizes = sorted(b for m, b, n in order if (m, n) == (model, name))
            assert sizes == ([1024] if name in middle_only else [256, 1024, 2048]), (model, name)
    assert len(order) == len(set(order))


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GPU check's real runs in their CPU form, made once for the tests that read them: the teacher run, an
    hcpe3 run, the resume check (bit for bit on the CPU, deterministic kernels or not), a match between the
    teacher run's checkpoints, the loader alone."""
    out = tmp_path_factory.mktemp("gpu-check") / "out"
    # A budget far above what the runs take: each run's time limit is a share of what is left of it, and on a
    # busy machine the default's share left the match too little.
    with pytest.MonkeyPatch.context() as env:
        # Its processes on one CPU thread, as the suite's others (`child_env`): `match` keeps torch's thread per
        # core, and on a busy 2-core machine its second thread spun in every layer, several times the CPU of one.
        env.setenv("OMP_NUM_THREADS", "1")
        env.setenv("MKL_NUM_THREADS", "1")
        code = bench_gpu.main(["--device", "cpu", "--quick", "--budget-seconds", "1500", "--out", str(out),
                               "--runs", "teacher", "hcpe3", "resume", "match", "loader",
                               "--variants", "deterministic"])
    assert code == 0, f"exit {code}: {(out / 'results.md').read_text() if (out / 'results.md').exists() else ''}"
    return out


def test_the_gpu_checks_teacher_data_run_trains_on_random_play_records(real_runs: Path) -> None:
    # The teacher path (decoding workers; on CUDA pinned memory and asynchronous copies) on hcpe records
    # of seeded random games, which the check writes itself where no game records are at hand.
    run = json.loads((real_runs / "results.json").read_text())["teacher"]
    assert (run["exit_code"], run["terminal"], run["steps"]) == (0, "run_finished", 60), run
    assert run["records"] > 10_000 and 0 <= run["data_wait_fraction"] < 1
    assert math.isfinite(run["final_loss"]) and run["final_loss"] < run["first_loss"]
    # Its two files, flat in the output folder, named after the run (teacher-wN: N decoding workers, the default).
    name = f"teacher-w{gpu_runs.default_workers()}"
    assert sorted(p.name for p in real_runs.iterdir() if p.name.startswith("teacher")) == [
        f"{name}-events.jsonl", f"{name}-train.log"]
    events = [json.loads(line) for line in (real_runs / f"{name}-events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["kind"] == "run_started")
    assert started["settings"]["data"]["kind"] == "hcpe" and started["settings"]["data"]["workers"] == 2
    # Every random-play record decodes: no record was skipped as illegal.
    assert not [e for e in events if e["kind"] == "warning"], [e for e in events if e["kind"] == "warning"]


def test_the_gpu_event_reads_other_gpus_through_nvml_only(monkeypatch) -> None:
    # torch.cuda.mem_get_info would create a CUDA context (half a GiB) on every GPU it is asked about: on
    # the other ranks' GPUs under torchrun. The event takes memory from NVML instead, and a figure NVML
    # cannot give is None (memory excepted on the training GPU, below). The CUDA queries are stubbed:
    # there is no GPU here; gpu-check runs the real ones.
    from types import SimpleNamespace

    from tideborn.trainer.gpu_stats import gpu_snapshot

    def no_nvml(index=None):
        raise RuntimeError("pynvml does not seem to be installed")

    def forbidden(*args, **kwargs):
        raise AssertionError("mem_get_info creates a CUDA context on the device it asks about")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=f"GPU {i}", total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "mem_get_info", forbidden)
    monkeypatch.setattr(torch.cuda, "device_memory_used", lambda i: (i + 1) * 2**30)
    for name in ("utilization", "temperature", "power_draw"):
        monkeypatch.setattr(torch.cuda, name, no_nvml)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 3)

    snapshot = gpu_snapshot(torch.device("cuda", 0))
    assert [d["memory_used_bytes"] for d in snapshot["devices"]] == [2**30, 2 * 2**30]
    assert all(d["memory_total_bytes"] == 80 * 2**30 for d in snapshot["devices"])
    assert all(d["utilization_percent"] is None and d["power_watts"] is None for d in snapshot["devices"])
    assert gpu_snapshot(torch.device("cpu")) is None

    # Without NVML: the training GPU (which has its context already) answers through CUDA; no other does.
    asked = []
    monkeypatch.setattr(torch.cuda, "device_memory_used", no_nvml)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: asked.append(i) or (30 * 2**30, 80 * 2**30))
    snapshot = gpu_snapshot(torch.device("cuda", 1))
    assert [d["memory_used_bytes"] for d in snapshot["devices"]] == [None, 50 * 2**30] and asked == [1]


def test_the_gpu_checks_real_runs_train_hcpe3_resume_exactly_and_time_a_match(real_runs: Path) -> None:
    # The runs that only a real process shows, in their CPU form: an hcpe3 run, the resume check (bit for bit on
    # the CPU, deterministic kernels or not), a match between the teacher run's checkpoints, the loader alone.
    out = real_runs
    results = json.loads((out / "results.json").read_text())
    hcpe3 = results["hcpe3"]
    assert (hcpe3["exit_code"], hcpe3["terminal"], hcpe3["steps"]) == (0, "run_finished", 60), hcpe3
    assert hcpe3["with_candidates"] > 0 and math.isfinite(hcpe3["final_loss"])

    resume = results["resume"]
    terminals = [run["terminal"] for run in resume["runs"].values()]
    assert terminals == ["run_finished", "run_finished", "run_stopped", "run_finished"], resume
    assert resume["resumed_vs_straight"]["steps_compared"] == resume["steps"] == 40
    assert resume["exact"] and resume["resumed_vs_straight"]["identical"], resume

    match = results["match"]["cpu"]
    assert "error" not in match, results["match"]
    assert match["games_per_second"] > 0 and match["moves"] > 0, results["match"]
    assert results["loader"][0]["batches_per_second"] > 0 and results["loader"][0]["pin_memory"] is False
    assert {row["variant"] for row in results["sweep"]} == {"default", "deterministic"}

    markdown = (out / "results.md").read_text()
    for section in ("## hcpe3 run", "## Resume", "## Match speed", "## The teacher loader alone"):
        assert section in markdown
    assert "Exact (every logged loss and the final weights bit for bit): **yes**" in markdown


def test_the_resume_comparison_tells_a_changed_loss_or_weight_from_an_identical_run() -> None:
    losses = {1: 8.5, 2: 8.25}
    weights = {"w": torch.ones(3), "steps": torch.tensor(2)}
    assert gpu_runs.compare(losses, dict(losses), weights, {k: v.clone() for k, v in weights.items()})["identical"]
    moved = gpu_runs.compare(losses, {1: 8.5, 2: 8.25 + 1e-6}, weights, weights)
    assert not moved["identical"] and moved["max_loss_difference"] == pytest.approx(1e-6)
    nudged = gpu_runs.compare(losses, losses, weights, {"w": torch.tensor([1.0, 1.0, 1.5]), "steps": torch.tensor(2)})
    assert not nudged["identical"] and nudged["max_weight_difference"] == 0.5


def test_deterministic_kernels_are_a_setting_that_a_later_trainer_turns_off_again() -> None:
    from tideborn.config.schema import RuntimeSettings
    from tideborn.trainer.device import DeviceSetup, apply_global_switches

    setup = DeviceSetup(torch.device("cpu"), "fp32", channels_last=False)
    threads = torch.get_num_threads()
    try:
        apply_global_switches(RuntimeSettings(deterministic=True, threads=threads), setup)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        apply_global_switches(RuntimeSettings(threads=threads), setup)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
