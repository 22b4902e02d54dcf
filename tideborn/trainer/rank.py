"""Rank helpers, read from torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, and its elastic
agent's TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS); no
torch here, so the CLI can check them before torch loads. A process launched alone has world size 1.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass

from tideborn.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    restart_count: int = 0
    """How many times torchrun's elastic agent has restarted the workers (after a failure or a change of nodes)."""
    max_restarts: int | None = None
    """torchrun's `--max-restarts` (None: not launched by torchrun's agent)."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def under_agent(self) -> bool:
        """Launched by torchrun's agent (its worker, at any world size, one process included)."""
        return self.max_restarts is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_env(environ: typing.Mapping[str, str] | None = None) -> DistEnv:
    environ = os.environ if environ is None else environ
    values = {}
    for name, default in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1), ("TORCHELASTIC_RESTART_COUNT", 0),
                          ("TORCHELASTIC_MAX_RESTARTS", -1)):
        raw = environ.get(name, "")
        try:
            values[name] = int(raw) if raw else default
        except ValueError:
            raise UserError(f"environment variable {name}={raw!r} is not an integer (torchrun sets it)") from None
    most = values["TORCHELASTIC_MAX_RESTARTS"]
    env = DistEnv(values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"], values["TORCHELASTIC_RESTART_COUNT"],
                  most if most >= 0 else None)
    if env.world_size < 1 or not 0 <= env.rank < env.world_size:
        raise UserError(f"RANK={env.rank} and WORLD_SIZE={env.world_size} do not fit together")
    if env.distributed and not (environ.get("MASTER_ADDR") and environ.get("MASTER_PORT")):
        raise UserError("WORLD_SIZE > 1 but MASTER_ADDR/MASTER_PORT are not set: launch with torchrun")
    return env
