"""A run's figures as TensorBoard scalars (`tideborn run tensorboard`), read from events.jsonl after the fact, so
the training loop writes nothing more and a finished or old run converts the same as a live one.

The records are written with TensorBoard's own protos and record writer (the optional `tensorboard` extra), into
a file of ours made and published through `tideborn.safefile`: a whole new file replaces the last conversion, so
converting twice never doubles a scalar. No torch (TensorBoard needs none), so the command starts as fast as
`status`. Tags and behaviour: docs/run-tools.md, TensorBoard.
"""

from __future__ import annotations

import collections
import math
import os
import stat
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

from tideborn.errors import UserError
from tideborn.outputs import probe_directory
from tideborn.rundir.events import EventReader
from tideborn.rundir.kinds import EventRecord, Gpu, Match, RunStarted, Step, as_float, parse_event
from tideborn.rundir.layout import EVENTS_FILE
from tideborn.rundir.state import ENDED_STATES, RunTracker
from tideborn.safefile import (
    create_new_file,
    make_dirs,
    os_error_text,
    publish,
    refuse_link_at,
    remove_stale_temps,
    temp_path,
)

EXTRA = "tensorboard"
INSTALL_HINT = f"pip install 'tideborn[{EXTRA}]'"
SCALARS_FILE = "events.out.tfevents.tideborn"
"""The one file a conversion writes in the log directory (TensorBoard reads every file named `*tfevents*`)."""
STAGING_NAME = "tideborn-scalars"
"""The temp file is `.tideborn-scalars.tmp-PID`: a name without `tfevents`, so a TensorBoard already watching the
directory never loads a conversion before it is whole."""
DEFAULT_LOGDIR = "tensorboard"
"""`--logdir` when not given: this folder in the run directory (derived from events.jsonl; safe to delete)."""
READ_BYTES = 8 * 1024 * 1024
"""events.jsonl is read in blocks of about this much, so a long run converts in bounded memory."""

STEP_TAGS = {"loss": "train/loss", "policy_loss": "train/policy_loss", "value_loss": "train/value_loss",
             "lr": "train/lr", "grad_norm": "train/grad_norm", "grad_norm_max": "train/grad_norm_max",
             "positions_per_second": "train/positions_per_second", "data_wait_seconds": "train/data_wait_seconds",
             "compute_seconds": "train/compute_seconds", "value_lambda": "train/value_lambda"}
"""`step` fields -> tags; the others (the window's per-step `grad_norms`, counters) are not curves."""
MATCH_TAGS = {"elo": "match/elo", "elo_low": "match/elo_low", "elo_high": "match/elo_high",
              "score": "match/score", "los": "match/los"}
EVAL_SKIPPED = ("v", "time", "kind", "step")
ELO_LAYOUT = {"match": {"Elo (95% interval)": ("match/elo", "match/elo_low", "match/elo_high")}}
"""TensorBoard's Custom Scalars tab draws this as the Elo curve inside its interval band."""
CONVERTED_KINDS = ("step", "eval", "match", "gpu")


def scalars_of(record: EventRecord) -> dict[str, float]:
    """The tags and values one event gives. A non-finite loss is kept (a diverged run's NaN is the story);
    an Elo bound at +-inf (a 100% or 0% score) is not a point on a chart and is left out."""
    if isinstance(record, Step):
        return _figures(record.event, STEP_TAGS)
    if isinstance(record, Match):
        return {tag: value for tag, value in _figures(record.event, MATCH_TAGS).items() if math.isfinite(value)}
    if isinstance(record, Gpu):
        found = _figures(record.event, {name: f"gpu/{name}" for name in
                                        ("torch_peak_memory_bytes", "torch_memory_allocated_bytes")})
        for position, device in enumerate(record.devices):
            index = device.get("index", position)
            found.update(_nested(device, f"gpu/{index}", skip=("index", "name")))
        return found
    if record.kind == "eval":  # open-ended figures (docs/events.md), `ema` nested: all the numbers there are
        return _nested(record.event, "eval", skip=EVAL_SKIPPED)
    return {}


