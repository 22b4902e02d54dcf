"""One typed record per kind of event the trainer writes to events.jsonl (docs/events.md), parsed in one
place (`parse_event`), so that readers use typed fields instead of picking a dict apart with `.get`.

A field of the wrong type (a hand-edited or foreign event) reads as absent (`None`); a kind not listed in
`RECORDS` (a newer writer's) parses to `None` and readers skip it.

The records are also how events are written: `EventWriter.emit` takes a record class and writes its `KIND`, so
a kind cannot be written without its record. A new kind is: a record here (its `KIND`, in `RECORDS`), its section
in docs/events.md, the trainer's `emit(Record, ...)`, and the reader that uses it.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def as_float(value: object) -> float | None:
    """A loss or rate from an event as a float ("nan"/"inf"/"-inf" included); None if absent or not numeric."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _NONFINITE.get(value)
    return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object) -> float | None:
    """A figure as written (an int stays an int, so `status --json` prints it as the event did); the strings
    "nan", "inf" and "-inf" as floats; anything else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return as_float(value)


@dataclass(frozen=True)
class EventRecord:
    """What every kind has. `event` is the line as read (unknown fields included): what `status --json`
    passes on, and what the anomaly rules read."""

    KIND: typing.ClassVar[str] = ""
    """The `kind` this record is written and read under (set by each record)."""

    event: typing.Mapping[str, object]
    kind: str
    time: float | None
    step: int | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> EventRecord:
        return cls(event, str(event.get("kind")), as_float(event.get("time")), _int(event.get("step")))

    def public(self) -> dict:
        """The event without the schema version and the reader's own keys (`_line`)."""
        return {k: v for k, v in self.event.items() if not k.startswith("_") and k != "v"}


def _base(event: typing.Mapping[str, object]) -> dict:
    return {"event": event, "kind": str(event.get("kind")), "time": as_float(event.get("time")),
            "step": _int(event.get("step"))}


@dataclass(frozen=True)
class RunStarted(EventRecord):
    KIND = "run_started"

    pid: int | None
    launcher_pid: int | None
    """Under torchrun, torchrun's pid (the process `train_run` records)."""
    host: str | None
    start_ticks: int | None
    boot_id: str | None
    max_steps: int | None
    batch_size: int | None
    resumed_from: str | None
    device: str | None
    settings: typing.Mapping[str, object] | None
    world_size: int | None = None
    restart_count: int | None = None
    """Under torchrun's elastic agent: how many times it had restarted the workers when this attempt began."""
    max_restarts: int | None = None
    """torchrun's `--max-restarts` (None: not under its agent)."""

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> RunStarted:
        settings = event.get("settings")
        return cls(**_base(event), pid=_int(event.get("pid")), launcher_pid=_int(event.get("launcher_pid")),
                   world_size=_int(event.get("world_size")), restart_count=_int(event.get("restart_count")),
                   max_restarts=_int(event.get("max_restarts")),
                   host=_str(event.get("host")), start_ticks=_int(event.get("start_ticks")),
                   boot_id=_str(event.get("boot_id")), max_steps=_int(event.get("max_steps")),
                   batch_size=_int(event.get("batch_size")), resumed_from=_str(event.get("resumed_from")),
                   device=_str(event.get("device")), settings=settings if isinstance(settings, dict) else None)

    def written_by(self, pid: int) -> bool:
        """Was it written by the process `pid`, or by a trainer that torchrun (`pid`) launched?"""
        return pid in (self.pid, self.launcher_pid)


LOSS_NAMES = ("loss", "policy_loss", "value_loss")


@dataclass(frozen=True)
class Step(EventRecord):
    KIND = "step"

    loss: float | None
    policy_loss: float | None
    value_loss: float | None
    lr: float | None
    grad_norm: float | None
    positions_per_second: float | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> Step:
        return cls(**_base(event), **{name: _number(event.get(name)) for name in
                                      (*LOSS_NAMES, "lr", "grad_norm", "positions_per_second")})

    def losses(self) -> dict[str, float]:
        """The losses the event has, by name."""
        found = {name: getattr(self, name) for name in LOSS_NAMES}
        return {name: value for name, value in found.items() if value is not None}


@dataclass(frozen=True)
class Eval(EventRecord):
    """The figures are open-ended (docs/events.md lists them; `ema` nests): readers show `figures()`."""

    KIND = "eval"
    def figures(self) -> dict[str, object]:
        """The figures in the event's order, `step` first, as status and the monitor show them."""
        return {k: v for k, v in self.public().items() if k not in ("time", "kind")}


@dataclass(frozen=True)
class Match(EventRecord):
    KIND = "match"

    elo: float | None
    """+-inf at a 100% or 0% score; NaN reads as None."""
    elo_low: float | None
    elo_high: float | None
    reference_step: int | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> Match:
        def elo(name: str) -> float | None:
            value = as_float(event.get(name))
            return None if value is None or value != value else value

        return cls(**_base(event), elo=elo("elo"), elo_low=elo("elo_low"), elo_high=elo("elo_high"),
                   reference_step=_int(event.get("reference_step")))


@dataclass(frozen=True)
class CheckpointSaved(EventRecord):
    KIND = "checkpoint_saved"

    path: str | None
    bytes: int | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> CheckpointSaved:
        return cls(**_base(event), path=_str(event.get("path")), bytes=_int(event.get("bytes")))


