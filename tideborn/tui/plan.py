"""What the start key launches: a config file, `--set` overrides and trainer flags, from the command
line or from a run directory's launch.json, always aimed at the run directory the TUI shows. No textual.

Launching goes through `tideborn.tools.control.launch_run`, the function `train_run start` uses.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from tideborn.config.load import load_settings
from tideborn.errors import UserError
from tideborn.rundir.events import loads_bounded
from tideborn.rundir.layout import LAUNCH_FILE, run_dir_of
from tideborn.safefile import NotARegularFile, no_such_file, open_regular
from tideborn.tools.control import LaunchRequest

OUT_DIR_KEY = "runtime.out_dir"


@dataclass(frozen=True)
class LaunchPlan:
    config: str | None = None
    overrides: tuple[str, ...] = ()
    flags: dict[str, str | None] = field(default_factory=dict)
    nproc_per_node: int = 1
    """More than 1: the trainer runs under torchrun, one process per GPU (as `train_run start --nproc-per-node`)."""
    trainer_args: tuple[str, ...] = ()
    """Trainer options that are not settings (`--resume PATH` from the checkpoint list); never read from
    launch.json."""
    cwd: Path = field(default_factory=Path.cwd)
    origin: str = "command line"
    """Where the plan came from, for people: "command line" or the launch.json path."""

    @staticmethod
    def from_launch_file(run_dir: Path) -> LaunchPlan | None:
        """The plan a run directory was last started with (its launch.json), or None without one. Its
        trainer flags (`--fresh`, `--resume`, `--stop-at-step`) are not carried over: starting again
        resumes from the newest checkpoint, and must never archive the run's progress by surprise."""
        path = run_dir / LAUNCH_FILE
        try:
            with open_regular(path) as handle:  # never blocks on a FIFO
                data = loads_bounded(handle.read())
        except OSError as exc:
            if not isinstance(exc, NotARegularFile) and no_such_file(exc):
                return None
            raise UserError(f"{path}: unreadable ({exc}); start with --config instead") from None
        except ValueError as exc:  # ValueError: bad JSON, bad UTF-8, nested too deeply
            raise UserError(f"{path}: unreadable ({exc}); start with --config instead") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: not a JSON object; start with --config instead")
        cwd = Path(data.get("cwd") or run_dir)
        config = data.get("config")
        if config and not (cwd / config).exists() and data.get("config_path"):
            config = data["config_path"]  # the directory it was started from has gone; the file has not
        return LaunchPlan(config=config, overrides=tuple(str(o) for o in data.get("overrides") or ()),
                          flags={k: (str(v) if v is not None else None) for k, v in (data.get("flags") or {}).items()},
                          nproc_per_node=int(data.get("nproc_per_node") or 1), cwd=cwd, origin=str(path))

    def with_override(self, item: str) -> LaunchPlan:
        """The plan with `key=value` replacing any earlier override of the same key."""
        key = item.partition("=")[0].strip()
        kept = tuple(o for o in self.overrides if o.partition("=")[0].strip() != key)
        return replace(self, overrides=kept + (item,))

    def without_override(self, key: str) -> LaunchPlan:
        return replace(self, overrides=tuple(o for o in self.overrides if o.partition("=")[0].strip() != key))

    def override_of(self, key: str) -> str | None:
        for item in reversed(self.overrides):
            name, _, value = item.partition("=")
            if name.strip() == key:
                return value.strip()
        return None

    def run_dir(self) -> Path:
        """Where this plan's trainer would write (raises UserError for bad settings)."""
        settings = load_settings(self.config, self.overrides, self.flags, cwd=self.cwd, environ=os.environ).settings
        found = run_dir_of(settings)
        return found if found.is_absolute() else self.cwd / found

    def aimed_at(self, run_dir: Path) -> LaunchPlan:
        """The plan, writing into `run_dir` (an out_dir override is added when it would write elsewhere)."""
        target = Path(run_dir).resolve()
        try:
            if self.run_dir().resolve() == target:
                return self
        except UserError:
            pass  # the settings are bad: launching will say so, with the out_dir override in place
        return self.with_override(f"{OUT_DIR_KEY}={json.dumps(str(target))}")

    def request(self) -> LaunchRequest:
        return LaunchRequest(config=self.config, overrides=self.overrides, flags=dict(self.flags),
                             trainer_args=self.trainer_args, nproc_per_node=self.nproc_per_node)

    def resuming_from(self, checkpoint: Path) -> LaunchPlan:
        """The plan, with the trainer resuming from `checkpoint` (`--resume`, as `train_run start --resume`)."""
        return replace(self, trainer_args=("--resume", str(checkpoint)))
