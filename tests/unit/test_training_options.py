"""Training options after dlshogi's train.py and KataGo's gradient watch: the value-target mix decaying by step,
the eval scale fitted per file (evalfix), the entropy bonus, the weight-decay policy, the eval event's
entropies and legal-move top-1, and the gradient watchdog that halts an exploding run before it saves it.

Real parts throughout: real positions (cshogi), real record files, real tiny torch training, the real
`train` command and `train_run status`.
"""

from __future__ import annotations

import copy
import json
import math

import cshogi
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cshogi.dlshogi import make_move_label

from tests.helpers.common import (
    EXPLODING,
    SMOKE_CONFIG,
    events_of,
    settings_args,
    step_events,
    train,
    trainer_in_process,
)
from tests.helpers.data import hcpe_records, psv_records, random_positions, settings_for, write_records
from tideborn.config.load import load_settings
from tideborn.config.schema import LossSettings, WatchdogSettings
from tideborn.data.decode.features import Decoder
from tideborn.data.decode.targets import value_lambda_at
from tideborn.data.formats.records import RecordSet
from tideborn.data.sets.evalfix import fit_files, fit_scale, scales_by_file
from tideborn.data.sets.sources import BatchDecoder, as_source
from tideborn.data.training.loader import decode_indices
from tideborn.errors import UserError
from tideborn.network.model import build_model
from tideborn.network.optim import build_optimizer
from tideborn.trainer.device import resolve_device
from tideborn.trainer.evaluation import Evaluator
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.state import TrainingState, teacher_batches
from tideborn.trainer.synthetic import SyntheticBatches
from tideborn.trainer.watchdog import GradientJudge

CPU = torch.device("cpu")


def logistic_records(count: int, scale: float, seed: int) -> np.ndarray:
    """hcpe records of real positions whose results follow `P(side to move wins) = sigmoid(eval / scale)`."""
    records = hcpe_records(random_positions(min(count, 600), seed=seed), seed=seed)
    records = np.resize(records, count)  # the positions repeat; evals and results are drawn afresh
    rng = np.random.default_rng(seed)
    evals = np.clip(rng.normal(0, 900, count).round(), -29_000, 29_000)
    wins = rng.random(count) < 1 / (1 + np.exp(-evals / scale))
    turn = records["hcp"][:, 0] & 1  # the first bit of an hcp is the side to move
    to_move_color = np.where(turn == 0, cshogi.BLACK_WIN, cshogi.WHITE_WIN)
    other_color = np.where(turn == 0, cshogi.WHITE_WIN, cshogi.BLACK_WIN)
    records["eval"] = evals
    records["gameResult"] = np.where(wins, to_move_color, other_color)
    return records


# -- the value target: lambda by step -----------------------------------------------------------------

def test_value_lambda_decays_linearly_by_step_to_its_final_value():
    loss = LossSettings(value_lambda=0.4, value_lambda_final=0.1, value_lambda_decay_steps=3)
    assert [value_lambda_at(step, loss) for step in range(6)] == pytest.approx([0.4, 0.3, 0.2, 0.1, 0.1, 0.1])
    # dlshogi's schedule (to 0 over --val_lambda_decay_epoch), one step per epoch
    dlshogi = LossSettings(value_lambda=0.333, value_lambda_final=0.0, value_lambda_decay_steps=4)
    assert [value_lambda_at(e, dlshogi) for e in range(6)] == pytest.approx(
        [max(0, 0.333 * (1 - e / 4)) for e in range(6)])
    assert value_lambda_at(10**6, LossSettings(value_lambda=0.333)) == 0.333  # no decay by default
    for bad in ("loss.value_lambda_decay_steps=-1", "loss.value_lambda_final=1.5"):
        with pytest.raises(UserError, match=bad.split("=")[0].replace(".", r"\.")):
            load_settings(None, [bad], environ={})


@pytest.fixture(scope="module")
def decaying_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("decay")
    write_records(root / "train.hcpe", logistic_records(256, 600.0, seed=5))
    return root


