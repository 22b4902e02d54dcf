"""What the loop does beside training when a duty of `duties` is due: evaluate on held-out data, play a match
against the reference, export the weights (ONNX at the end, or for the engine during the run). Each reports in
the events and on stderr through the `Reporter` it is given, and none fails the run: a match that cannot be
played or an export that fails is a warning.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from tideborn.config.schema import Settings
from tideborn.data.decode.targets import value_lambda_at
from tideborn.errors import UserError
from tideborn.rundir.kinds import Eval, Export, Match, RunWarning
from tideborn.trainer.checkpointer import Checkpointer, Reporter
from tideborn.trainer.device import DeviceSetup
from tideborn.trainer.state import TrainingState


def evaluate(state: TrainingState, settings: Settings, setup: DeviceSetup, step: int, report: Reporter) -> None:
    """The `eval` event of step `step`: the held-out losses and accuracies, of the EMA weights too."""
    assert state.evaluator is not None
    started = time.perf_counter()
    # The plain module, not the DDP wrapper: only rank 0 evaluates, and DDP's forward may communicate.
    # While the value mix decays, the held-out value loss is taken at this step's mix, as training's is.
    mix = value_lambda_at(max(0, step - 1), settings.loss) if state.value_lambda_decays else None
    result = state.evaluator.run(state.model, setup.autocast, mix)
    if state.ema is not None:
        averaged = state.evaluator.run(state.ema.module, setup.autocast, mix)
        result["ema"] = {k: averaged[k] for k in ("policy_loss", "value_loss", "policy_accuracy", "value_accuracy")}
    result["seconds"] = time.perf_counter() - started
    report.emit(Eval, **result)
    value = result["value_accuracy"]
    report.say(
        f"eval at step {step}: policy loss {result['policy_loss']:.4f}, value loss "
        f"{result['value_loss']:.4f}, policy top-1 {result['policy_accuracy']:.1%} "
        f"(among legal moves {result['policy_accuracy_legal']:.1%}), value accuracy "
        f"{'n/a' if value is None else f'{value:.1%}'} ({result['positions']:,} positions)"
        + (f"; EMA policy top-1 {result['ema']['policy_accuracy']:.1%}" if "ema" in result else ""))


def play_match(saved: Path, checkpoints: Checkpointer, settings: Settings, device: torch.device, step: int,
               report: Reporter) -> None:
    """Play the checkpoint just saved against the reference and write a `match` event. A match that cannot be
    played (a reference that is missing or not a checkpoint) is a warning, not a failure: training goes on."""
    from tideborn.match.run import run_match

    runtime = settings.runtime
    try:
        reference = checkpoints.match_reference()
        # Building the two networks draws initial weights from torch's global generator; fork it so that
        # a run with matches trains exactly as one without, and resumes exactly (the checkpoint holds
        # the generator's state from before the match).
        with torch.random.fork_rng(devices=[]):
            played = run_match(saved, reference, games=runtime.match_games, parallel=runtime.match_games,
                               device=str(device), run_files=(True, not runtime.match_reference))
    except (UserError, OSError, ImportError) as exc:  # ImportError: an image without cshogi
        text = f"match at step {step} not played: {exc}"
        report.emit(RunWarning, message=text)
        report.say(text)
        return
    checkpoints.reference_played(played["second"]["step"], reference)
    report.emit(Match, checkpoint=str(saved), reference=str(reference), reference_step=played["second"]["step"],
                **{key: played[key] for key in ("games", "wins", "draws", "losses", "score", "los", "model",
                                                "seconds", "games_per_second")},
                **{key: unbounded(played, key) for key in ("elo", "elo_low", "elo_high")})
    report.say(f"match at step {step} vs step {played['second']['step']}: score {100 * played['score']:.1f}% over "
               f"{played['games']} games, Elo {elo_text(unbounded(played, 'elo'))} "
               f"[{elo_text(unbounded(played, 'elo_low'))}, {elo_text(unbounded(played, 'elo_high'))}]")


def export_final(state: TrainingState, step: int, checkpoint: Path, report: Reporter) -> None:
    """`runtime.export_onnx`: the final weights as ONNX beside the checkpoint, parity-checked. A failed
    export is a warning, not a failed run: the checkpoint is the source of truth and can be exported again."""
    from tideborn.export.onnx_export import export_onnx
    from tideborn.export.parity import ParityError

    target = checkpoint.with_suffix(".onnx")
    try:
        done = export_onnx(state.payload(step), target)
    except (ParityError, UserError, OSError) as exc:
        text = f"ONNX export to {target} failed: {' '.join(str(exc).split())}"
        report.emit(RunWarning, message=text)
        report.say(f"warning: {text}")
        return
    report.emit(Export, **done.event_fields())
    report.say(f"exported {done.weights} weights to {done.path} (parity max abs diff: policy "
               f"{done.policy_max_abs_diff:.1e}, value {done.value_max_abs_diff:.1e})")


def export_for_engine(state: TrainingState, step: int, run_dir: Path, keep: int, spiking: bool,
                      report: Reporter) -> None:
    """`runtime.export_every`: the weights for the engine in `export/`, `latest.onnx` replaced whole. Not
    while the watchdog counts gradient spikes (`spiking`: engines would play, and make data, with weights that
    may be exploding); a failure is a warning, and training goes on."""
    from tideborn.trainer.engine_export import EngineExportFailed
    from tideborn.trainer.engine_export import export_for_engine as export

    if spiking:
        _warn(report, f"step {step} not exported for the engine: the gradient norm is spiking "
                      "(settings: [watchdog]); latest.onnx keeps the model before")
        return
    try:
        done = export(state.payload(step), run_dir, keep)
    except EngineExportFailed as exc:
        _warn(report, str(exc))
        return
    report.emit(Export, **done.event_fields())
    for text in done.prune_problems:
        _warn(report, text)
    report.say(f"exported step {step}'s {done.report.weights} weights for the engine: {done.latest} (parity max "
               f"abs diff: policy {done.report.policy_max_abs_diff:.1e}, value {done.report.value_max_abs_diff:.1e})")


def _warn(report: Reporter, text: str) -> None:
    report.emit(RunWarning, message=text)
    report.say(text)


def unbounded(report: dict, key: str) -> float:
    """The match report's Elo figure, its JSON null (an infinite one, at a 0% or 100% score) as +-inf again: the
    event writes it as "inf"/"-inf", which readers take back with `as_float`."""
    value = report[key]
    if value is not None:
        return value
    score = report["score"]
    if key in ("elo", "elo_low"):
        return math.inf if score >= 1 else -math.inf
    return -math.inf if score <= 0 else math.inf


def elo_text(value: float) -> str:
    return f"{value:+.0f}" if math.isfinite(value) else ("+inf" if value > 0 else "-inf")
