"""Where a run starts from: the newest usable checkpoint, a named one, a fine-tune init, or nothing.

Everything here only reads; it runs before the run directory is touched, so a refusal (a corrupt
named checkpoint, settings that change the network) leaves nothing written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tideborn.config.schema import RESUME_FIXED_KEYS, Settings
from tideborn.errors import UserError
from tideborn.network.checkpoint import CheckpointError, load_checkpoint, newest_loadable
from tideborn.rundir.layout import list_checkpoints
from tideborn.trainer.watchdog import saved_healthy


@dataclass(frozen=True)
class StartPoint:
    checkpoint: Path | None = None
    """The checkpoint resumed from (None: step 0)."""
    payload: dict | None = None
    init_weights: dict | None = None
    """Model weights a fine-tune starts from (with fresh optimizer and step 0)."""
    warnings: list[str] = field(default_factory=list)
    changed_settings: dict[str, list] = field(default_factory=dict)
    """Dotted key -> [value in the checkpoint, value now], for the safe changes a resume allows."""
    unusable: list[tuple[Path, str]] = field(default_factory=list)
    """Step files in the run directory that automatic resume skipped, each with why (one line); the run
    moves them to archive/quarantine-STAMP/ (`tideborn.trainer.lineage`)."""
    unhealthy: list[Path] = field(default_factory=list)
    """Newer checkpoints that automatic resume passed over for the newest healthy one: saved while a gradient
    spike streak was open (trainer/watchdog.py); the run moves them to archive/watchdog-STAMP/."""

    @property
    def step(self) -> int:
        return int(self.payload["step"]) if self.payload else 0


def flatten(settings: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def settings_changes(old: dict, new: dict) -> dict[str, list]:
    before, after = flatten(old), flatten(new)
    return {key: [before.get(key), after.get(key)] for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)}


def refuse_incompatible(path: Path, changes: dict[str, list], keys: tuple[str, ...], verb: str) -> None:
    fixed = {key: pair for key, pair in changes.items() if key in keys}
    if fixed:
        detail = "; ".join(f"{key} was {old!r}, now {new!r}" for key, (old, new) in fixed.items())
        raise UserError(f"cannot {verb} {path}: {detail}. These change the network or the optimizer "
                        "state; keep them as in the checkpoint, or start over with --fresh")


def choose_start(settings: Settings, run_dir: Path, resume: Path | None, fresh: bool) -> StartPoint:
    if fresh and resume is not None:
        raise UserError("--fresh and --resume exclude each other")
    warnings: list[str] = []
    unusable: list[tuple[Path, str]] = []
    path, payload = None, None
    if resume is not None:
        try:
            path, payload = resume, load_checkpoint(resume)
        except CheckpointError as exc:
            raise UserError(f"--resume {exc}") from None
    elif not fresh:
        path, payload, unusable = newest_loadable(run_dir)
    unhealthy: list[Path] = []
    if payload is not None and resume is None and not saved_healthy(payload):
        path, payload, unhealthy = _newest_healthy(run_dir, path, payload, unusable)
    if payload is not None:
        changes = settings_changes(payload["settings"], settings.to_dict())
        refuse_incompatible(path, changes, RESUME_FIXED_KEYS, "resume from")
        return StartPoint(path, payload, None, warnings, changes, unusable, unhealthy)
    if settings.run.mode == "finetune":
        init_path = Path(settings.run.init_checkpoint)
        try:
            init = load_checkpoint(init_path)
        except CheckpointError as exc:
            raise UserError(f"run.init_checkpoint: {exc}") from None
        changes = settings_changes(init["settings"], settings.to_dict())
        shape_keys = tuple(k for k in RESUME_FIXED_KEYS if k.startswith("model."))
        refuse_incompatible(init_path, changes, shape_keys, "fine-tune from")
        return StartPoint(None, None, init["model"], warnings, {}, unusable)
    return StartPoint(None, None, None, warnings, {}, unusable)


def _newest_healthy(run_dir: Path, newest: Path, payload: dict, unusable: list[tuple[Path, str]]
                    ) -> tuple[Path, dict, list[Path]]:
    """The newest checkpoint saved with no gradient spike streak open, and the newer ones passed over. A run
    stopped, killed or halted while its gradient norm was spiking must not continue from weights that took
    those updates when one from before is there. With no healthy one, the newest loadable as before (the
    restored watchdog then judges the streak it left open)."""
    passed: list[Path] = [newest]
    skipped = {path for path, _ in unusable}
    for step, path in reversed(list_checkpoints(run_dir)):
        if step >= payload["step"] or path in skipped:
            continue
        try:
            older = load_checkpoint(path)
        except CheckpointError as exc:
            unusable.append((path, str(exc)))
            continue
        if older["step"] != step:
            unusable.append((path, f"{path}: holds step {older['step']}, not the step its name says"))
            continue
        if saved_healthy(older):
            return path, older, passed
        passed.append(path)
    return newest, payload, []