def test_training_mixes_the_value_target_with_the_steps_lambda(decaying_files):
    settings = settings_for(decaying_files, "loss.value_lambda=0.6", "loss.value_lambda_final=0.0",
                            "loss.value_lambda_decay_steps=2", "runtime.device=\"cpu\"", "optim.lr=0.01",
                            train=["train.hcpe"])
    state = TrainingState(settings, resolve_device(settings.runtime), DistEnv())
    state.restore(StartPoint())
    twin = teacher_batches(settings, CPU)  # the same batches in the same order, to recompute each loss
    try:
        for step, mix in enumerate([0.6, 0.3, 0.0, 0.0]):
            batch = twin.next_batch()
            model = copy.deepcopy(state.model).train()
            with torch.no_grad():
                _, value_logit = model(batch.features1, batch.features2)
            target = (1 - mix) * batch.result + mix * batch.eval_value
            expected = F.binary_cross_entropy_with_logits(value_logit, target).item()
            fixed = F.binary_cross_entropy_with_logits(value_logit, batch.value).item()  # lambda 0.6 throughout
            got = state.train_step(step).losses[2].item()
            assert got == pytest.approx(expected, rel=1e-5), f"step {step}"
            if step > 0:
                assert abs(got - fixed) > 1e-4, "the decayed mix must differ from the fixed one"
    finally:
        state.close()
        twin.close()


def test_a_decaying_run_logs_its_lambda_and_resumes_exactly(decaying_files, tmp_path):
    sets = (f"paths.data_root={str(decaying_files)!r}", 'data.train=["train.hcpe"]', 'data.kind="hcpe"',
            "data.workers=0", "loss.value_lambda=0.6", "loss.value_lambda_decay_steps=4", "runtime.max_steps=6",
            "runtime.log_every=1", "runtime.checkpoint_every=3", "optim.batch_size=16")
    straight, pieces = tmp_path / "straight", tmp_path / "pieces"
    train(straight, *sets, cwd=tmp_path)
    train(pieces, *sets, cwd=tmp_path, extra=("--stop-at-step", "3"))
    train(pieces, *sets, cwd=tmp_path)
    steps = step_events(events_of(straight))
    assert [e["value_lambda"] for e in steps] == pytest.approx([0.6, 0.45, 0.3, 0.15, 0.0, 0.0])

    def losses(run_dir):
        return {e["step"]: e["loss"] for e in step_events(events_of(run_dir))}

    assert losses(pieces) == losses(straight) and len(losses(straight)) == 6


def test_default_value_target_is_the_old_formula_bit_for_bit():
    records = hcpe_records(random_positions(40, seed=2), seed=2)
    settings = load_settings(None, [], environ={}).settings
    assert settings.data.eval_scale == 756.0864962951762 == 1 / 0.0013226  # dlshogi's score_to_value
    decoded = Decoder("hcpe", settings.data.eval_scale, settings.loss.value_lambda).decode(records)
    evals = records["eval"].astype(np.float32).astype(np.float64)
    old = ((1 - 0.333) * decoded.result.astype(np.float64) + 0.333 / (1 + np.exp(-evals / 756.0864962951762)))
    assert decoded.value.tobytes() == old.astype(np.float32).tobytes()
    sigmoid = (1 / (1 + np.exp(-evals / 756.0864962951762))).astype(np.float32)
    assert decoded.eval_value.tobytes() == sigmoid.tobytes()


# -- evalfix --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [350.0, 756.0865, 1500.0])
def test_the_fit_recovers_a_known_scale(scale):
    rng = np.random.default_rng(int(scale))
    evals = rng.normal(0, 900, 60_000).round()
    results = (rng.random(evals.size) < 1 / (1 + np.exp(-evals / scale))).astype(np.float32)
    evals[:500] = 31_000  # mate scores: left out, as dlshogi leaves them out
    results[:500] = 0.0
    fitted, problem = fit_scale(evals, results)
    assert problem is None and fitted == pytest.approx(scale, rel=0.05)
    assert fit_scale(np.zeros(1000), results[:1000]) == (None, "every eval is 0")
    assert fit_scale(evals[:1000], np.full(1000, 0.5))[0] is None  # draws only: nothing to fit


