"""Architecture presets named by `run.network` / `--network`: layers of settings under the config file."""

from __future__ import annotations

# Each preset is a partial settings layer. Sizes follow the dlshogi family: 10x192 fits a 12 GB card
# at a useful batch, 15x224 and 20x256 are the larger nets trained on multi-GPU nodes.
NETWORKS: dict[str, dict[str, dict[str, object]]] = {
    "resnet2x32": {"model": {"blocks": 2, "channels": 32}},
    "resnet5x64": {"model": {"blocks": 5, "channels": 64}},
    "resnet10x192": {"model": {"blocks": 10, "channels": 192}},
    "resnet15x224": {"model": {"blocks": 15, "channels": 224}},
    "resnet20x256": {"model": {"blocks": 20, "channels": 256}},
}
