"""`runtime.export_every`: weights for a self-play engine while the run goes on, in `RUN_DIR/export/`.

Each export is a parity-checked `step-XXXXXXXXX.onnx` (`tideborn.export.onnx_export`, which publishes it by a
rename), then `latest.onnx` becomes a second name of it, also by a rename: an engine that reloads `latest.onnx`
opens the old model or the new one, never half of one. The loop imports this module only when the duty is due,
so a run without it never loads the exporter.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import torch

from tideborn.errors import UserError
from tideborn.export.onnx_export import ExportReport, export_onnx
from tideborn.export.parity import ParityError
from tideborn.rundir.layout import EXPORT_DIR, LATEST_EXPORT_FILE, export_name, list_exports
from tideborn.safefile import file_type, link_atomically, make_dirs, os_error_text, refuse_link, remove_stale_temps


class EngineExportFailed(Exception):
    """The export did not reach `latest.onnx`; the message is the `warning` event's, in one line."""


@dataclass(frozen=True)
class EngineExport:
    report: ExportReport
    latest: Path
    pruned: list[Path]
    prune_problems: list[str]
    """Old step models that could not be deleted (each a line for a `warning`); the export itself succeeded."""

    def event_fields(self) -> dict:
        """The `export` event's fields (`step` is the caller's to add)."""
        return {**self.report.event_fields(), "latest": str(self.latest), "pruned": [str(p) for p in self.pruned]}


def export_for_engine(payload: dict, run_dir: Path, keep: int) -> EngineExport:
    """Export `payload`'s weights (EMA when it holds them) to `run_dir/export/step-XXXXXXXXX.onnx`, point
    `latest.onnx` at it, and keep the newest `keep` step models. `EngineExportFailed` when the model did not
    reach `latest.onnx`: whatever `latest.onnx` was before is then untouched."""
    step = int(payload["step"])
    folder = run_dir / EXPORT_DIR
    target = folder / export_name(step)
    try:
        refuse_link(folder)  # a planted `export -> /elsewhere` would have the run write (and prune) there
        make_dirs(folder)
        _refuse_non_file(target)
        _refuse_non_file(folder / LATEST_EXPORT_FILE)
        # Building the reference network draws initial weights from torch's global generator: fork it, so that
        # a run that exports trains exactly as one that does not, and resumes exactly.
        with torch.random.fork_rng(devices=[]):
            report = export_onnx(payload, target)
    except (ParityError, UserError) as exc:
        raise EngineExportFailed(f"ONNX export of step {step} to {target} failed: {_one_line(exc)}") from None
    except OSError as exc:
        raise EngineExportFailed(f"ONNX export of step {step} to {target} failed: {exc.filename or folder}: "
                                 f"{os_error_text(exc)}") from None
    latest = folder / LATEST_EXPORT_FILE
    remove_stale_temps(latest)  # left by a run killed while it replaced latest.onnx
    try:
        link_atomically(target, latest)
    except (OSError, UserError) as exc:
        reason = os_error_text(exc) if isinstance(exc, OSError) else _one_line(exc)
        raise EngineExportFailed(f"exported {target}, but could not make {latest} a name of it ({reason}); "
                                 f"{latest} still holds the model before") from None
    pruned, problems = prune_exports(folder, keep, target, latest)
    return EngineExport(report, latest, pruned, problems)


def prune_exports(folder: Path, keep: int, newest: Path, latest: Path) -> tuple[list[Path], list[str]]:
    """Delete step models beyond the newest `keep` up to `newest` (the one just written); never `newest`, nor
    the one `latest` is a name of. A step model past `newest` (left by a branch the run abandoned when it resumed
    from an earlier checkpoint) is neither counted nor deleted: `latest.onnx` is what engines read."""
    newest_step = int(newest.name[len("step-"):-len(".onnx")])
    ours = [path for step, path in list_exports(folder) if step <= newest_step]
    pruned, problems = [], []
    for path in ours[:-keep] if keep < len(ours) else []:
        if path == newest or _same_file(path, latest):
            continue
        try:
            path.unlink()
            pruned.append(path)
        except FileNotFoundError:
            continue  # removed by hand meanwhile: what pruning wanted
        except OSError as exc:
            problems.append(f"could not delete {path} (runtime.export_keep): {os_error_text(exc)}")
    return pruned, problems


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # `b` not there (yet): nothing to protect
        return False


def _refuse_non_file(path: Path) -> None:
    """A directory, FIFO or device where a model goes is someone else's: never replaced, said in the warning."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):  # a link is replaced by the rename, never followed
        raise UserError(f"{path} is {file_type(mode)}, not a model file: move it away")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
