"""The run's checkpoints, owned in one place (torchtitan's checkpointer is the model): when a save prunes, which
checkpoint is the healthy one to resume from, the checkpoints set aside after a gradient spike or a non-finite
loss, the old run set aside by `--fresh`, and the match reference kept as `match-reference.pt`.

The training loop says when to save and what (the payload); the checkpointer writes it, prunes, and reports
in the events through the `Reporter` it is given.
"""

from __future__ import annotations

import os
import stat
import typing
from pathlib import Path

from tideborn.config.schema import RuntimeSettings
from tideborn.errors import UserError
from tideborn.network.checkpoint import REFERENCE_STEP_KEY, prune_checkpoints, save_checkpoint
from tideborn.rundir.kinds import CheckpointSaved, EventRecord, RunWarning
from tideborn.rundir.layout import (
    ARCHIVE_DIR,
    EVENTS_FILE,
    EXPORT_DIR,
    MATCH_REFERENCE_FILE,
    WATCHDOG_ARCHIVE,
    checkpoint_name,
    list_checkpoints,
    move_to_archive,
    parse_step,
)
from tideborn.safefile import link_atomically, os_error_text, refuse_link
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.watchdog import healthy_step_of


class Reporter(typing.Protocol):
    """How the checkpointer speaks: events (rank 0 only writes them) and the progress lines on stderr."""

    def emit(self, record: type[EventRecord], **fields: object) -> None: ...

    def say(self, text: str) -> None: ...


