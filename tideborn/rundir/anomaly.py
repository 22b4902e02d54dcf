"""What looks wrong with a run: the rules `status`, `watch` and the TUI share, so they never disagree.

Everything here is pure: the rules take events, log lines and facts about a process (gathered by
`tideborn.rundir.state`) and return `Anomaly` records; nothing reads files or signals. No torch.
Rules and thresholds are documented in docs/run-tools.md.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, field

from tideborn.rundir.kinds import as_float

NONFINITE_LOSS = "nonfinite_loss"
DIVERGENCE = "divergence"
RUN_FAILED = "run_failed"
VANISHED = "vanished"
STALLED = "stalled"
CUDA_OOM = "cuda_oom"
CUDA_ERROR = "cuda_error"
NCCL_ERROR = "nccl_error"
TRACEBACK = "traceback"
RUN_FILE = "run_file"
GRADIENT = "gradient"
EVENTS_GONE = "events_gone"
RESTARTED = "restarted"
ORPHANED = "orphaned"
RULES = (NONFINITE_LOSS, DIVERGENCE, RUN_FAILED, VANISHED, STALLED, CUDA_OOM, CUDA_ERROR, NCCL_ERROR, TRACEBACK,
         RUN_FILE, GRADIENT, EVENTS_GONE, RESTARTED, ORPHANED)
LOG_RULES = (CUDA_OOM, CUDA_ERROR, NCCL_ERROR, TRACEBACK)

LOSS_FIELDS = ("loss", "policy_loss", "value_loss")
# psutil derives a process's start time from the boot time, which the kernel reports in whole
# seconds and NTP may nudge; the same process can read back up to about a second apart.
START_TIME_TOLERANCE_SECONDS = 1.0
# The smoothed loss needs a few points before its best means anything (a tail read starts cold).
DIVERGENCE_MIN_POINTS = 10


@dataclass(frozen=True)
class AnomalyThresholds:
    """The knobs of the rules; the CLI flags of `status` and `watch` set them."""

    divergence_factor: float = 1.5
    """Divergence: the smoothed loss is more than this many times its best (lowest) smoothed value."""
    divergence_warmup_steps: int = 1000
    """Divergence is not judged before this training step (early losses swing and fall fast)."""
    smoothing: float = 0.1
    """Weight of the newest logged loss in the exponential moving average (0 < smoothing <= 1)."""
    stall_seconds: float = 900.0
    """Stalled: the process is alive but events.jsonl and train.log have not changed for this long."""

    def __post_init__(self) -> None:
        if not self.divergence_factor > 1:
            raise ValueError(f"divergence factor must be > 1; got {self.divergence_factor}")
        if self.divergence_warmup_steps < 0:
            raise ValueError(f"divergence warm-up steps must be >= 0; got {self.divergence_warmup_steps}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1]; got {self.smoothing}")
        if not self.stall_seconds > 0:
            raise ValueError(f"stall seconds must be > 0; got {self.stall_seconds}")


@dataclass(frozen=True)
class Anomaly:
    rule: str
    """One of RULES."""
    message: str
    """One line for people."""
    evidence: dict = field(default_factory=dict)
    """What the rule saw: the step and values, or the log `line` number and its `text`."""
    time: float = 0.0
    """Unix seconds: when the evidence was written (event time, log mtime) or observed (process checks)."""

    def to_dict(self) -> dict:
        return {"rule": self.rule, "message": self.message, "evidence": dict(self.evidence), "time": self.time}


def _fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


# -- losses -----------------------------------------------------------------------------------------

def nonfinite_loss(event: typing.Mapping) -> Anomaly | None:
    """A `step` event whose loss, policy loss or value loss is NaN or infinite."""
    if event.get("kind") != "step":
        return None
    values = {name: as_float(event.get(name)) for name in LOSS_FIELDS}
    bad = {name: value for name, value in values.items() if value is not None and not math.isfinite(value)}
    if not bad:
        return None
    step = event.get("step")
    listed = ", ".join(f"{name} {value}" for name, value in bad.items())
    evidence = {"step": step, **{name: event.get(name) for name in LOSS_FIELDS if name in event}}
    return Anomaly(NONFINITE_LOSS, f"non-finite loss at step {step}: {listed}", evidence,
                   float(event.get("time") or 0.0))


def run_failed(event: typing.Mapping) -> Anomaly | None:
    if event.get("kind") != "run_failed":
        return None
    step, error = event.get("step"), str(event.get("error") or "no error given")
    first_line = error.splitlines()[0] if error.strip() else error
    return Anomaly(RUN_FAILED, f"run failed at step {step}: {first_line}", {"step": step, "error": error},
                   float(event.get("time") or 0.0))


def restarted(event: typing.Mapping) -> Anomaly | None:
    """torchrun's elastic agent restarted the workers (a worker or a node failed, or nodes joined): a
    `run_started` with a `restart_count` above 0. The run goes on, from its newest checkpoint at the world size
    the attempt names; the steps since that checkpoint were trained again."""
    count = event.get("restart_count")
    if event.get("kind") != "run_started" or not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    most = event.get("max_restarts")
    of = f" of {most}" if isinstance(most, int) and not isinstance(most, bool) else ""
    resumed = event.get("resumed_from")
    source = f"from {resumed}" if resumed else "from step 0 (no checkpoint yet)"
    message = (f"torchrun restarted the workers (restart {count}{of}): resumed {source} at world size "
               f"{event.get('world_size')}")
    evidence = {"step": event.get("step"), "restart_count": count, "max_restarts": most,
                "world_size": event.get("world_size"), "resumed_from": resumed}
    return Anomaly(RESTARTED, message, evidence, float(event.get("time") or 0.0))


def gradient(event: typing.Mapping) -> Anomaly | None:
    """The trainer's gradient watchdog halted the run (its `watchdog` event): a non-finite gradient norm, or
    one far above its running median for several steps in a row."""
    if event.get("kind") != "watchdog":
        return None
    trip_step = event.get("trip_step", event.get("step"))
    norm, median = as_float(event.get("grad_norm")), as_float(event.get("median"))
    if event.get("reason") == "nonfinite_grad_norm":
        message = f"non-finite gradient norm ({_fmt(norm)}) at step {trip_step}; the watchdog halted the run"
    else:
        message = (f"gradient norm {_fmt(norm)} at step {trip_step} above {event.get('factor')} x its running "
                   f"median {_fmt(median)} for {event.get('consecutive')} step(s) in a row; the watchdog halted "
                   "the run")
    evidence = {"step": trip_step, "reason": event.get("reason"), "grad_norm": event.get("grad_norm"),
                "median": event.get("median"), "factor": event.get("factor"),
                "consecutive": event.get("consecutive")}
    return Anomaly(GRADIENT, message, evidence, float(event.get("time") or 0.0))


class LossWatch:
    """Follows `step` events: flags non-finite losses and divergence of the smoothed loss.

    `observe` returns the anomalies that *begin* with this event (a streak of NaN steps is reported
    once, at its first step; a divergence once, when it starts), which is what a stream wants;
    `current()` is what holds now, which is what a status report wants.
    """

    def __init__(self, thresholds: AnomalyThresholds | None = None):
        self.thresholds = thresholds or AnomalyThresholds()
        self.smoothed: float | None = None
        self.best: float | None = None
        self.best_step: int | None = None
        self.points = 0
        self.last_nonfinite: Anomaly | None = None
        self.nonfinite_count = 0
        self.divergence: Anomaly | None = None
        self._in_nonfinite_streak = False

    def new_session(self) -> None:
        """A new `run_started`: NaNs of an earlier session no longer describe this one."""
        self.last_nonfinite, self.nonfinite_count, self._in_nonfinite_streak = None, 0, False

    def observe(self, event: typing.Mapping) -> list[Anomaly]:
        if event.get("kind") != "step":
            return []
        found: list[Anomaly] = []
        bad = nonfinite_loss(event)
        if bad is not None:
            self.last_nonfinite = bad
            self.nonfinite_count += 1
            if not self._in_nonfinite_streak:
                found.append(bad)
            self._in_nonfinite_streak = True
            return found  # a NaN says nothing about the trend: the average skips it
        self._in_nonfinite_streak = False
        loss, step = as_float(event.get("loss")), event.get("step")
        if loss is None or not isinstance(step, int):
            return found
        alpha = self.thresholds.smoothing
        self.smoothed = loss if self.smoothed is None else alpha * loss + (1 - alpha) * self.smoothed
        self.points += 1
        if self.best is None or self.smoothed < self.best:
            self.best, self.best_step = self.smoothed, step
        diverged = self._divergence(step, float(event.get("time") or 0.0))
        if diverged is not None and self.divergence is None:
            found.append(diverged)
        self.divergence = diverged
        return found

    def _divergence(self, step: int, time: float) -> Anomaly | None:
        t = self.thresholds
        if step < t.divergence_warmup_steps or self.points < DIVERGENCE_MIN_POINTS:
            return None
        assert self.smoothed is not None and self.best is not None
        if not (self.best > 0 and self.smoothed > t.divergence_factor * self.best):
            return None
        ratio = self.smoothed / self.best
        evidence = {"step": step, "smoothed_loss": self.smoothed, "best_smoothed_loss": self.best,
                    "best_step": self.best_step, "factor": t.divergence_factor}
        return Anomaly(DIVERGENCE, f"smoothed loss {_fmt(self.smoothed)} at step {step} is {ratio:.2f}x its best "
                                   f"{_fmt(self.best)} (step {self.best_step}); limit {t.divergence_factor}x",
                       evidence, time)

    def current(self) -> list[Anomaly]:
        found = []
        if self.last_nonfinite is not None:
            found.append(self.last_nonfinite)
        if self.divergence is not None:
            found.append(self.divergence)
        return found


# -- the log ----------------------------------------------------------------------------------------

_LINE_RULES = (
    (CUDA_OOM, re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")),
    (CUDA_ERROR, re.compile(r"CUDA error|CUDNN_STATUS_[A-Z_]+|CUBLAS_STATUS_[A-Z_]+|device-side assert")),
    (NCCL_ERROR, re.compile(r"NCCL error|nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)Error"
                            r"|ProcessGroupNCCL.*(?:timed out|[Tt]imeout)|NCCL watchdog")),
)
_TRACEBACK_HEADER = re.compile(r"Traceback \(most recent call last\):")
LOG_SIGNAL = re.compile("|".join([p.pattern for _, p in _LINE_RULES] + [_TRACEBACK_HEADER.pattern]))
"""Matches any line a log rule could start on: text without a match needs no line-by-line scan."""
_CHAIN_MARKERS = ("During handling of the above exception", "The above exception was the direct cause")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torchrun prefixes worker output
_MESSAGES = {CUDA_OOM: "CUDA out of memory", CUDA_ERROR: "CUDA error", NCCL_ERROR: "NCCL error"}


def match_log_line(text: str) -> str | None:
    """The rule a single log line breaks (OOM, CUDA error, NCCL error), or None."""
    for rule, pattern in _LINE_RULES:
        if pattern.search(text):
            return rule
    return None


def log_anomaly(rule: str, line_number: int, text: str, time: float) -> Anomaly:
    shown = text.strip()
    return Anomaly(rule, f"{_MESSAGES.get(rule, rule)} in train.log line {line_number}: {shown[:200]}",
                   {"line": line_number, "text": shown}, time)


class LogScanner:
    """Reads train.log line by line: OOM / CUDA / NCCL lines, and Python tracebacks.

    A traceback is reported when its exception line arrives (the evidence holds the header's line and
    the exception's); a chained traceback ("During handling of the above exception ...") counts once.
    """

    def __init__(self) -> None:
        self._header: tuple[int, str] | None = None
        self._state = "idle"  # idle | frames | after_exception | chain
        self._reported = False

    @property
    def idle(self) -> bool:
        """Not inside a traceback: lines that match no rule can be skipped."""
        return self._state == "idle"

    def feed(self, line_number: int, text: str, time: float = 0.0) -> list[Anomaly]:
        found: list[Anomaly] = []
        rule = match_log_line(text)
        if rule is not None:
            found.append(log_anomaly(rule, line_number, text, time))
        body = _RANK_PREFIX.sub("", text.rstrip("\r\n"))
        if _TRACEBACK_HEADER.search(body):
            if self._state != "chain":
                self._header, self._reported = (line_number, body.strip()), False
            self._state = "frames"
            return found
        if self._state == "idle":
            return found
        stripped = body.strip()
        if not stripped:
            return found
        if stripped.startswith(_CHAIN_MARKERS):
            self._state = "chain" if self._state == "after_exception" else self._state
            return found
        if self._state == "frames":
            if body[:1] in (" ", "\t"):
                return found
            self._state = "after_exception"
            if not self._reported:
                found.append(self._traceback(line_number, stripped, time))
                self._reported = True
            return found
        if self._state in ("after_exception", "chain") and body[:1] not in (" ", "\t"):
            self._state, self._header = "idle", None  # ordinary output again
        return found

    def _traceback(self, line_number: int, exception: str, time: float) -> Anomaly:
        assert self._header is not None
        header_line, header_text = self._header
        evidence = {"line": header_line, "text": header_text, "exception_line": line_number, "exception": exception}
        return Anomaly(TRACEBACK, f"Python traceback in train.log line {header_line}: {exception[:200]}",
                       evidence, time)

    def flush(self, time: float = 0.0) -> list[Anomaly]:
        """A traceback whose exception line has not arrived (the log ends inside it)."""
        if self._header is None or self._reported or self._state != "frames":
            return []
        header_line, header_text = self._header
        self._reported = True
        return [Anomaly(TRACEBACK, f"Python traceback in train.log line {header_line} (the log ends inside it)",
                        {"line": header_line, "text": header_text, "exception_line": None, "exception": None},
                        time)]


def shift_lines(anomaly: Anomaly, by: int) -> Anomaly:
    """The same log anomaly with its line numbers moved by `by` (a reader that started mid-file)."""
    evidence = dict(anomaly.evidence)
    for key in ("line", "exception_line"):
        if isinstance(evidence.get(key), int):
            evidence[key] += by
    if anomaly.rule in LOG_RULES and isinstance(anomaly.evidence.get("line"), int):
        old, new = f"line {anomaly.evidence['line']}", f"line {evidence['line']}"
        return Anomaly(anomaly.rule, anomaly.message.replace(old, new, 1), evidence, anomaly.time)
    return Anomaly(anomaly.rule, anomaly.message, evidence, anomaly.time)


# -- the process ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcessFacts:
    """What the OS says about a pid, gathered by `tideborn.rundir.files.process_facts`."""

    pid: int
    running: bool
    """The pid exists and is not a zombie."""
    create_time: float | None = None
    """Its start as a wall-clock time (psutil `create_time()`): boot time + start ticks, so it moves when
    the clock is stepped."""
    name: str = ""
    start_ticks: int | None = None
    """Its start in clock ticks since boot (field 22 of /proc/PID/stat): does not move with the clock."""
    boot_id: str | None = None
    """Which boot of the host this is (/proc/sys/kernel/random/boot_id): start ticks restart at a reboot."""
    start_ticks_slack: int = 0
    """How far apart two readings of one process's `start_ticks` can be: 0 from /proc; a second's worth
    where they are derived from psutil's wall-clock times (no /proc)."""
    status: str = ""
    """psutil's status: `stopped` for a process stopped by SIGSTOP or Ctrl-Z."""


def same_process(facts: ProcessFacts, start_time: float | None = None, started_by: float | None = None,
                 start_ticks: int | None = None, boot_id: str | None = None) -> bool:
    """Is the running pid still the process we mean? `start_ticks` (and `boot_id`): its recorded start in
    clock ticks since boot, which no clock step moves: where both sides have them, they alone decide.
    Else `start_time`: its recorded wall-clock start time (a train.pid older than start ticks); else
    `started_by`: a time it had certainly started by (its `run_started` event), for runs started in
    the foreground without a pid file."""
    if not facts.running:
        return False
    if start_ticks is not None and facts.start_ticks is not None:
        if boot_id and facts.boot_id and boot_id != facts.boot_id:
            return False  # the host rebooted since: ticks count from a new boot
        return abs(facts.start_ticks - start_ticks) <= facts.start_ticks_slack
    if facts.create_time is None:
        return True  # the OS would not say (access denied): trust the pid
    if start_time is not None:
        return abs(facts.create_time - start_time) <= START_TIME_TOLERANCE_SECONDS
    if started_by is not None:
        return facts.create_time <= started_by + START_TIME_TOLERANCE_SECONDS
    return True


def vanished(facts: ProcessFacts, ended: bool, now: float, start_time: float | None = None,
             started_by: float | None = None, last_event: typing.Mapping | None = None,
             last_log_line: str | None = None, start_ticks: int | None = None,
             boot_id: str | None = None) -> Anomaly | None:
    """The run should be going (no terminal event) but its process is gone or is another process.
    `last_event`: the launch's latest event; `last_log_line`: train.log's, for a run that wrote no event."""
    if ended or same_process(facts, start_time, started_by, start_ticks, boot_id):
        return None
    evidence: dict = {"pid": facts.pid, "expected_start_time": start_time}
    if facts.running:
        # Both clocks, recorded and now: the wall-clock times alone cannot tell a reused pid from a clock step.
        evidence.update(actual_start_time=facts.create_time, name=facts.name, expected_start_ticks=start_ticks,
                        actual_start_ticks=facts.start_ticks)
        if boot_id and facts.boot_id and boot_id != facts.boot_id:
            evidence.update(expected_boot_id=boot_id, actual_boot_id=facts.boot_id)
        why = (f"pid {facts.pid} now belongs to another process ({facts.name or 'unnamed'}, "
               f"{identity_mismatch(facts, start_time, start_ticks, boot_id)}) and the run wrote no terminal event")
    else:
        why = f"process {facts.pid} is gone without writing run_finished, run_stopped or run_failed"
    if last_event is not None:
        evidence.update(last_kind=last_event.get("kind"), last_step=last_event.get("step"),
                        last_event_time=last_event.get("time"))
        why += f"; its last event: {last_event.get('kind')} at step {last_event.get('step')}"
    elif last_log_line:
        evidence["last_log_line"] = last_log_line
        why += f"; it wrote no event; train.log ends: {last_log_line[:200]}"
    else:
        why += "; it wrote no event (see train.log)"
    return Anomaly(VANISHED, why, evidence, now)


def orphaned(launcher_pid: int, trainer_pid: int, stop_command: str, now: float) -> Anomaly:
    """torchrun's agent (the launched process) is gone, but its workers train on: rank 0 still holds the run
    directory. The workers stop by themselves within seconds (trainer/agent_watch.py); one that has not is stopped
    by `train_run stop`, which then signals rank 0."""
    return Anomaly(ORPHANED, f"torchrun's agent, pid {launcher_pid}, is gone, but its workers still run (rank 0: pid "
                             f"{trainer_pid} holds the run directory); {stop_command} checkpoints and stops them",
                   {"pid": launcher_pid, "trainer_pid": trainer_pid}, now)


def identity_mismatch(facts: ProcessFacts, start_time: float | None, start_ticks: int | None,
                      boot_id: str | None) -> str:
    """Why a live pid is not the recorded process, in words: which recorded start it fails to match."""
    if start_ticks is not None and facts.start_ticks is not None:
        if boot_id and facts.boot_id and boot_id != facts.boot_id:
            return "the host rebooted since the run started: the pid was reused"
        return f"started {facts.start_ticks} clock ticks after boot, not {start_ticks}: the pid was reused"
    if start_time is not None and facts.create_time is not None:
        return (f"its start time reads {facts.create_time - start_time:+.1f} s from the recorded one: the pid was "
                "reused, or the clock was stepped since; the record has no boot-relative start to tell which")
    return "started later: the pid was reused"


def run_file(name: str, problem: str, now: float) -> Anomaly:
    """A file of the run directory that cannot be read as one (a directory, a FIFO, a socket, no permission;
    a train.pid that `train_run start` did not write): it is left unread, and says so instead of hanging."""
    return Anomaly(RUN_FILE, f"{name} cannot be read: {problem}", {"file": name, "problem": problem}, now)


def events_gone(pid: int, alive: bool, ended: bool, present: bool, written_to: str | None,
                now: float) -> Anomaly | None:
    """A live trainer whose events are not where readers look: events.jsonl was moved or deleted under the run
    (rotation by rename), so none of its new events reach status, watch or the monitor. `written_to`: the file
    the trainer appends to instead, where the OS says (/proc); else all there is to go by is that events.jsonl
    is not `present` while the trainer lives (the caller knows it had one). A trainer of this version starts
    a new events.jsonl at its next event, which ends the anomaly; an older one never does."""
    if not alive or ended or (written_to is None and present):
        return None
    if written_to is not None:
        message = (f"events.jsonl was moved or deleted under the running trainer (pid {pid}), which appends its "
                   f"events to {written_to}: they are not seen here until it starts a new events.jsonl (at its "
                   "next event)")
    else:
        message = (f"events.jsonl is gone while the trainer (pid {pid}) is alive: it was moved or deleted under the "
                   "run, and its new events are not seen here until it starts a new one (at its next event)")
    return Anomaly(EVENTS_GONE, message, {"pid": pid, "written_to": written_to, "events_file_present": present}, now)


def stalled(facts: ProcessFacts, alive: bool, ended: bool, last_output_time: float, now: float,
            thresholds: AnomalyThresholds) -> Anomaly | None:
    """The process is alive and the run not ended, but nothing was written for `stall_seconds`."""
    quiet = now - last_output_time
    if not alive or ended or quiet < thresholds.stall_seconds:
        return None
    return Anomaly(STALLED, f"no new output in events.jsonl or train.log for {quiet:.0f} s "
                            f"(limit {thresholds.stall_seconds:g} s) while pid {facts.pid} is alive",
                   {"pid": facts.pid, "quiet_seconds": quiet, "last_output_time": last_output_time,
                    "stall_seconds": thresholds.stall_seconds}, now)