@pytest.fixture(scope="module")
def evalfix_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalfix")
    write_records(root / "sharp.hcpe", logistic_records(20_000, 400.0, seed=11))
    write_records(root / "flat.hcpe", logistic_records(20_000, 1600.0, seed=12))
    flat_evals = logistic_records(600, 900.0, seed=13)
    flat_evals["eval"] = 0  # converted game records carry no eval: nothing to fit
    write_records(root / "noeval.hcpe", flat_evals)
    write_records(root / "test.hcpe", logistic_records(300, 700.0, seed=14))
    return root


def test_per_file_scales_are_fitted_and_used_by_the_decoder(evalfix_files):
    settings = settings_for(evalfix_files, "data.eval_scale_fit=\"per_file\"",
                            train=["sharp.hcpe", "flat.hcpe", "noeval.hcpe"])
    records = RecordSet([evalfix_files / name for name in ("sharp.hcpe", "flat.hcpe", "noeval.hcpe")], "hcpe")
    fits = fit_files(records, settings.data.eval_scale)
    assert fits[0].scale == pytest.approx(400.0, rel=0.1) and fits[0].problem is None
    assert fits[1].scale == pytest.approx(1600.0, rel=0.1) and fits[1].problem is None
    assert fits[2].scale == settings.data.eval_scale and fits[2].problem == "every eval is 0"
    indices = np.array([5, 20_005, 40_005])  # one record of each file
    decoder = BatchDecoder(settings.data.eval_scale, settings.loss.value_lambda, file_scales=scales_by_file(fits))
    item = decode_indices(as_source(records), decoder, indices)
    evals = records.read(indices)["eval"].astype(np.float64)
    scales = np.array([fit.scale for fit in fits])
    assert item["eval_value"] == pytest.approx(1 / (1 + np.exp(-evals / scales)), rel=1e-6)
    batches = teacher_batches(settings, CPU)
    try:
        assert [fit.scale for fit in batches.scale_fits] == [fit.scale for fit in fits]
    finally:
        batches.close()


def test_psv_files_are_fitted_from_their_scores_and_side_to_move_results(tmp_path):
    records = psv_records(random_positions(600, seed=31), seed=31)
    records = np.resize(records, 20_000)
    rng = np.random.default_rng(31)
    records["score"] = np.clip(rng.normal(0, 900, records.size).round(), -29_000, 29_000)
    wins = rng.random(records.size) < 1 / (1 + np.exp(-records["score"] / 500.0))
    records["game_result"] = np.where(wins, 1, -1)  # psv results are the side to move's already
    write_records(tmp_path / "a.bin", records)
    (fit,) = fit_files(RecordSet([tmp_path / "a.bin"], "psv"), 756.0)
    assert fit.problem is None and fit.scale == pytest.approx(500.0, rel=0.1) and fit.positions == 20_000


def test_a_run_logs_each_files_scale_and_warns_of_a_file_it_cannot_fit(evalfix_files, tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, f"paths.data_root={str(evalfix_files)!r}", 'data.train=["sharp.hcpe", "flat.hcpe", "noeval.hcpe"]',
          'data.test=["test.hcpe"]', 'data.kind="hcpe"', 'data.eval_scale_fit="per_file"', "data.workers=0",
          "runtime.max_steps=2", "runtime.eval_every=2", "optim.batch_size=16", cwd=tmp_path)
    events = events_of(run_dir)
    scales = events[0]["eval_scales"]
    assert events[0]["kind"] == "run_started"
    assert scales[str(evalfix_files / "sharp.hcpe")] == pytest.approx(400.0, rel=0.1)
    assert scales[str(evalfix_files / "flat.hcpe")] == pytest.approx(1600.0, rel=0.1)
    assert scales[str(evalfix_files / "noeval.hcpe")] == 756.0864962951762
    assert scales[str(evalfix_files / "test.hcpe")] == pytest.approx(700.0, rel=0.35)  # 300 records only
    warnings = [e["message"] for e in events if e["kind"] == "warning"]
    assert any(str(evalfix_files / "noeval.hcpe") in text and "every eval is 0" in text for text in warnings)
    (evaluation,) = [e for e in events if e["kind"] == "eval"]
    assert evaluation["policy_accuracy_legal"] >= evaluation["policy_accuracy"]
    assert 0 < evaluation["policy_entropy"] <= math.log(2187) + 1e-6
    assert 0 < evaluation["value_entropy"] <= math.log(2) + 1e-6


