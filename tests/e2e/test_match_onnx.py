"""`tideborn match` with ONNX players and round robins: a checkpoint and its own export play identical games, an
ONNX model's value output is read as a logit or a probability as the model says (or as told), anything without
dlshogi's interface is one line and exit status 2, as is a net whose policy or value is not finite (from `match` and
`usi`), and several players are rated together by maximum likelihood."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from cshogi import CSA
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.common import assert_user_error, settings_args, trainer_in_process
from tideborn.export.engine_model import load_engine_model
from tideborn.export.onnx_export import export_onnx, reference_module
from tideborn.export.parity import parity_positions
from tideborn.match.cli import main as match_main
from tideborn.match.elo import elo_of_score
from tideborn.match.ratings import SCALE, fit_ratings
from tideborn.match.run import run_match
from tideborn.network.checkpoint import load_checkpoint
from tideborn.usi.cli import main as usi_main


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two checkpoints of a 2x32 smoke run (steps 2 and 4) and step 4 exported twice: value as a logit and
    as a probability; and the probability export again without its tideborn metadata, as another's net."""
    root = tmp_path_factory.mktemp("onnxmatch")
    run_dir = root / "run"
    result = trainer_in_process("train", *settings_args(run_dir, "runtime.max_steps=4", "runtime.checkpoint_every=2",
                                                 'runtime.progress="plain"'), cwd=root)
    assert result.returncode == 0, result.stderr
    step4 = run_dir / "step-000000004.pt"
    payload = load_checkpoint(step4)
    export_onnx(payload, root / "logit.onnx", value="logit")
    export_onnx(payload, root / "probability.onnx", value="probability")
    for name in ("logit", "probability"):
        model = onnx.load(str(root / f"{name}.onnx"))
        del model.metadata_props[:]
        onnx.save(model, str(root / f"{name}-bare.onnx"))
    return {"root": root, "step2": run_dir / "step-000000002.pt", "step4": step4,
            "logit": root / "logit.onnx", "probability": root / "probability.onnx",
            "logit_bare": root / "logit-bare.onnx", "probability_bare": root / "probability-bare.onnx"}


def _moves(folder: Path) -> list[tuple[str, list[int]]]:
    """Each saved game's opening and moves, in game order."""
    games = []
    for path in sorted(folder.glob("game-*.csa")):
        parsed = CSA.Parser.parse_file(str(path))[0]
        games.append((parsed.sfen, list(parsed.moves)))
    return games


def test_a_checkpoint_and_its_export_play_identical_games_and_score_exactly_half(nets, tmp_path):
    # Argmax play, the same openings: the checkpoint against itself and against its export make the same moves,
    # whether the export's value is a logit said in its metadata or a probability found from its graph.
    common = dict(games=10, parallel=10, max_moves=60, seed=5)
    itself = run_match(nets["step4"], nets["step4"], save_games=tmp_path / "itself", **common)
    reference = _moves(tmp_path / "itself")
    assert len(reference) == 10 and sum(len(moves) for _, moves in reference) > 10 * 10
    for export, value, source in (("logit", "logit", "metadata"), ("probability_bare", "probability", "graph")):
        against = run_match(nets["step4"], nets[export], save_games=tmp_path / export, **common)
        assert _moves(tmp_path / export) == reference, export
        assert against["score"] == 0.5 and against["wins"] == against["losses"]
        assert against["moves"] == itself["moves"]
        second = against["second"]
        assert second["kind"] == "onnx" and second["path"] == str(nets[export])
        assert (second["value"], second["value_source"]) == (value, source)
        assert against["first"]["kind"] == "checkpoint"


