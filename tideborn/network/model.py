"""DLManaka's policy/value network: a dlshogi-style ResNet over cshogi's input planes.

Inputs are the two plane stacks `cshogi.dlshogi.make_input_features` fills; the policy comes out in
`cshogi.dlshogi.make_move_label`'s index layout (direction * 81 + destination square), the value as a
logit whose sigmoid is the side to move's win probability.
"""

from __future__ import annotations

import torch
from torch import nn

from tideborn.config.schema import ModelSettings

__all__ = [
    "FEATURES1_NUM", "FEATURES2_NUM", "MOVE_DIRECTIONS", "POLICY_CLASSES", "SQUARES",
    "PolicyValueNet", "ResidualBlock", "build_model",
]

FEATURES1_NUM = 62
"""Board planes of `cshogi.dlshogi.make_input_features` (pieces, attacks, check). Spelled out rather than
imported so that the model, the synthetic data and the GPU check load without cshogi (the GPU machines'
images lack it); tests/unit/test_model.py keeps both counts equal to cshogi's."""
FEATURES2_NUM = 57
"""Hand planes of `cshogi.dlshogi.make_input_features`."""
SQUARES = 81
MOVE_DIRECTIONS = 27
"""10 board directions, 10 promoting ones, 7 drop piece types: make_move_label's label // 81."""
POLICY_CLASSES = MOVE_DIRECTIONS * SQUARES

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "silu": nn.SiLU, "mish": nn.Mish}


def make_activation(name: str) -> nn.Module:
    """A fresh activation module for `model.activation`'s value."""
    return _ACTIVATIONS[name]()


def _conv3x3(in_channels: int, out_channels: int) -> nn.Conv2d:
    # No bias: every convolution except the policy head's is followed by BatchNorm, whose shift
    # makes a bias redundant.
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False)


class InputStem(nn.Module):
    """Board planes through a 3x3 and a 1x1 conv, hand planes through a 1x1 conv, summed."""

    def __init__(self, channels: int, activation: str):
        super().__init__()
        self.board_conv3x3 = _conv3x3(FEATURES1_NUM, channels)
        self.board_conv1x1 = _conv1x1(FEATURES1_NUM, channels)
        self.hand_conv1x1 = _conv1x1(FEATURES2_NUM, channels)
        self.norm = nn.BatchNorm2d(channels)
        self.act = make_activation(activation)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        summed = self.board_conv3x3(x1) + self.board_conv1x1(x1) + self.hand_conv1x1(x2)
        return self.act(self.norm(summed))


class ResidualBlock(nn.Module):
    """conv3x3-BN-act-conv3x3-BN, plus the skip, then act."""

    def __init__(self, channels: int, activation: str):
        super().__init__()
        self.conv1 = _conv3x3(channels, channels)
        self.norm1 = nn.BatchNorm2d(channels)
        self.act1 = make_activation(activation)
        self.conv2 = _conv3x3(channels, channels)
        self.norm2 = nn.BatchNorm2d(channels)
        self.act2 = make_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.act2(out + x)


class PolicyBias(nn.Module):
    """One learned bias per policy class, added after the flatten (dlshogi's `Bias`)."""

    def __init__(self, classes: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class PolicyHead(nn.Module):
    """1x1 conv to one plane per move direction, flattened channel-major: index = direction * 81 + square."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = _conv1x1(channels, MOVE_DIRECTIONS)
        # [N, 27, 9, 9] -> [N, 2187]; a plane's row-major (rank-inner) order is cshogi's square index,
        # the same layout make_input_features writes its planes in.
        self.flatten = nn.Flatten()
        self.bias = PolicyBias(POLICY_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias(self.flatten(self.conv(x)))


class ValueHead(nn.Module):
    """1x1 conv, BN, act, then two fully connected layers down to one logit per position."""

    def __init__(self, channels: int, value_channels: int, value_hidden: int, activation: str):
        super().__init__()
        self.conv = _conv1x1(channels, value_channels)
        self.norm = nn.BatchNorm2d(value_channels)
        self.act1 = make_activation(activation)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(SQUARES * value_channels, value_hidden)
        self.act2 = make_activation(activation)
        self.fc2 = nn.Linear(value_hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.flatten(self.act1(self.norm(self.conv(x))))
        return self.fc2(self.act2(self.fc1(out))).squeeze(-1)


class PolicyValueNet(nn.Module):
    """`forward(x1 [N,62,9,9], x2 [N,57,9,9]) -> (policy logits [N,2187], value logit [N])`."""

    def __init__(self, settings: ModelSettings):
        super().__init__()
        self.settings = settings
        self.stem = InputStem(settings.channels, settings.activation)
        self.tower = nn.Sequential(*(ResidualBlock(settings.channels, settings.activation)
                                     for _ in range(settings.blocks)))
        self.policy_head = PolicyHead(settings.channels)
        self.value_head = ValueHead(settings.channels, settings.value_channels, settings.value_hidden,
                                    settings.activation)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        trunk = self.tower(self.stem(x1, x2))
        return self.policy_head(trunk), self.value_head(trunk)


def build_model(settings: ModelSettings) -> PolicyValueNet:
    """A freshly initialised network of `settings`' shape (seed torch first for a repeatable one)."""
    return PolicyValueNet(settings)