class Checkpointer:
    """Saves, prunes, keeps the match reference, tracks the healthy step and sets aside what is not."""

    def __init__(self, run_dir: Path, runtime: RuntimeSettings, start: StartPoint, is_main: bool, report: Reporter):
        self.run_dir, self.runtime, self.is_main, self.report = run_dir, runtime, is_main, report
        self.last_saved: Path | None = start.checkpoint
        """The checkpoint of the newest save (None on ranks other than 0), or the one the attempt resumed from."""
        self.saved_step = start.step
        payload = start.payload
        self.healthy_step: int | None = healthy_step_of(payload) if payload is not None else None
        """The step of the newest checkpoint saved with no gradient spike streak open: pruning keeps it, and
        a trip or a non-finite loss leaves it as the resume point (trainer/watchdog.py)."""
        recorded = (payload or {}).get(REFERENCE_STEP_KEY)
        whole = isinstance(recorded, int) and not isinstance(recorded, bool)
        self.reference_step: int | None = recorded if whole else None
        """The step of the run's match reference (match-reference.pt), carried in every checkpoint so that a
        reference deleted or replaced later is noticed (restored from its step file, or a re-baseline said)."""

    def save(self, step: int, payload: typing.Callable[[int | None], dict], healthy: bool) -> Path | None:
        """Rank 0 writes step `step`'s checkpoint (`payload(healthy_step)` gives its contents); every rank returns
        its path (None on the others). A save while the watchdog counts spikes is not healthy and prunes
        nothing; no save prunes the newest healthy one."""
        if healthy:
            self.healthy_step = step  # before the payload: a healthy checkpoint names itself
        self.saved_step = step
        if not self.is_main:
            self.last_saved = None
            return None
        contents = payload(self.healthy_step)
        if self.runtime.match_every and not self.runtime.match_reference:
            # The reference this save will be matched against: the first save's own step when there is none yet.
            contents[REFERENCE_STEP_KEY] = step if self.reference_step is None else self.reference_step
        saved = save_checkpoint(self.run_dir, step, contents)
        pruned = (prune_checkpoints(self.run_dir, self.runtime.keep_checkpoints, saved.path,
                                    self.healthy_checkpoint()) if healthy else [])
        self.report.emit(CheckpointSaved, path=str(saved.path), bytes=saved.bytes, seconds=saved.seconds,
                         pruned=[str(path) for path in pruned], healthy=healthy)
        self.last_saved = saved.path
        return saved.path

    def healthy_checkpoint(self) -> Path | None:
        """The newest checkpoint saved with no spike streak open, if it is still in the run directory (pruning
        never removes it; an older one may be unhealthy, so none is guessed when it was removed by hand)."""
        if self.healthy_step is None:
            return None
        path = self.run_dir / checkpoint_name(self.healthy_step)
        return path if path in {p for _, p in list_checkpoints(self.run_dir)} else None

    def set_aside_unhealthy(self, why: str) -> Path | None:
        """Rank 0 moves the checkpoints saved since the newest healthy one (each while a spike streak was open:
        their weights took exploding updates) to `archive/watchdog-STAMP/`, with a warning; every rank returns
        the newest checkpoint left, the healthy one, to resume from."""
        newest_healthy = -1 if self.healthy_step is None else self.healthy_step
        unhealthy = [path for step, path in list_checkpoints(self.run_dir) if step > newest_healthy]
        if unhealthy and self.is_main:
            names = ", ".join(path.name for path in unhealthy)
            try:
                folder = move_to_archive(self.run_dir, unhealthy, WATCHDOG_ARCHIVE)
                text = f"moved {names}, {why}, to {folder}/: not a point to resume from"
            except (OSError, UserError) as exc:  # UserError: an `archive` link planted since start-up
                reason = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
                text = (f"could not move {names} ({why}) to {self.run_dir}/archive/: {reason}; do not resume from "
                        "them (train passes them over by default)")
            self.report.emit(RunWarning, message=text)
            self.report.say(f"warning: {text}")
        return self.healthy_checkpoint()

    def archive_for_fresh(self) -> Path | None:
        """`--fresh`: the old run's checkpoints, events, match reference and engine exports moved to
        `archive/fresh-STAMP/` (never through a link), before anything of the new run is written."""
        run_dir = self.run_dir
        doomed = [path for _, path in list_checkpoints(run_dir)]
        if (run_dir / EVENTS_FILE).exists():
            doomed.append(run_dir / EVENTS_FILE)
        if os.path.lexists(run_dir / MATCH_REFERENCE_FILE):  # the old run's reference is not the new one's
            doomed.append(run_dir / MATCH_REFERENCE_FILE)
        if os.path.lexists(run_dir / EXPORT_DIR):  # nor are its models the engine's: latest.onnx would be the old run's
            doomed.append(run_dir / EXPORT_DIR)
        if not doomed:
            return None
        # Never through a link: `archive -> /elsewhere` would carry the run's checkpoints out of it.
        for path in [run_dir / ARCHIVE_DIR, *doomed]:
            refuse_link(path)
        archive = move_to_archive(run_dir, doomed, "fresh")
        self.report.say(f"--fresh: moved {len(doomed)} file(s) (old checkpoints, events, match reference, "
                        f"exports) to {archive}")
        return archive

    def match_reference(self) -> Path:
        """What a match plays against: `runtime.match_reference`, else the run's own `match-reference.pt`."""
        named = self.runtime.match_reference
        return Path(named) if named else self.run_dir / MATCH_REFERENCE_FILE

    def keep_reference(self, saved: Path) -> None:
        """Keep the default match reference, the run's first checkpoint, as match-reference.pt (a hard link,
        so that pruning does not take it away). Made at the run's first save; later, one that is gone or is no
        longer a regular file (deleted, replaced by a link: never followed) is restored from the reference's
        own step file when that is still there, and otherwise re-based on `saved` with a `warning` event
        (`match_rebaseline`): the Elo curve's origin moves, and status and the monitor say so."""
        reference = self.run_dir / MATCH_REFERENCE_FILE
        try:
            found = os.lstat(reference).st_mode
        except FileNotFoundError:
            found = None
        if found is not None and stat.S_ISREG(found):
            return
        if found is not None and stat.S_ISDIR(found):
            self._warn(f"{reference} is a directory, not the match reference: matches cannot be played until "
                       "it is moved away")
            return
        what = "is a symbolic link (never followed)" if found is not None and stat.S_ISLNK(found) else (
            "is not a regular file" if found is not None else "is missing")
        known = self.reference_step
        source, rebased = saved, known is not None
        if known is not None:
            own = self.run_dir / checkpoint_name(known)
            try:
                if stat.S_ISREG(os.lstat(own).st_mode) and own != saved:
                    source, rebased = own, False
            except FileNotFoundError:
                pass
        try:
            link_atomically(source, reference)
        except (OSError, UserError) as exc:
            self._warn(f"could not keep {source.name} as the match reference {reference}: {exc}")
            return
        if known is None:
            self.reference_step = parse_step(saved)
        elif rebased:
            self.reference_step = parse_step(saved)
            self._warn(f"{reference} {what} and step {known}'s checkpoint, the run's reference, is gone: the "
                       f"reference is now step {self.reference_step}; Elo from here on is measured against it "
                       f"and does not continue the curve before", match_rebaseline=True,
                       old_reference_step=known, reference_step=self.reference_step)
        else:
            self._warn(f"{reference} {what}: restored from {source.name}, the run's reference (step {known})")

    def reference_played(self, played: int, reference: Path) -> None:
        """A match was played against step `played`: where that is not the run's reference (replaced in place
        by another checkpoint), the Elo curve's origin moved, and the events say so."""
        if self.runtime.match_reference or played == self.reference_step:
            return
        if self.reference_step is not None:
            self._warn(f"{reference} now holds step {played}, not step {self.reference_step}, the run's "
                       f"reference: Elo from here on is measured against step {played} and does not continue "
                       "the curve before", match_rebaseline=True, old_reference_step=self.reference_step,
                       reference_step=played)
        self.reference_step = played

    def _warn(self, text: str, **fields: object) -> None:
        self.report.emit(RunWarning, message=text, **fields)
        self.report.say(text)