# -- the policy loss: entropy bonus, eval figures, weight decay -----------------------------------------

def test_the_entropy_bonus_lowers_the_loss_by_beta_times_the_policy_entropy(tmp_path):
    losses = {}
    for beta in (0.0, 0.5):
        settings = load_settings(SMOKE_CONFIG, [f"optim.policy_entropy_beta={beta}", "optim.batch_size=16"],
                                 environ={}).settings
        state = TrainingState(settings, resolve_device(settings.runtime), DistEnv())
        state.restore(StartPoint())
        initial = copy.deepcopy(state.model)
        losses[beta] = state.train_step(0).losses.tolist()
        weights = torch.cat([p.detach().flatten() for p in state.model.parameters()])
        losses[beta].append(weights)
    batch = SyntheticBatches(settings.runtime.seed, 16, CPU).make(0)
    with torch.no_grad():
        logits, _ = initial.train()(batch.features1, batch.features2)
    log_p = F.log_softmax(logits, dim=1)
    entropy = -(log_p.exp() * log_p).sum(dim=1).mean().item()
    assert losses[0.5][1:3] == losses[0.0][1:3]  # the policy and value losses themselves are unchanged
    assert losses[0.5][0] == pytest.approx(losses[0.0][0] - 0.5 * entropy, rel=1e-6)
    assert not torch.equal(losses[0.5][3], losses[0.0][3])  # and the bonus's gradient moved the weights


class TableModel(torch.nn.Module):
    """Returns the rows of fixed tables, batch after batch, as the evaluator asks for them in order."""

    def __init__(self, policy: torch.Tensor, value: torch.Tensor):
        super().__init__()
        self.policy, self.value, self.at = policy, value, 0
        self.unused = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x1, x2):
        n = x1.shape[0]
        rows = slice(self.at, self.at + n)
        self.at += n
        return self.policy[rows], self.value[rows]


def test_eval_reports_entropies_and_top1_among_legal_moves_on_a_constructed_case(tmp_path):
    positions = random_positions(24, seed=21)
    write_records(tmp_path / "test.hcpe", hcpe_records(positions, seed=21))
    settings = settings_for(tmp_path, train=["test.hcpe"], test=["test.hcpe"])
    evaluator = Evaluator(settings, CPU, batch_size=7, records=RecordSet([tmp_path / "test.hcpe"], "hcpe"))
    board = cshogi.Board()
    policy = torch.zeros(24, 2187)
    for i, (sfen, move) in enumerate(positions):
        board.set_sfen(sfen)
        legal = {make_move_label(m, board.turn) for m in board.legal_moves}
        played = make_move_label(move, board.turn)
        illegal = next(label for label in range(2187) if label not in legal)
        policy[i, played] = 3.0
        if i % 3:  # two in three: an illegal move scores highest, so the raw top-1 misses and the legal one hits
            policy[i, illegal] = 5.0
    value = torch.linspace(-3, 3, 24)
    result = evaluator.run(TableModel(policy, value))
    assert result["policy_accuracy"] == pytest.approx(8 / 24)
    assert result["policy_accuracy_legal"] == 1.0
    p = torch.softmax(policy.double(), dim=1)
    assert result["policy_entropy"] == pytest.approx(-(p * p.log()).sum(dim=1).mean().item(), rel=1e-5)
    q = torch.sigmoid(value.double())
    assert result["value_entropy"] == pytest.approx(-(q * q.log() + (1 - q) * (1 - q).log()).mean().item(), rel=1e-5)