def _figures(event: typing.Mapping[str, object], tags: typing.Mapping[str, str]) -> dict[str, float]:
    values = {tag: _value(event.get(name)) for name, tag in tags.items()}
    return {tag: value for tag, value in values.items() if value is not None}


def _nested(fields: typing.Mapping[str, object], prefix: str, skip: typing.Collection[str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, raw in fields.items():
        if name in skip or name.startswith("_"):
            continue
        if isinstance(raw, dict):
            found.update(_nested(raw, f"{prefix}/{name}", skip=()))
        elif (value := _value(raw)) is not None:
            found[f"{prefix}/{name}"] = value
    return found


def _value(raw: object) -> float | None:
    return None if isinstance(raw, bool) else as_float(raw)


def load_protos() -> typing.Any:
    """TensorBoard's writing parts, or a `UserError` saying which extra to install (the only import of it)."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboard.plugins.custom_scalar import layout_pb2
        from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError as exc:
        raise UserError(f"writing TensorBoard scalars needs the optional {EXTRA!r} extra: {INSTALL_HINT} "
                        f"({exc})") from None
    return _Protos(event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, layout_pb2, custom_scalar_metadata,
                   RecordWriter)


@dataclass(frozen=True)
class _Protos:
    event_pb2: typing.Any
    summary_pb2: typing.Any
    tensor_pb2: typing.Any
    tensor_shape_pb2: typing.Any
    layout_pb2: typing.Any
    custom_scalar_metadata: typing.Any
    RecordWriter: typing.Any


@dataclass
class Converted:
    """What a conversion wrote: events by kind, scalars, and the file."""

    path: Path
    events: collections.Counter = field(default_factory=collections.Counter)
    scalars: int = 0
    restarts: int = 0
    """Resumed attempts marked, so TensorBoard drops the abandoned branch's points after the resumed step."""
    interrupted: bool = False
    """--follow ended by Ctrl-C (what was converted until then is in the file)."""

    def summary(self) -> str:
        kinds = ", ".join(f"{self.events[kind]} {kind}" for kind in CONVERTED_KINDS)
        resumed = f" (attempts resumed: {self.restarts}; TensorBoard draws each from its resumed step on)" \
            if self.restarts else ""
        return f"{self.scalars:,} scalars from {kinds} events to {self.path}{resumed}"


class ScalarFile:
    """The conversion's file: written to a hidden temp file in the log directory, published whole over
    `SCALARS_FILE` by a rename (`publish`), and, when following, appended to after that through the same
    descriptor. Closing before `publish` (an error, Ctrl-C) removes the temp file and leaves the last
    conversion as it was."""

    def __init__(self, logdir: Path, protos: _Protos):
        self.protos = protos
        self.path = logdir / SCALARS_FILE
        self.converted = Converted(self.path)
        try:
            make_dirs(logdir)
            refuse_link_at(logdir)  # checked again at the moment of use: a link planted since check_logdir
            remove_stale_temps(logdir / STAGING_NAME)  # a conversion killed by SIGKILL left its temp file
            self._temp: Path | None = temp_path(logdir / STAGING_NAME)
            self._handle = os.fdopen(create_new_file(self._temp), "wb")
        except OSError as exc:
            raise UserError(f"--logdir {logdir}: cannot write there: {os_error_text(exc)}") from None
        self._records = protos.RecordWriter(self._handle)
        self._elo_layout_written = False
        self._write(protos.event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add(self, event: dict) -> None:
        record = parse_event(event)
        if record is None or record.step is None:
            return
        when = record.time if record.time is not None else time.time()
        pb = self.protos
        if isinstance(record, RunStarted) and record.resumed_from is not None:
            # TensorBoard drops every point at or after a START's step: the resumed attempt redoes the steps
            # after its checkpoint, and only its own points should be drawn there.
            self._write(pb.event_pb2.Event(wall_time=when, step=record.step + 1,
                                           session_log=pb.event_pb2.SessionLog(status=pb.event_pb2.SessionLog.START)))
            self.converted.restarts += 1
            return
        scalars = scalars_of(record)
        if not scalars:
            return
        if isinstance(record, Match) and not self._elo_layout_written:
            self._write_elo_layout(when)
        summary = pb.summary_pb2.Summary(value=[pb.summary_pb2.Summary.Value(tag=tag, simple_value=value)
                                                for tag, value in scalars.items()])
        self._write(pb.event_pb2.Event(wall_time=when, step=record.step, summary=summary))
        self.converted.events[record.kind] += 1
        self.converted.scalars += len(scalars)

    def _write_elo_layout(self, when: float) -> None:
        pb = self.protos
        layout = pb.layout_pb2.Layout(category=[
            pb.layout_pb2.Category(title=title, chart=[
                pb.layout_pb2.Chart(title=chart, margin=pb.layout_pb2.MarginChartContent(series=[
                    pb.layout_pb2.MarginChartContent.Series(value=value, lower=lower, upper=upper)]))
                for chart, (value, lower, upper) in charts.items()])
            for title, charts in ELO_LAYOUT.items()])
        tensor = pb.tensor_pb2.TensorProto(dtype=7, string_val=[layout.SerializeToString()],  # 7: DT_STRING
                                           tensor_shape=pb.tensor_shape_pb2.TensorShapeProto())
        value = pb.summary_pb2.Summary.Value(tag=pb.custom_scalar_metadata.CONFIG_SUMMARY_TAG, tensor=tensor,
                                             metadata=pb.custom_scalar_metadata.create_summary_metadata())
        self._write(pb.event_pb2.Event(wall_time=when, summary=pb.summary_pb2.Summary(value=[value])))
        self._elo_layout_written = True

    def _write(self, event: typing.Any) -> None:
        try:
            self._records.write(event.SerializeToString())
        except OSError as exc:
            raise UserError(f"cannot write {self._temp or self.path}: {os_error_text(exc)}") from None

    def flush(self) -> None:
        try:
            self._handle.flush()
        except OSError as exc:
            raise UserError(f"cannot write {self._temp or self.path}: {os_error_text(exc)}") from None

    def publish(self) -> None:
        """Put the conversion so far in place of the last one (fsynced first, so a power cut leaves one whole)."""
        assert self._temp is not None, "published already"
        refuse_link_at(self.path)  # never replaced: a link there is someone else's doing, as in check_logdir
        self.flush()
        try:
            os.fsync(self._handle.fileno())
            publish([(self._temp, self.path)])
        except OSError as exc:
            raise UserError(f"cannot publish {self.path}: {os_error_text(exc)}") from None
        self._temp = None

    def close(self) -> None:
        self._handle.close()
        if self._temp is not None:
            self._temp.unlink(missing_ok=True)

    def __enter__(self) -> ScalarFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def default_logdir(run_dir: Path) -> Path:
    return run_dir / DEFAULT_LOGDIR


def check_logdir(logdir: Path) -> None:
    """Before any work: a directory (or nothing yet) that files can be written in, and no symbolic link where the
    conversion writes (the folder, its file): tideborn never writes through one, as the trainer refuses a linked
    `export/` (a planted `tensorboard -> /elsewhere` would have the run's scalars, and the probe, land there)."""
    refuse_link_at(logdir)
    if logdir.exists() and not logdir.is_dir():
        raise UserError(f"--logdir {logdir}: not a directory")
    refuse_link_at(logdir / SCALARS_FILE)
    probe_directory(logdir, "--logdir")


class RunConverter:
    """Reads a run's events.jsonl from where it last stopped and adds its figures to a `ScalarFile`."""

    def __init__(self, run_dir: Path, scalar_file: ScalarFile):
        self.events_path = run_dir / EVENTS_FILE
        self.reader = EventReader(self.events_path)
        self.file = scalar_file

    def drain(self) -> int:
        """Convert every complete event written since the last call; how many events were read."""
        read = 0
        while batch := self.reader.read_new(READ_BYTES):
            for event in batch:
                self.file.add(event)
            read += len(batch)
        if self.reader.problem is not None:
            raise UserError(f"{self.events_path}: {self.reader.problem}")
        self.file.flush()
        return read


FOLLOW_CHECK_MILLISECONDS = 1000
"""--follow asks whether the run has ended (or vanished), and whether its directory is still there, at least this
often while its files are quiet."""
FOLLOW_ENDS = (*ENDED_STATES.values(), "vanished")


class RunDirGone(Exception):
    """--follow: the run directory was removed or renamed away (its path names no directory, or another one), so
    the run can no longer be followed there; the message is one line."""


def convert_run(run_dir: Path, logdir: Path, follow: bool = False,
                say: typing.Callable[[str], object] = print) -> Converted:
    """Write the run's figures to `logdir`/SCALARS_FILE, replacing the last conversion whole. With `follow`,
    the file is published once what is there now is converted, then grows as the run writes, until the run
    ends (finished, stopped, failed or vanished); Ctrl-C (KeyboardInterrupt) ends it sooner, the file kept.
    `RunDirGone` when the run directory goes away while followed (what was converted until then is in the file)."""
    check_logdir(logdir)
    protos = load_protos()
    followed = _directory_identity(run_dir)  # before reading: a directory swapped in later is never taken for it
    with ScalarFile(logdir, protos) as scalars:
        converter = RunConverter(run_dir, scalars)
        converter.drain()
        scalars.publish()
        if follow:
            tracker = RunTracker(run_dir, start="end")  # only to know when the run ends: events come from above
            say(f"following {run_dir} into {scalars.path} until the run ends (Ctrl-C stops)")
            try:
                _follow(run_dir, followed, tracker, converter)
            except KeyboardInterrupt:
                scalars.converted.interrupted = True
        return scalars.converted


def _directory_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory at `path`, or None where there is none now."""
    try:
        info = os.stat(path)
    except OSError:  # gone, or a name no directory can have now
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


def _follow(run_dir: Path, followed: tuple[int, int] | None, tracker: RunTracker, converter: RunConverter) -> None:
    import watchfiles  # only here, as for `watch`

    if _caught_up(run_dir, followed, tracker, converter):
        return
    # A directory removed or renamed away ends no watch (inotify says "deleted" once, then the timeouts go on):
    # each wake-up asks whether it is still there.
    try:
        for _changes in watchfiles.watch(run_dir, watch_filter=None, debounce=100, step=20,
                                         rust_timeout=FOLLOW_CHECK_MILLISECONDS, yield_on_timeout=True,
                                         recursive=False):
            if _caught_up(run_dir, followed, tracker, converter):
                return
    except FileNotFoundError:  # watchfiles cannot watch a directory that went before the watch began
        _check_still_there(run_dir, followed, converter)
        raise


def _caught_up(run_dir: Path, followed: tuple[int, int] | None, tracker: RunTracker,
               converter: RunConverter) -> bool:
    """Convert what the run wrote since the last call; whether the run has ended. `RunDirGone` once the directory
    followed is no longer at `run_dir`."""
    _check_still_there(run_dir, followed, converter)
    # Asked before reading: a terminal event in the file by then is read by the drain that follows.
    ended = tracker.refresh(keep_events=False).state in FOLLOW_ENDS
    converter.drain()
    return ended


def _check_still_there(run_dir: Path, followed: tuple[int, int] | None, converter: RunConverter) -> None:
    """`RunDirGone` unless the directory at `run_dir` is the one followed: the tracker, reading by path, would
    otherwise wait on for good, call the run vanished once its trainer exits, or read another directory put in its
    place."""
    if followed is None or _directory_identity(run_dir) != followed:
        raise RunDirGone(f"{run_dir}: the run directory is gone (removed or renamed away); stopped following it "
                         f"after {converter.file.converted.scalars:,} scalars")
