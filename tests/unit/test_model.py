"""The policy/value network's shapes, policy layout and cost, and the summary that reports them."""

from __future__ import annotations

import cshogi
import numpy as np
import pytest
import torch
from cshogi.dlshogi import make_input_features, make_move_label
from torch import nn

from tideborn.config.schema import ModelSettings
from tideborn.network.model import (
    FEATURES1_NUM,
    FEATURES2_NUM,
    MOVE_DIRECTIONS,
    POLICY_CLASSES,
    PolicyValueNet,
    build_model,
)
from tideborn.trainer.summary import (
    format_flops,
    format_model_summary,
    parameter_bytes,
    summarize_model,
)

TINY = ModelSettings(blocks=1, channels=8, value_channels=4, value_hidden=16)


def _features(boards: list[cshogi.Board]) -> tuple[torch.Tensor, torch.Tensor]:
    x1 = np.zeros((len(boards), FEATURES1_NUM, 9, 9), dtype=np.float32)
    x2 = np.zeros((len(boards), FEATURES2_NUM, 9, 9), dtype=np.float32)
    for i, board in enumerate(boards):
        make_input_features(board, x1[i], x2[i])
    return torch.from_numpy(x1), torch.from_numpy(x2)


def test_constants_match_cshogi():
    from cshogi import dlshogi

    # model.py spells the plane counts out (so the trainer loads without cshogi); they must stay cshogi's.
    assert (FEATURES1_NUM, FEATURES2_NUM) == (dlshogi.FEATURES1_NUM, dlshogi.FEATURES2_NUM) == (62, 57)
    assert POLICY_CLASSES == MOVE_DIRECTIONS * 81 == 2187


@pytest.mark.parametrize("blocks, channels, activation", [
    (1, 8, "relu"), (2, 16, "silu"), (3, 12, "mish"),
])
@pytest.mark.parametrize("batch", [1, 3])
def test_forward_shapes(blocks, channels, activation, batch):
    model = build_model(ModelSettings(blocks=blocks, channels=channels, activation=activation,
                                      value_channels=5, value_hidden=7))
    x1, x2 = _features([cshogi.Board() for _ in range(batch)])
    policy, value = model(x1, x2)
    assert policy.shape == (batch, POLICY_CLASSES)
    assert value.shape == (batch,)  # a batch of one stays [1], not a scalar
    assert len(model.tower) == blocks
    assert model.stem.board_conv3x3.out_channels == channels
    assert model.value_head.fc1.in_features == 81 * 5
    assert model.value_head.fc1.out_features == 7
    kinds = {type(m) for m in model.modules()}
    wanted = {"relu": nn.ReLU, "silu": nn.SiLU, "mish": nn.Mish}[activation]
    assert wanted in kinds and not ({nn.ReLU, nn.SiLU, nn.Mish} - {wanted}) & kinds


def test_bad_activation_is_refused_by_the_settings():
    from tideborn.config.schema import SettingError

    with pytest.raises(SettingError, match="model.activation"):
        ModelSettings(activation="gelu")