@pytest.mark.parametrize("policy", ["weights_only", "all"])
def test_the_weight_decay_policy_chooses_which_parameters_decay(policy):
    settings = load_settings(SMOKE_CONFIG, [f"optim.weight_decay_policy=\"{policy}\"", "optim.weight_decay=0.01"],
                             environ={}).settings
    model = build_model(settings.model)
    optimizer = build_optimizer(model, settings.optim)
    decay_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    for name, param in model.named_parameters():
        shrinks = policy == "all" or param.ndim > 1  # dlshogi decays every parameter; tideborn, weights only
        assert decay_of[id(param)] == (0.01 if shrinks else 0.0), name
    batch_norm = [p for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters()]
    assert batch_norm and all(decay_of[id(p)] == (0.01 if policy == "all" else 0.0) for p in batch_norm)
    with pytest.raises(UserError, match=r"optim\.weight_decay_policy"):
        load_settings(None, ['optim.weight_decay_policy="bn"'], environ={})


# -- the gradient watchdog ---------------------------------------------------------------------------------

def test_the_judge_needs_consecutive_spikes_after_warmup_and_stops_at_once_on_a_non_finite_norm():
    judge = GradientJudge(WatchdogSettings(window=5, factor=10, consecutive=2, warmup_steps=3))
    norms = [5.0, 900.0, 4.0, 6.0, 100.0, 5.0, 70.0, 80.0]  # 900 is before it is armed; 100 alone is a bad batch
    trips = [judge.feed(step, norm) for step, norm in enumerate(norms, start=1)]
    assert trips[:-1] == [None] * 7
    assert trips[-1].reason == "grad_norm_spike" and trips[-1].trip_step == 8
    assert trips[-1].spikes == [[7, 70.0], [8, 80.0]] and trips[-1].median == 5.0
    assert GradientJudge(WatchdogSettings()).feed(1, math.inf).reason == "nonfinite_grad_norm"
    assert GradientJudge(WatchdogSettings(), nonfinite_is_skipped=True).feed(1, math.nan) is None  # fp16 scaler


@pytest.fixture(scope="module")
def exploded(tmp_path_factory):
    """A run whose loss explodes under a huge learning rate, halted by the watchdog: (run_dir, its output)."""
    work = tmp_path_factory.mktemp("exploded")
    run_dir = work / "run"
    return run_dir, train(run_dir, *EXPLODING, cwd=work, expect_rc=1)