@dataclass(frozen=True)
class Gpu(EventRecord):
    KIND = "gpu"

    devices: tuple[typing.Mapping[str, object], ...]
    torch_peak_memory_bytes: int | None
    torch_memory_allocated_bytes: int | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> Gpu:
        devices = event.get("devices")
        return cls(**_base(event), devices=tuple(d for d in devices if isinstance(d, dict))
                   if isinstance(devices, list) else (),
                   torch_peak_memory_bytes=_int(event.get("torch_peak_memory_bytes")),
                   torch_memory_allocated_bytes=_int(event.get("torch_memory_allocated_bytes")))


@dataclass(frozen=True)
class Compile(EventRecord):
    KIND = "compile"

    first_step_seconds: float | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> Compile:
        return cls(**_base(event), first_step_seconds=_number(event.get("first_step_seconds")))


@dataclass(frozen=True)
class Export(EventRecord):
    KIND = "export"

    path: str | None
    bytes: int | None
    latest: str | None
    """`export/latest.onnx` for `runtime.export_every`'s exports; None for the one `runtime.export_onnx` makes."""

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> Export:
        return cls(**_base(event), path=_str(event.get("path")), bytes=_int(event.get("bytes")),
                   latest=_str(event.get("latest")))


@dataclass(frozen=True)
class Watchdog(EventRecord):
    KIND = "watchdog"

    reason: str | None
    trip_step: int | None
    resume_from: str | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> Watchdog:
        return cls(**_base(event), reason=_str(event.get("reason")), trip_step=_int(event.get("trip_step")),
                   resume_from=_str(event.get("resume_from")))


@dataclass(frozen=True)
class StopRequested(EventRecord):
    KIND = "stop_requested"

    signal: str | None
    requested_at: float | None
    """When the signal arrived (the event's `time` is when it was written, which may be later)."""

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> StopRequested:
        return cls(**_base(event), signal=_str(event.get("signal")), requested_at=as_float(event.get("requested_at")))

    def since(self) -> float | None:
        return self.requested_at or self.time


@dataclass(frozen=True)
class RunWarning(EventRecord):
    KIND = "warning"

    message: str | None
    match_rebaseline: bool
    """The run's match reference was lost and the Elo curve's origin moved (`old_reference_step` ->
    `reference_step`)."""
    old_reference_step: int | None
    reference_step: int | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> RunWarning:
        return cls(**_base(event), message=_str(event.get("message")),
                   match_rebaseline=event.get("match_rebaseline") is True,
                   old_reference_step=_int(event.get("old_reference_step")),
                   reference_step=_int(event.get("reference_step")))


@dataclass(frozen=True)
class DataWindow(EventRecord):
    """`data.watch`: the window of training files changed, or the trainer waits for data (a heartbeat)."""

    KIND = "data_window"
    reason: str | None
    """`start`, `rescan`, `resumed` or `waiting`."""
    positions: int | None
    """Positions in the window now."""
    files: int | None
    """Files joined (the window reaches into the newest of them)."""
    waiting: bool
    """Too few positions to train (`data.window_min_positions`): the trainer waits, which is no anomaly."""
    min_positions: int | None
    arrival_positions_per_hour: float | None
    newest_age_seconds: float | None
    joined_count: int | None
    left_count: int | None

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> DataWindow:
        return cls(**_base(event), reason=_str(event.get("reason")), positions=_int(event.get("positions")),
                   files=_int(event.get("files")), waiting=event.get("waiting") is True,
                   min_positions=_int(event.get("min_positions")),
                   arrival_positions_per_hour=as_float(event.get("arrival_positions_per_hour")),
                   newest_age_seconds=as_float(event.get("newest_age_seconds")),
                   joined_count=_int(event.get("joined_count")), left_count=_int(event.get("left_count")))


@dataclass(frozen=True)
class RunEnded(EventRecord):
    """`run_finished`, `run_stopped` or `run_failed` (`RunFinished`, `RunStopped`, `RunFailed`): the attempt's one
    terminal event."""

    reason: str | None
    error: str | None
    checkpoint: str | None
    elapsed_seconds: float | None
    resume_from: str | None
    """A run halted by divergence: its newest healthy checkpoint, what the next train resumes from."""

    @classmethod
    def parse(cls, event: typing.Mapping[str, object]) -> RunEnded:
        return cls(**_base(event), reason=_str(event.get("reason")), error=_str(event.get("error")),
                   checkpoint=_str(event.get("checkpoint")), elapsed_seconds=as_float(event.get("elapsed_seconds")),
                   resume_from=_str(event.get("resume_from")))


@dataclass(frozen=True)
class RunFinished(RunEnded):
    KIND = "run_finished"


@dataclass(frozen=True)
class RunStopped(RunEnded):
    KIND = "run_stopped"


@dataclass(frozen=True)
class RunFailed(RunEnded):
    KIND = "run_failed"


TERMINAL_KINDS = tuple(record.KIND for record in (RunFinished, RunStopped, RunFailed))
"""The kinds that end an attempt: exactly one of them, last."""

RECORDS: dict[str, type[EventRecord]] = {record.KIND: record for record in (
    RunStarted, Step, Eval, Match, Compile, Export, Watchdog, CheckpointSaved, Gpu, StopRequested, RunWarning,
    DataWindow, RunFinished, RunStopped, RunFailed)}
"""Every kind the trainer writes, and its record (docs/events.md has a section for each)."""


def parse_event(event: typing.Mapping[str, object]) -> EventRecord | None:
    """The typed record of an event as `EventReader` returns it; None for a kind this reader does not know."""
    record = RECORDS.get(str(event.get("kind")))
    return record.parse(event) if record is not None else None