def test_onnx_value_output_is_read_as_a_logit_whatever_the_file_holds(nets):
    features1, features2 = parity_positions()
    with torch.no_grad():
        policy_ref, value_ref = (t.numpy() for t in reference_module(load_checkpoint(nets["step4"]))(
            torch.from_numpy(features1), torch.from_numpy(features2)))
    kinds = {}
    for name in ("logit", "probability", "logit_bare", "probability_bare"):
        model = load_engine_model(nets[name])
        kinds[name] = (model.value, model.value_source)
        policy, value = model.evaluate(features1, features2)
        assert policy.shape == (16, 2187) and value.shape == (16,)
        np.testing.assert_allclose(policy, policy_ref, atol=1e-4)
        np.testing.assert_allclose(value, value_ref, atol=1e-3)  # a probability back to its logit
    assert kinds == {"logit": ("logit", "metadata"), "probability": ("probability", "metadata"),
                     "logit_bare": ("logit", "graph"), "probability_bare": ("probability", "graph")}
    told = load_engine_model(nets["probability"], value="logit")  # the option wins over the metadata
    assert (told.value, told.value_source) == ("logit", "option")


def _stub(path: Path, *, planes: tuple[int, int] = (62, 57), value: str = "Sigmoid", names: str = "dlshogi",
          value_shape: tuple = ("N", 1)) -> Path:
    """A minimal ONNX net by hand: policy = the first planes' means x zero weights, value = `value` of the mean of
    the second planes (all 0 or 1, so the mean is in [0, 1]). Named as dlshogi names its tensors."""
    first, second = ("input1", "input2") if names == "dlshogi" else ("features1", "features2")
    policy_name, value_name = ("output_policy", "output_value") if names == "dlshogi" else ("policy", "value")
    weights = numpy_helper.from_array(np.zeros((planes[0], 2187), np.float32), "w")
    nodes = [helper.make_node("ReduceMean", [first], ["means"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["means", "w"], [policy_name]),
             helper.make_node("ReduceMean", [second], ["mean"], axes=[1, 2, 3], keepdims=0),
             helper.make_node("Unsqueeze", ["mean", "one"], ["mean1"])]
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    if value == "Sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["mean1"], [value_name]))
    else:
        nodes.append(helper.make_node("Identity", ["mean1"], [value_name]))
    graph = helper.make_graph(
        nodes, "stub",
        [helper.make_tensor_value_info(first, TensorProto.FLOAT, ["N", planes[0], 9, 9]),
         helper.make_tensor_value_info(second, TensorProto.FLOAT, ["N", planes[1], 9, 9])],
        [helper.make_tensor_value_info(policy_name, TensorProto.FLOAT, ["N", 2187]),
         helper.make_tensor_value_info(value_name, TensorProto.FLOAT, list(value_shape))],
        initializer=[weights, one])
    if value != "Sigmoid":  # ReduceMean -> Unsqueeze -> Identity: nothing tells a logit from a probability
        graph.node[-1].CopyFrom(helper.make_node("Identity", ["mean1"], [value_name]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_net_named_as_dlshogi_names_it_is_recognised_by_its_shapes(tmp_path):
    model = load_engine_model(_stub(tmp_path / "dlshogi.onnx"))
    assert (model.interface.features1, model.interface.features2) == ("input1", "input2")
    assert (model.interface.policy, model.interface.value) == ("output_policy", "output_value")
    assert (model.value, model.value_source) == ("probability", "graph")
    policy, value = model.evaluate(*parity_positions())
    assert policy.shape == (16, 2187) and value.shape == (16,) and np.isfinite(value).all()


def test_bad_players_are_one_line_and_exit_2_before_any_game(nets, tmp_path, capsys):
    def refused(*args: str) -> str:
        assert match_main([*args, "--games", "2", "--max-moves", "4", "--save-games", str(tmp_path / "games")]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert not list(tmp_path.glob("games/**/*.csa")), "no game is played before every player is checked"
        return captured.err

    step4 = str(nets["step4"])
    assert_user_error(refused(step4, str(tmp_path / "nope.onnx")), r"nope\.onnx: no such ONNX model$")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07this is no model at all" * 10)
    assert_user_error(refused(step4, str(garbage)), r"garbage\.onnx: not an ONNX model .*expected an ONNX file with "
                                                    r"two float inputs \[N,62,9,9\] and \[N,57,9,9\]")
    text = tmp_path / "notes.onnx"
    text.write_text("just some notes\n")
    assert_user_error(refused(step4, str(text)), r"notes\.onnx: not an ONNX model")
    other = _stub(tmp_path / "other-planes.onnx", planes=(60, 57))
    assert_user_error(refused(step4, str(other)),
                      r"other-planes\.onnx: not a net with dlshogi's interface: it has inputs input1 \['N', 60, 9, 9\] "
                      r"float, input2 \['N', 57, 9, 9\] float and outputs .*; expected two float inputs")
    wide = _stub(tmp_path / "wide-value.onnx", value_shape=("N", 3))
    assert_user_error(refused(step4, str(wide)), r"wide-value\.onnx: not a net with dlshogi's interface")
    unsure = _stub(tmp_path / "unsure.onnx", value="Identity")
    assert_user_error(refused(step4, str(unsure)), r"unsure\.onnx: cannot tell whether its value output is a logit or "
                                                   r"a probability .*--onnx-value")
    # In a round robin too, with the bad player last: refused before the first pair plays.
    assert_user_error(refused(step4, str(nets["logit"]), str(other), "--round-robin"), r"other-planes\.onnx")
    with pytest.raises(SystemExit) as usage:  # a usage error, as argparse's own
        match_main([step4, str(nets["logit"]), str(nets["step2"])])
    assert usage.value.code == 2
    assert_user_error(capsys.readouterr().err, r"3 players named: name two, or add --round-robin")
    # Told what the value is, the same model plays.
    assert match_main([step4, str(unsure), "--onnx-value", "probability", "--games", "2", "--max-moves", "4",
                       "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["second"]["value"], report["second"]["value_source"]) == ("probability", "option")


def _with_nan(source: Path, path: Path, initializer: str) -> Path:
    """`source` (an export) with every number of the initializer named ...`initializer` NaN."""
    model = onnx.load(str(source))
    [tensor] = [t for t in model.graph.initializer if t.name.endswith(initializer)]
    tensor.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(tensor).shape, np.nan, np.float32),
                                            tensor.name))
    onnx.save(model, str(path))
    return path


def test_a_net_whose_policy_or_value_is_not_finite_is_refused_by_match_and_usi(nets, tmp_path, capsys):
    """The issue's repro: a net whose policy output is NaN was accepted by `match` and `usi`, and played. An export
    with a NaN policy bias, one with a NaN value bias (its metadata says logit: nothing evaluated it before), and a
    checkpoint whose policy weights are finite but overflow (3e38): one line naming the file, exit status 2."""
    payload = load_checkpoint(nets["step4"])
    for kind in ("model", "ema"):
        for key in payload.get(kind) or {}:
            if key.endswith("policy_head.conv.weight"):
                payload[kind][key] = torch.full_like(payload[kind][key], 3e38)
    with torch.no_grad():
        policy, value = reference_module(payload)(*map(torch.from_numpy, parity_positions()))
    assert not torch.isfinite(policy).all() and torch.isfinite(value).all()  # what the file below holds
    overflowing = tmp_path / "overflow" / "step-000000004.pt"
    overflowing.parent.mkdir()
    torch.save(payload, overflowing)
    cases = [(_with_nan(nets["logit"], tmp_path / "nan-policy.onnx", "policy_head.bias.bias"), "policy"),
             (_with_nan(nets["logit"], tmp_path / "nan-value.onnx", "value_head.fc2.bias"), "value"),
             (overflowing, "policy")]
    for path, output in cases:
        line = rf"{re.escape(str(path))}: its {output} output is not finite on ordinary positions$"
        assert match_main([str(nets["step4"]), str(path), "--games", "2", "--max-moves", "4"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert_user_error(captured.err, line)
        assert usi_main([str(path)]) == 2
        assert_user_error(capsys.readouterr().err, line)


def test_ratings_are_the_maximum_likelihood_fit():
    # Two players: the fit is the match's own Elo of the score.
    two = fit_ratings(np.array([[0, 15.0], [5.0, 0]]), np.array([[0, 20], [20, 0]]))
    assert two.ratings[0].elo == 0 and two.virtual_draws == 0
    assert math.isclose(two.ratings[1].elo, elo_of_score(0.25), abs_tol=1e-6)
    assert two.ratings[1].elo_low < two.ratings[1].elo < two.ratings[1].elo_high
    # Three players: at the maximum each player's expected points over all its games equal its actual points.
    points = np.array([[0, 13, 15], [7, 0, 12.5], [5, 7.5, 0]])
    games = np.array([[0, 20, 20], [20, 0, 20], [20, 20, 0]])
    table = fit_ratings(points, games)
    r = np.array([rating.elo for rating in table.ratings])
    expected = (games / (1 + np.exp(-SCALE * (r[:, None] - r[None, :])))).sum(axis=1)
    np.testing.assert_allclose(expected, points.sum(axis=1), atol=1e-6)
    assert r[0] == 0 > r[1] > r[2]
    assert [rating.games for rating in table.ratings] == [40, 40, 40]
    # Anchored elsewhere, the same differences.
    other = fit_ratings(points, games, anchor=1)
    assert math.isclose(other.ratings[0].elo - other.ratings[2].elo, r[0] - r[2], abs_tol=1e-6)
    # More games, the same scores: narrower intervals.
    wide, narrow = (fit_ratings(points * k, games * k).ratings[2] for k in (1, 4))
    assert narrow.elo_high - narrow.elo_low < 0.6 * (wide.elo_high - wide.elo_low)
    # A perfect score has no finite maximum: one virtual draw per pair, said in the table.
    perfect = fit_ratings(np.array([[0, 20.0, 20], [0, 0, 11], [0, 9, 0]]), games)
    assert perfect.virtual_draws == 1
    assert all(math.isfinite(rating.elo) for rating in perfect.ratings) and perfect.ratings[1].elo < -300
    assert perfect.ratings[0].points == 40 and perfect.ratings[0].games == 40  # the real games, not the virtual


def test_a_round_robin_of_three_prints_a_rating_table(nets, tmp_path, capsys):
    players = [str(nets["step4"]), str(nets["step2"]), str(nets["logit"])]
    # Sampled moves (temperature 1), so the smoke nets' games are decisive and the pairs differ.
    args = [*players, "--round-robin", "--max-moves", "30", "--temperature", "1", "--seed", "2"]
    assert match_main([*args, "--games", "4", "--json", "--save-games", str(tmp_path / "games")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [pair["first_index"] for pair in report["pairs"]] == [0, 0, 1]
    assert [pair["second_index"] for pair in report["pairs"]] == [1, 2, 2]
    assert report["games"] == 12 and len(report["ratings"]) == 3 and report["anchor"] == 0
    assert report["ratings"][0]["elo"] == 0 == report["ratings"][0]["elo_low"] == report["ratings"][0]["elo_high"]
    for rating in report["ratings"]:
        assert rating["games"] == 8
        assert rating["elo_low"] <= rating["elo"] <= rating["elo_high"]
        mine = [(p["wins"] + p["draws"] / 2) if p["first_index"] == rating["player"] else
                (p["losses"] + p["draws"] / 2) for p in report["pairs"]
                if rating["player"] in (p["first_index"], p["second_index"])]
        assert rating["points"] == sum(mine)
    assert [player["kind"] for player in report["players"]] == ["checkpoint", "checkpoint", "onnx"]
    for folder in ("pair-01-02", "pair-01-03", "pair-02-03"):
        assert len(list((tmp_path / "games" / folder).glob("game-*.csa"))) == 4
    # The text: the table, best first, the anchor marked, every player named.
    assert match_main([*args, "--games", "2"]) == 0
    out = capsys.readouterr().out
    assert "ratings: Elo by maximum likelihood over all 6 games, anchored at player 1 = 0" in out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit() and "%" in line and ". " in line]
    assert len(rows) == 3 and sum("anchor" in row for row in rows) == 1
    elos = [float(row.split()[1]) for row in rows]
    assert elos == sorted(elos, reverse=True)
    assert all(any(player in row for row in rows) for player in players)