def test_the_watchdog_halts_an_exploding_run_before_it_saves_the_broken_weights(exploded, capsys):
    from tideborn.tools.train_run import main as train_run

    run_dir, result = exploded
    events = events_of(run_dir)
    (trip,) = [e for e in events if e["kind"] == "watchdog"]
    assert trip["reason"] == "grad_norm_spike" and trip["consecutive"] == 3
    assert trip["grad_norm"] > 10 * trip["median"]
    assert [s[0] for s in trip["spikes"]] == [trip["trip_step"] - 2, trip["trip_step"] - 1, trip["trip_step"]]
    assert events[-1]["kind"] == "run_failed" and "gradient watchdog" in events[-1]["error"]
    saved = [e["step"] for e in events if e["kind"] == "checkpoint_saved"]
    assert saved == [2] and trip["spikes"][0][0] == 2  # saved before the trip, but after the first spike's update
    assert not list(run_dir.glob("step-*.pt"))  # so it is no resume point: moved aside, not deleted
    (moved,) = run_dir.glob("archive/watchdog-*/step-000000002.pt")
    assert any(e["kind"] == "warning" and "step-000000002.pt" in e["message"] for e in events)
    assert "no healthy checkpoint to resume from yet" in events[-1]["error"] and events[-1]["resume_from"] is None
    assert "gradient watchdog" in result.stdout
    norms = [n for e in step_events(events) for n in e["grad_norms"]]
    assert len(norms) == trip["step"]  # every step's norm is in the events

    code = train_run(["status", "--out-dir", str(run_dir), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["state"] == "failed"
    rules = [a["rule"] for a in report["anomalies"]]
    assert "gradient" in rules and "run_failed" in rules
    (gradient,) = [a for a in report["anomalies"] if a["rule"] == "gradient"]
    assert gradient["evidence"]["step"] == trip["trip_step"]
    code = train_run(["status", "--out-dir", str(run_dir)])
    assert "! gradient: gradient norm" in capsys.readouterr().out
    assert train_run(["watch", "--out-dir", str(run_dir)]) == 1  # the run has ended: watch prints it all and exits
    streamed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert any(e["kind"] == "anomaly" and e["rule"] == "gradient" for e in streamed)


def test_a_trip_between_step_events_is_caught_before_the_checkpoint_and_the_last_good_one_survives(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, *EXPLODING, "runtime.log_every=50", "runtime.checkpoint_every=1", "runtime.keep_checkpoints=1",
          cwd=tmp_path, expect_rc=1)
    events = events_of(run_dir)
    kinds = [(e["kind"], e["step"]) for e in events if e["kind"] != "run_started"]
    assert kinds == [("checkpoint_saved", 1), ("checkpoint_saved", 2), ("checkpoint_saved", 3), ("step", 4),
                     ("watchdog", 4), ("warning", 4), ("run_failed", 4)]
    assert len(step_events(events)[0]["grad_norms"]) == 4  # the window's norms are written before it halts
    # keep_checkpoints=1, but saves during the spikes pruned nothing: step 1, before them, is the resume point
    assert [e["pruned"] for e in events if e["kind"] == "checkpoint_saved"] == [[], [], []]
    assert sorted(p.name for p in run_dir.glob("step-*.pt")) == ["step-000000001.pt"]
    assert sorted(p.name for p in run_dir.glob("archive/watchdog-*/*.pt")) == ["step-000000002.pt",
                                                                               "step-000000003.pt"]
    assert str(run_dir / "step-000000001.pt") in events[-1]["error"]
    resumed = train(run_dir, *EXPLODING, "watchdog.enabled=false", "optim.lr=0.01", cwd=tmp_path)
    assert f"resuming from {run_dir / 'step-000000001.pt'}" in resumed.stdout


async def test_the_monitor_shows_the_watchdogs_halt_as_its_own_rule(exploded):
    from tideborn.tui.app import create_app
    from tideborn.tui.options import TuiOptions
    from tideborn.tui.widgets.anomalies import AnomalyList

    run_dir, _ = exploded
    app = create_app(TuiOptions(run_dir=run_dir, use_nvml=False, follow=False))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(500):
            pane = pilot.app.screen.query("#anomalies")
            if pane and any(a.rule == "gradient" for a in pane.first(AnomalyList).anomalies):
                break
            await pilot.pause(0.02)
        pane = pilot.app.screen.query_one("#anomalies", AnomalyList)
        (gradient,) = [a for a in pane.anomalies if a.rule == "gradient"]
        prompt = pane._prompt(gradient).plain
    assert " gradient: gradient norm " in prompt and "the watchdog halted the run" in prompt
    assert "reason=\"grad_norm_spike\"" in prompt


def test_with_the_watchdog_off_the_same_run_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, *EXPLODING, "watchdog.enabled=false", cwd=tmp_path)
    events = events_of(run_dir)
    assert events[-1]["kind"] == "run_finished" and not [e for e in events if e["kind"] == "watchdog"]
    assert max(e["grad_norm_max"] for e in step_events(events)) > 1e6  # it did explode


def test_a_non_finite_gradient_norm_halts_the_run_with_the_default_thresholds(tmp_path):
    run_dir = tmp_path / "run"
    result = trainer_in_process("train", *settings_args(run_dir, "optim.lr=10000", "optim.warmup_steps=0",
                                                 'optim.schedule="constant"', "runtime.max_steps=20",
                                                 "runtime.log_every=5"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    events = events_of(run_dir)
    (trip,) = [e for e in events if e["kind"] == "watchdog"]
    assert trip["reason"] == "nonfinite_grad_norm"
    assert "non-finite gradient norm" in events[-1]["error"]
    assert not list(run_dir.glob("step-*.pt"))