def test_policy_is_the_head_conv_flattened_direction_major():
    torch.manual_seed(0)
    model = build_model(TINY).eval()
    with torch.no_grad():
        model.policy_head.bias.bias.copy_(torch.randn(POLICY_CLASSES))
    seen = {}
    model.policy_head.conv.register_forward_hook(lambda _m, _i, out: seen.update(planes=out))
    x1, x2 = _features([cshogi.Board()])
    with torch.no_grad():
        policy, _ = model(x1, x2)
    planes, bias = seen["planes"], model.policy_head.bias.bias
    for direction, square in [(0, 0), (0, 80), (1, 0), (5, 37), (26, 80)]:
        # make_input_features puts square s at plane[s // 9][s % 9]; the policy must read it back there.
        expected = planes[0, direction, square // 9, square % 9] + bias[direction * 81 + square]
        assert policy[0, direction * 81 + square] == pytest.approx(expected.item())


def test_policy_argmax_lands_on_make_move_label():
    # Feed the head a trunk that is hot only at a move's destination, with weights that copy that
    # plane into the move's direction channel: the argmax must be make_move_label's index.
    model = build_model(TINY).eval()
    head = model.policy_head
    board = cshogi.Board()
    board.push_usi("7g7f")
    board.push_usi("3c3d")
    for move in list(board.legal_moves)[:12]:
        label = make_move_label(move, board.turn)
        direction, square = divmod(label, 81)
        trunk = torch.zeros(1, TINY.channels, 9, 9)
        trunk[0, 0].view(-1)[square] = 1.0
        with torch.no_grad():
            head.conv.weight.zero_()
            head.conv.weight[direction, 0] = 1.0
            logits = head(trunk)
        assert int(logits.argmax()) == label, cshogi.move_to_usi(move)


def test_value_is_a_logit_per_position():
    torch.manual_seed(1)
    model = build_model(TINY).eval()
    board = cshogi.Board()
    x1, x2 = _features([board, board])
    with torch.no_grad():
        _, value = model(x1, x2)
    assert value.dtype == torch.float32
    assert value[0] == pytest.approx(value[1].item())


def test_parameter_count_matches_torch_and_rows_cover_every_parameter():
    model = build_model(ModelSettings(blocks=2, channels=16))
    summary = summarize_model(model)
    assert summary.total_parameters == sum(p.numel() for p in model.parameters())
    assert summary.trainable_parameters == summary.total_parameters
    assert sum(row.parameters for row in summary.rows) == summary.total_parameters
    model.stem.board_conv3x3.weight.requires_grad_(False)
    frozen = summarize_model(model)
    assert frozen.trainable_parameters == summary.total_parameters - 16 * 62 * 9


def test_tiny_net_flops_are_twice_the_multiply_adds():
    c, vc, vh = TINY.channels, TINY.value_channels, TINY.value_hidden  # 8, 4, 16
    squares = 81
    macs = (
        squares * 62 * c * 9         # stem 3x3 conv, board planes:  81*62*8*9  = 361,584
        + squares * 62 * c           # stem 1x1 conv, board planes:  81*62*8    =  40,176
        + squares * 57 * c           # stem 1x1 conv, hand planes:   81*57*8    =  36,936
        + 2 * squares * c * c * 9    # the block's two 3x3 convs:    2*81*8*8*9 =  93,312
        + squares * c * 27           # policy 1x1 conv:              81*8*27    =  17,496
        + squares * c * vc           # value 1x1 conv:               81*8*4     =   2,592
        + squares * vc * vh          # value fc1:                    324*16     =   5,184
        + vh * 1                     # value fc2:                    16*1       =      16
    )
    # By hand: 361,584 + 40,176 + 36,936 + 93,312 + 17,496 + 2,592 + 5,184 + 16 = 557,296 MACs.
    assert macs == 557_296
    summary = summarize_model(build_model(TINY))
    assert summary.flops_per_position == 2 * 557_296


def test_flops_do_not_depend_on_activation_but_grow_with_the_tower():
    base = summarize_model(build_model(TINY)).flops_per_position
    mish = summarize_model(build_model(ModelSettings(blocks=1, channels=8, value_channels=4,
                                                     value_hidden=16, activation="mish")))
    deeper = summarize_model(build_model(ModelSettings(blocks=3, channels=8, value_channels=4,
                                                       value_hidden=16)))
    assert mish.flops_per_position == base
    assert deeper.flops_per_position - base == 2 * (2 * 2 * 81 * 8 * 8 * 9)


def test_summary_leaves_no_hooks_and_restores_modes():
    model = build_model(TINY)
    model.train()
    model.value_head.norm.eval()  # a mixed state must come back exactly
    summarize_model(model)
    assert model.training and model.stem.norm.training
    assert not model.value_head.norm.training
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_summary_rows_follow_the_forward_pass():
    summary = summarize_model(build_model(ModelSettings(blocks=2, channels=16)))
    names = [row.name for row in summary.rows]
    assert names[:5] == ["stem.board_conv3x3", "stem.board_conv1x1", "stem.hand_conv1x1",
                         "stem.norm", "stem.act"]
    assert names[5:7] == ["tower.0", "tower.1"]
    rows = {row.name: row for row in summary.rows}
    assert rows["tower.1"].kind == "ResidualBlock"
    assert rows["tower.1"].output_shape == (16, 9, 9)
    assert rows["tower.1"].parameters == 2 * (16 * 16 * 9) + 2 * (2 * 16)
    assert rows["policy_head.bias"].output_shape == (POLICY_CLASSES,)
    assert rows["value_head.fc2"].output_shape == (1,)


def test_summary_text_shows_rows_and_totals():
    model = build_model(ModelSettings(blocks=2, channels=32))
    summary = summarize_model(model)
    text = format_model_summary(summary)
    assert f"Total parameters:     {summary.total_parameters:,}" in text
    assert "623,202" in text
    assert "10.9 MFLOP per position (forward)" in text
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("tower.0 "))
    assert row.split() == ["tower.0", "ResidualBlock", "32x9x9", "18,560"]
    # Aligned: every table line is as wide as the header's rule.
    rule = lines[1]
    assert set(rule) == {"-"}
    assert all(len(line) == len(rule) for line in lines[2:2 + len(summary.rows)])


@pytest.mark.parametrize("flops, text", [
    (812, "812 FLOP"),
    (2_254_256, "2.25 MFLOP"),
    (10_881_728, "10.9 MFLOP"),
    (2_150_000_000, "2.15 GFLOP"),
    (1_098_811_520, "1.10 GFLOP"),
])
def test_format_flops_picks_a_readable_unit(flops, text):
    assert format_flops(flops) == text


def test_parameter_bytes_follow_dtype():
    model = build_model(TINY)
    count = sum(p.numel() for p in model.parameters())
    assert parameter_bytes(model) == 4 * count
    assert parameter_bytes(model.to(torch.bfloat16)) == 2 * count


def test_build_model_returns_the_network():
    assert isinstance(build_model(TINY), PolicyValueNet)
