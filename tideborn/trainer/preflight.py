"""Checks of a training request that need neither torch nor the checkpoints' contents (no torch here).

`train` runs them first; `train_run start` runs them before launching, so a request the trainer would
refuse is refused at the terminal, with the same message, and nothing is launched.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from tideborn.config.schema import Settings
from tideborn.errors import UserError
from tideborn.rundir.access import check_run_dir
from tideborn.rundir.layout import CHECKPOINT_RE, list_checkpoints, run_dir_of

CHECKPOINT_FORMAT_MARK = b"tideborn-checkpoint"
"""`checkpoint.FORMAT` as it stands in a checkpoint's pickle (`data.pkl`): the mark of a tideborn checkpoint."""


def preflight(settings: Settings, resume: Path | None = None, fresh: bool = False,
              stop_at_step: int | None = None, cwd: Path | None = None) -> Path:
    """Raise `UserError` for what is wrong with the request, checking only what is cheap (teacher files are
    looked at, not opened for training: the trainer does that once, `data.training.opened`); return the run directory
    (relative to `cwd`, the trainer's working directory, when `runtime.out_dir` and `paths.runs_root` are
    relative)."""
    check_teacher_data(settings)
    return check_request(settings, resume, fresh, stop_at_step, cwd)


def check_request(settings: Settings, resume: Path | None = None, fresh: bool = False,
                  stop_at_step: int | None = None, cwd: Path | None = None) -> Path:
    """`preflight` but the data: the flags, and the run directory (returned)."""
    if fresh and resume is not None:
        raise UserError("--fresh and --resume exclude each other")
    if resume is not None and not resume.is_file():
        raise UserError(f"--resume {resume}: no such checkpoint file")
    if stop_at_step is not None and not 0 < stop_at_step <= settings.runtime.max_steps:
        raise UserError(f"--stop-at-step {stop_at_step}: must be between 1 and runtime.max_steps "
                        f"({settings.runtime.max_steps})")
    run_dir = run_dir_of(settings)
    # Before torch loads: a run directory someone else controls (a planted link, another user's files),
    # or one that cannot be written (read-only, under a file, a name too long, a full disk), is one line.
    where = run_dir if cwd is None or run_dir.is_absolute() else cwd / run_dir
    # This also refuses an `archive` that is not a directory (where `--fresh` moves the old run).
    check_run_dir(where)
    return run_dir


def check_teacher_data(settings: Settings) -> None:
    """Raise `UserError` for teacher data the trainer would refuse, as far as a quick look tells: a pattern
    that matches no file, a file that cannot be read or is not whole records, an hcpe3 file empty or cut
    short in its first header, a game index written for another version of its file, a train/test pair from
    two splits. hcpe3 games are not decoded here (minutes for a large file): the trainer decodes them once,
    as it opens its data (`data.training.opened.open_data`), and names a malformed game before its run starts.
    `summary` asks too, so that it says what `train` would."""
    data = settings.data
    if data.resolved_kind == "synthetic":
        return
    from tideborn.data.formats.game_index import check_pairs
    from tideborn.data.sets.sources import held_out_source, training_source

    # With data.watch the training files come and go while the run goes on (data/training/watch.py): none is needed now.
    root = settings.paths.data_root
    train = None if data.watch else training_source(data, root, decode=False)
    test = held_out_source(data, root, decode=False)
    for records in (train, test):
        if records is not None:
            records.close()
    check_pairs(train.paths if train is not None else [], test.paths if test is not None else [])


def nothing_to_train(checkpoint: Path, step: int, max_steps: int) -> str:
    """What `train` says, and `train_run start` refuses with, when the run is already at runtime.max_steps."""
    return (f"nothing to train: {checkpoint} is at step {step}, and runtime.max_steps is {max_steps} "
            "(raise it with --set runtime.max_steps=N, or start over with --fresh)")


def stop_at_step_too_early(stop_at_step: int, step: int, max_steps: int) -> str:
    return (f"--stop-at-step {stop_at_step}: must be after the start step ({step}) "
            f"and at most runtime.max_steps ({max_steps})")


def check_start_step(settings: Settings, run_dir: Path, resume: Path | None = None, fresh: bool = False,
                     stop_at_step: int | None = None) -> tuple[Path, int] | None:
    """The trainer's start-step checks (nothing to train; `--stop-at-step` not after the start step), made
    without torch: raise `UserError` with the trainer's own message where the trainer is sure to refuse.
    Returns the checkpoint the run would resume from and its step, where that can be told, else None.

    The step is read from the checkpoint's name (a save names the file by its step). A checkpoint that
    would make this refuse counts only once its zip archive reads back whole, every CRC right: the trainer
    skips a damaged one for the one before, so a damaged newest checkpoint must not make `start` refuse.
    Where a file cannot be judged without torch (not a zip archive), or `--resume` names a file whose name
    gives no step, nothing is refused here: the trainer decides, and `train_run start` reports its answer.
    """
    if fresh:
        return None
    max_steps = settings.runtime.max_steps
    # At or past this step the trainer refuses; below it, it trains (whichever older checkpoint it uses).
    threshold = max_steps if stop_at_step is None else min(max_steps, stop_at_step)
    if resume is not None:
        match = CHECKPOINT_RE.match(resume.name)
        if match is None:
            return None
        found = (resume, int(match.group(1)))
        if found[1] >= threshold and checkpoint_file_state(resume) != "complete":
            return None  # the trainer refuses a damaged --resume file with its own message
    else:
        for step, path in reversed(list_checkpoints(run_dir)):
            if step < threshold:
                return path, step  # not read: whatever the trainer makes of it, it has steps to train
            state = checkpoint_file_state(path)
            if state == "complete":
                found = (path, step)
                break
            if state == "unknown":
                return None
        else:
            return None
    path, step = found
    if stop_at_step is not None and not step < stop_at_step <= max_steps:
        raise UserError(stop_at_step_too_early(stop_at_step, step, max_steps))
    if step >= max_steps:
        raise UserError(nothing_to_train(path, step, max_steps))
    return found


def checkpoint_file_state(path: Path) -> str:
    """What `load_checkpoint` will make of a checkpoint file, told without torch: "complete" (a whole zip
    archive, every CRC right, with a tideborn checkpoint's pickle: it loads), "broken" (empty, cut short,
    no tideborn pickle in it: it is refused) or "unknown" (no zip archive, or a CRC wrong: torch checks
    none, so a flipped bit in a tensor loads, while one in its pickle is refused). Reads the file once."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return "broken"
    if not head:
        return "broken"
    if not head.startswith(b"PK\x03\x04"):
        return "unknown"
    try:
        archive = zipfile.ZipFile(path)  # reads the central directory, which torch needs as well
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return "broken"
    with archive:
        pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")]
        if len(pickles) != 1:
            return "broken"
        try:
            if archive.testzip() is not None:
                return "unknown"
            pickled = archive.read(pickles[0])
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
            return "unknown"  # damage zipfile trips over where torch, reading differently, might not
    return "complete" if CHECKPOINT_FORMAT_MARK in pickled else "broken"
