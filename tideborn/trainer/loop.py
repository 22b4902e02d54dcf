"""The training loop: steps, logging, evaluation, checkpoints, stopping, and exactly one terminal event.

`prepare` checks everything that can be wrong with the user's input and writes nothing; `Trainer.run`
then owns the run directory until it returns. Under torchrun every rank runs the loop; only rank 0
writes events, checkpoints and progress, and every decision that ends the loop (a stop signal that
reached some ranks, a non-finite loss) is agreed by all ranks before it is acted on.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
import time
import traceback
import typing
from dataclasses import dataclass
from pathlib import Path

import torch

from tideborn.config.load import Resolved
from tideborn.config.schema import SettingError, Settings
from tideborn.data.decode.targets import value_lambda_at
from tideborn.data.training.opened import OpenedData, open_data
from tideborn.errors import Interrupted, UserError
from tideborn.humanize import duration
from tideborn.rundir.access import check_run_dir
from tideborn.rundir.events import EventWriter
from tideborn.rundir.files import boot_relative_start
from tideborn.rundir.kinds import (
    Compile,
    EventRecord,
    Gpu,
    RunEnded,
    RunFailed,
    RunFinished,
    RunStarted,
    RunStopped,
    RunWarning,
    Step,
    Watchdog,
)
from tideborn.rundir.layout import EVENTS_FILE, temp_checkpoints
from tideborn.rundir.lock import RunDirLock
from tideborn.safefile import make_dirs, os_error_text
from tideborn.trainer.agent_watch import AgentWatch
from tideborn.trainer.checkpointer import Checkpointer
from tideborn.trainer.device import DeviceSetup, resolve_device
from tideborn.trainer.distributed import (
    StopVote,
    any_rank,
    barrier,
    close_process_group,
    failure_elsewhere,
    init_process_group,
    report_failure,
    restart_count_of_job,
    worker_identities,
)
from tideborn.trainer.duties import Duties
from tideborn.trainer.gpu_stats import gpu_snapshot
from tideborn.trainer.lineage import set_aside_other_lineages
from tideborn.trainer.metrics import MetricsWindow
from tideborn.trainer.preflight import check_request, nothing_to_train, stop_at_step_too_early
from tideborn.trainer.progress import StepProgress
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint, choose_start
from tideborn.trainer.signals import StopRequest
from tideborn.trainer.state import TrainingState, versions
from tideborn.trainer.step_duties import evaluate, export_final, export_for_engine, play_match
from tideborn.trainer.watchdog import GradientWatchdog


@dataclass(frozen=True)
class Prepared:
    settings: Settings
    run_dir: Path
    setup: DeviceSetup
    start: StartPoint
    fresh: bool
    stop_at_step: int | None
    argv: list[str]
    env: DistEnv = DistEnv()
    data: OpenedData = OpenedData()
    """The teacher data, opened once (`data.training.opened`): the training state takes it over."""


def prepare(resolved: Resolved, resume: Path | None = None, fresh: bool = False,
            stop_at_step: int | None = None, argv: list[str] | None = None,
            env: DistEnv = DistEnv(), opened: OpenedData | None = None) -> Prepared | None:
    """Validate the request without writing anything, and open the teacher data (once: hcpe3 files decoded into
    their caches, a malformed game refused here). None means there is nothing to train. `opened`: the data as
    this process opened it already (local rank 0 under torchrun, `_build_data_caches_once`), taken over."""
    try:
        settings = per_process_settings(resolved.settings, env.world_size)
        # the data's quick checks are the command's (`preflight`); opening it below makes the thorough ones
        run_dir = check_request(settings, resume, fresh, stop_at_step).absolute()  # events name absolute paths
        setup = resolve_device(settings.runtime, env.local_rank if env.distributed else None)
        start = choose_start(settings, run_dir, resume, fresh)
        if start.payload is not None:
            start.warnings.extend(world_size_change(start.checkpoint, start.payload, settings, env.world_size))
        max_steps = settings.runtime.max_steps
        if stop_at_step is not None and not start.step < stop_at_step <= max_steps:
            raise UserError(stop_at_step_too_early(stop_at_step, start.step, max_steps))
        if start.step >= max_steps:
            if env.is_main:
                print(nothing_to_train(start.checkpoint, start.step, max_steps))
            if opened is not None:
                opened.close()
            return None
    except BaseException:
        if opened is not None:
            opened.close()
        raise
    if opened is None:
        opened = open_data(settings.data, settings.paths.data_root)
    return Prepared(settings, run_dir, setup, start, fresh, stop_at_step, list(argv or sys.argv), env, opened)


def per_process_settings(settings: Settings, world_size: int) -> Settings:
    """The settings one of `world_size` processes trains with: `optim.global_batch_size` split among them
    (`OptimSettings.split_among`), or the settings as they are; a world size that cannot split it is a user
    error, before anything is written."""
    try:
        optim = settings.optim.split_among(world_size)
    except SettingError as exc:
        raise UserError(f"--set {exc}") from None
    return settings if optim is settings.optim else dataclasses.replace(settings, optim=optim)


def world_size_change(checkpoint: Path | None, payload: dict, settings: Settings, world_size: int) -> list[str]:
    """The warning a resume at another world size owes when the batch is per process: the global batch changes
    with it (the data order goes on where it was; nothing is scaled to make up for it)."""
    before = int(payload.get("world_size", 1))
    if before == world_size or settings.optim.global_batch_size:
        return []
    old_optim = (payload.get("settings") or {}).get("optim") or {}
    per_rank = int(old_optim.get("batch_size", settings.optim.batch_size))
    return [f"resumed from {checkpoint} at world size {world_size}, written at {before}: optim.batch_size is per "
            f"process, so the global batch is now {settings.optim.batch_size * world_size} positions a step, not "
            f"{per_rank * before}; the learning rate and schedule are not scaled for it (set "
            "optim.global_batch_size to hold the global batch constant)"]


class _NoEvents:
    """Ranks other than 0 write no events."""

    def emit(self, record: type[EventRecord], **fields: object) -> None:
        return None

    def close(self) -> None:
        return None


class _Halted(Exception):
    """The run ends here without saving, its `run_failed` written (a watchdog trip, a non-finite loss); `code` is
    the exit status. Raised by the loop's checks and caught once, in `Trainer._loop`."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class Trainer:
    """One attempt of a run: owns the run directory (its lock) from `run` until it returns, trains to the
    attempt's end, and writes exactly one terminal event. The checkpoints are the `Checkpointer`'s; the duties
    beside training, `step_duties`'; when each is due, `duties`'."""

    def __init__(self, prepared: Prepared, stop: StopRequest | None = None, agent_watch: AgentWatch | None = None,
                 workers: tuple[dict, ...] = ()):
        self.p = prepared
        self.agent_watch = agent_watch
        """Under torchrun: whether the agent this worker started under is gone (agent_watch.py)."""
        self.workers = workers
        """Under torchrun: every rank's process, recorded in the lock for `train_run stop` (worker_identities)."""
        self.settings = prepared.settings
        self.setup = prepared.setup
        self.env = prepared.env
        self.progress = StepProgress(self.settings.runtime.progress if self.env.is_main else "off")
        # The CLI installs the handler before torch loads, so a stop during start-up is not lost.
        self.stop = stop or StopRequest().install()
        self.started = time.perf_counter()
        self.step = prepared.start.step
        self.events: EventWriter | _NoEvents = _NoEvents()
        self.state: TrainingState | None = None
        self.watchdog: GradientWatchdog | None = None
        # The loop's own parts, made when it starts (they need the training state): when each duty is due,
        # and the steps since the last step event.
        self.duties: Duties | None = None
        self.window: MetricsWindow | None = None
        self.data_watch = None
        """With `data.watch`: rescans, the `data_window` events and the wait for data (trainer/data_watch.py)."""
        self.checkpoints = Checkpointer(prepared.run_dir, self.settings.runtime, prepared.start, self.env.is_main,
                                        self)
        self.skipped_reported = 0
        self.announced = False
        """run_started is in the events: from then on the attempt owes them exactly one terminal event."""
        self.events_lost = False
        """A terminal event could not be written (a full disk): the exit status must say the run went wrong."""

    def emit(self, record: type[EventRecord], **fields: object) -> None:
        """An event of the current step (`Reporter`, for the checkpointer and the duties)."""
        self.events.emit(record, step=self.step, **fields)

    def say(self, text: str) -> None:
        """A progress line on stderr (`Reporter`)."""
        self.progress.message(text)

    def run(self) -> int:
        p = self.p
        self.stop.defer_ctrl_c()  # the run directory is written from here: a Ctrl-C now ends the attempt in its events
        if not self.env.is_main:
            return self._guarded([], None)
        try:
            make_dirs(p.run_dir)
        except OSError as exc:
            raise UserError(f"runtime.out_dir: cannot create {p.run_dir}: {os_error_text(exc)}") from None
        check_run_dir(p.run_dir)  # again, now that it exists: ours, writable, no links planted since preflight
        # Under torchrun (one worker or several), the process `train_run start` launched is the agent, this rank's
        # parent; train.pid must go on naming it, so that `stop` reaches the agent.
        with RunDirLock(p.run_dir, launched_pid=os.getppid() if self.env.under_agent else None, workers=self.workers):
            try:
                archived = self.checkpoints.archive_for_fresh() if p.fresh else None
                warnings = list(p.start.warnings)
                warnings += set_aside_other_lineages(p.run_dir, p.start)
                for temp in temp_checkpoints(p.run_dir):
                    temp.unlink(missing_ok=True)
                    warnings.append(f"removed {temp.name}, left by a checkpoint save that did not finish")
                self.events = EventWriter(p.run_dir / EVENTS_FILE)
            except OSError as exc:  # before run_started: bad ground to start on, not a failed run
                raise UserError(f"runtime.out_dir: cannot prepare {p.run_dir}: {os_error_text(exc)}") from None
            return self._guarded(warnings, archived)

    def _guarded(self, warnings: list[str], archived: Path | None) -> int:
        try:
            code = self._run(warnings, archived)
            return 1 if self.events_lost and code == 0 else code
        finally:
            self.stop.uninstall()
            self.progress.end_line()
            self.events.close()
            if self.state is not None:
                self.state.close()
            else:
                self.p.data.close()

    def _run(self, warnings: list[str], archived: Path | None) -> int:
        p = self.p
        try:
            resumed_threads = p.start.payload.get("cpu_threads") if p.start.payload is not None else None
            self.state = TrainingState(self.settings, self.setup, self.env, p.data, resumed_threads)
            self.state.restore(p.start)
            self._announce(warnings, archived)
            return self._loop()
        except UserError as exc:  # bad input met only now (a bad record, data that changed under a cursor)
            self.progress.end_line()
            report_failure(self.env, str(exc))
            if self.announced:
                self._terminal(RunFailed, error=str(exc), traceback=None, rank=self.env.rank)
            # else the attempt was refused before its run_started (a checkpoint's data cursor that does not fit
            # the files, say): nothing started, so there is no run_failed to write, and the error is the one line
            raise
        except Exception as exc:  # any failure after run_started must still end with one terminal event
            self.progress.end_line()
            text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
            report_failure(self.env, text)
            other = failure_elsewhere(self.env)
            if other and not other.startswith(f"rank {self.env.rank}:"):
                text = f"{other} (rank {self.env.rank} then saw: {text})"
            self._terminal(RunFailed, error=text, traceback=traceback.format_exc(limit=20),
                           rank=self.env.rank)
            traceback.print_exc()
            print(f"run failed at step {self.step} (rank {self.env.rank}): {text}", file=sys.stderr)
            return 1

    def _announce(self, warnings: list[str], archived: Path | None) -> None:
        """`run_started`, then the attempt's warnings (credited to it) and what it trains, on stderr."""
        s, p, state = self.settings, self.p, self.state
        assert state is not None
        summary = state.data.summary
        self.emit(RunStarted, **started_fields(p, self.setup, state, archived))
        if summary is not None and summary.average is not None:
            average = summary.average
            self.say(f"data.use_average: {average.inputs:,} positions merged into {average.positions:,} "
                     f"({average.merged:,} duplicates)")
            if average.skipped:  # left out while merging, so the loader never counts them: say it here
                warnings = [*warnings, f"data.use_average: left out {average.skipped:,} teacher record(s) with "
                                       f"an empty or illegal move (data.bad_records=\"skip\")"]
        self.announced = True
        # Stop signals become events as they arrive (`stop_requested`, a repeat's `warning`), so a second
        # `stop` or a monitor sees a stop in progress even in the middle of a long step or save.
        self.stop.listen(lambda record, fields: self.emit(record, **fields))
        for text in warnings + eval_scale_warnings(state, s):
            self.emit(RunWarning, message=text)
            self.say(f"warning: {text}")
        for text in state.data.take_warnings():  # said on stderr as the data was opened
            self.emit(RunWarning, message=text)
        where = f"resuming from {p.start.checkpoint} at step {self.step}" if p.start.checkpoint else "from step 0"
        ranks = f" x {self.env.world_size} processes" if self.env.distributed else ""
        if state.threads.source == "checkpoint":
            self.say(f"CPU threads: {state.cpu_threads}, as the run resumed from used, so that it resumes exactly "
                     "(runtime.threads = 0); set runtime.threads to choose")
        self.say(f"training {s.model.blocks}x{s.model.channels} on {self.setup.describe()}{ranks}, {where}, to step "
                 f"{s.runtime.max_steps}; run directory {p.run_dir}")

    def _loop(self) -> int:
        """Train to the attempt's end. Each periodic duty says when it is due (trainer/duties.py); a check that
        ends the run unsaved raises `_Halted`, which ends it here, the stop votes in flight drained first."""
        s, state, env = self.settings, self.state, self.env
        assert state is not None
        self.watchdog = GradientWatchdog(s.watchdog, nonfinite_is_skipped=state.scaler is not None)
        self.watchdog.load_state_dict(self.p.start.payload.get("watchdog") if self.p.start.payload is not None
                                      else None)
        decays = state.value_lambda_decays
        self.window = MetricsWindow(self.setup.device, env, s.optim.batch_size,
                                    (lambda step: value_lambda_at(step - 1, s.loss)) if decays else None,
                                    state.allreduce_counter)
        self.duties = Duties.of(s.runtime, self.p.stop_at_step, evaluating=state.evaluator is not None,
                                main=env.is_main, cuda=self.setup.is_cuda)
        stop_vote = StopVote(env, self.setup.device)
        if state.data.window is not None:
            from tideborn.trainer.data_watch import WatchDuty

            self.data_watch = WatchDuty(state.data.window, self.events, self.progress, self.stop,
                                        self.p.start.checkpoint, lambda: self.step)
        try:
            while True:
                signalled = stop_vote(self.stop.reason is not None)
                if signalled or self.duties.horizon.reached(self.step):
                    break
                if self.data_watch is not None and not self.data_watch.ready():
                    continue  # waited for data and was stopped meanwhile: the vote above ends the loop
                self._train_step()
                self._periodic_duties(final=self.duties.horizon.is_final(self.step))
            stop_vote.drain()
            return self._end(signalled)
        except _Halted as halted:
            stop_vote.drain()
            return halted.code

    def _train_step(self) -> None:
        """One optimizer step, added to the metrics window and the watchdog; a `gpu` event before it when one is
        due, the `compile` event after the first."""
        assert self.state is not None and self.watchdog is not None
        if self.duties.gpu.should_run():
            self.emit(Gpu, **gpu_snapshot(self.setup.device))
        started = time.perf_counter()
        result = self.state.train_step(self.step)
        if self.duties.compile_report.should_run():
            # torch.compile compiles lazily, inside the first step: time that step (synchronised).
            if self.setup.is_cuda:
                torch.cuda.synchronize(self.setup.device)
            seconds = time.perf_counter() - started
            self.events.emit(Compile, step=self.step + 1, first_step_seconds=seconds)
            self.say(f"torch.compile: the first step took {seconds:.1f} s (compilation included)")
        self.step += 1
        self.window.add(result)
        self.watchdog.add(self.step, result.grad_norm)

    def _periodic_duties(self, final: bool) -> None:
        """What is due after a step, in this order: the `step` event, evaluation, a checkpoint and its match, the
        engine's export. `final`: the attempt's last step, where the first three are all due."""
        state = self.state
        assert state is not None and self.watchdog is not None
        if self.duties.log.should_run(self.step, final):
            self._judge(self._log())
        if self.duties.evaluate.should_run(self.step, final):
            evaluate(state, self.settings, self.setup, self.step, self)
        if self.duties.checkpoint.should_run(self.step, final):
            self._checkpoint(final)
        if self.duties.engine_export.should_run(self.step, self.duties.horizon.finished(self.step)):
            export_for_engine(state, self.step, self.p.run_dir, self.settings.runtime.export_keep,
                              self.watchdog.streak_open, self)

    def _log(self) -> list[float]:
        """Close the metrics window: its `step` event, newly skipped records, the progress line. Returns its
        means (loss, policy, value, grad norm)."""
        runtime = self.settings.runtime
        read = self.window.read(self.step)
        self.events.emit(Step, **read.record)
        self._report_skipped_records()
        self.progress.step(self.step, runtime.max_steps, read.record,
                           (runtime.max_steps - self.step) * read.seconds / self.window.steps)
        self.window.reset()
        return read.means

    def _judge(self, means: list[float]) -> None:
        """After a `step` event: halt on a watchdog trip, or on a non-finite loss (runtime.stop_on_nonfinite)."""
        self._halt_if_tripped()
        if self.settings.runtime.stop_on_nonfinite and not all(math.isfinite(v) for v in means[:3]):
            raise _Halted(self._fail_nonfinite(means))

    def _checkpoint(self, final: bool) -> None:
        # Never save the weights of the steps since a trip; their step event is written first, so that every
        # step's norm is in the events. Nor weights that took a non-finite loss, whatever stop_on_nonfinite says.
        self._halt_if_tripped(flush=self._log if self.window.steps else None)
        if not self.window.finite_on_every_rank():
            raise _Halted(self._fail_nonfinite(self.window.means()))
        if self.data_watch is not None:  # before the save, so that it records the window the run goes on with
            self.data_watch.rescan()
        saved = self._save()
        if saved is None:  # ranks other than 0 save nothing, so keep no reference and play no match
            return
        if self.duties.keep_reference:
            self.checkpoints.keep_reference(saved)
        if self.duties.match.should_run(self.step, final) and self.stop.reason is None:
            play_match(saved, self.checkpoints, self.settings, self.setup.device, self.step, self)

    def _save(self) -> Path | None:
        """Save this step (rank 0 writes it); a repeated Ctrl-C never cuts a save short (trainer/signals.py)."""
        state, watchdog = self.state, self.watchdog
        assert state is not None and watchdog is not None
        with self.stop.saving():
            return self.checkpoints.save(
                self.step, lambda healthy_step: {**state.payload(self.step),
                                                  "watchdog": watchdog.state_dict(healthy_step)},
                healthy=not watchdog.streak_open)

    def _end(self, signalled: bool) -> int:
        """The loop is over (the final step, or a stop agreed by the ranks): log and judge the steps not yet
        logged, save the last step if it is not saved, and write the terminal event."""
        if self.window.steps:
            self._judge(self._log())
        if self.checkpoints.saved_step != self.step:
            self._save()
        last_saved = self.checkpoints.last_saved
        if self.duties.horizon.finished(self.step):
            if self.duties.export.should_run(self.step, final=True):
                assert self.state is not None and last_saved is not None
                export_final(self.state, self.step, last_saved, self)
            self._terminal(RunFinished, checkpoint=str(last_saved))
            elapsed = duration(time.perf_counter() - self.started)
            self.say(f"finished at step {self.step} in {elapsed}; checkpoint {last_saved}")
            return 0
        reason = self.stop.reason or ("SIGTERM" if signalled else "stop_at_step")
        orphaned = {}
        if self.agent_watch is not None and self.agent_watch.parent_gone():
            # The stop came from a worker that found torchrun's agent dead (its own SIGTERM, or another rank's).
            reason, orphaned = "agent_gone", {"agent_pid": self.agent_watch.parent}
        self._terminal(RunStopped, reason=reason, checkpoint=str(last_saved) if last_saved else None,
                       repeated_signals=self.stop.repeated, **orphaned)
        if self.step == self.p.start.step:  # stopped during start-up: this attempt trained and saved nothing
            if reason == "SIGINT":  # Ctrl-C: the command says so in one line, exit status 130
                raise Interrupted(" before the first step; no checkpoint was written, the events end in run_stopped")
            self.say(f"stopped ({reason}) before the first step (step {self.step}); no checkpoint was written")
            return 0
        self.say(f"stopped ({reason}) at step {self.step}; checkpoint {last_saved}")
        return 0

    def _halt_if_tripped(self, flush: typing.Callable[[], object] | None = None) -> None:
        """Judge the gradient norms since the last check (every rank: the decision is agreed); on a trip, call
        `flush` (the pending step event), write the `watchdog` event and `run_failed`, say so, and halt the run
        without saving."""
        assert self.watchdog is not None
        if not self.watchdog.enabled:
            return
        trip = self.watchdog.check()
        if not any_rank(trip is not None, self.env, self.setup.device):
            return
        if flush is not None:
            flush()
        text = trip.text() if trip is not None else "gradient watchdog tripped on another rank"
        if trip is not None:
            self.emit(Watchdog, resume_from=_text_or_none(self.checkpoints.healthy_checkpoint()),
                      **trip.event_fields())
        resume = self.checkpoints.set_aside_unhealthy("saved while the gradient norm was spiking")
        text += f"; stopped without saving, {_resume_point(resume)}; settings: [watchdog]"
        self._terminal(RunFailed, error=text, traceback=None, resume_from=_text_or_none(resume))
        self.say(f"run failed: {text}")
        raise _Halted(1)

    def _fail_nonfinite(self, means: list[float]) -> int:
        resume = self.checkpoints.set_aside_unhealthy(
            "saved while the gradient norm was spiking before the non-finite loss")
        text = (f"non-finite loss at step {self.step} (loss {means[0]}, policy {means[1]}, value {means[2]}); "
                f"stopped without saving, {_resume_point(resume)} (runtime.stop_on_nonfinite)")
        self._terminal(RunFailed, error=text, traceback=None, resume_from=_text_or_none(resume))
        self.say(f"run failed: {text}")
        return 1

    def _report_skipped_records(self) -> None:
        assert self.state is not None
        skipped = self.state.data.skipped
        if skipped.count > self.skipped_reported:
            text = (f"skipped {skipped.count - self.skipped_reported} teacher record(s) with an empty or illegal "
                    f"move ({skipped.count} in all; data.bad_records=\"skip\")")
            self.emit(RunWarning, message=text, skipped_records=skipped.count, examples=list(skipped.examples))
            self.say(f"warning: {text}")
            self.skipped_reported = skipped.count

    def _terminal(self, record: type[RunEnded], **fields: object) -> None:
        """End the attempt in the events. Without its run_started in the file, a terminal event would seem to
        end the attempt before; a write that fails (a full disk) cannot be reported in the events. Either
        way stderr says so and the exit status is non-zero."""
        self.stop.listen(None)  # nothing may follow the terminal event: a later stop signal is only noted on stderr
        if not self.announced:
            self.events_lost = True
            _tell(f"{record.KIND} not written to {EVENTS_FILE}: this attempt's run_started is not there")
            return
        try:
            self.emit(record, pid=os.getpid(), elapsed_seconds=time.perf_counter() - self.started, **fields)
        except OSError as exc:
            self.events_lost = True
            _tell(f"could not write {record.KIND} to {self.p.run_dir / EVENTS_FILE}: {exc}")


def started_fields(p: Prepared, setup: DeviceSetup, state: TrainingState, archived: Path | None) -> dict:
    """The `run_started` event's fields (`step` is the caller's to add)."""
    s, env, summary = p.settings, p.env, state.data.summary
    return dict(
        settings=s.to_dict(), device=setup.describe(), precision=setup.precision, cpu_threads=state.cpu_threads,
        cpu_threads_source=state.threads.source, world_size=env.world_size, restart_count=env.restart_count,
        max_restarts=env.max_restarts, global_batch_size=s.optim.batch_size * env.world_size, versions=versions(),
        resumed_from=str(p.start.checkpoint) if p.start.checkpoint else None,
        changed_settings=p.start.changed_settings, fresh=p.fresh, archived_to=str(archived) if archived else None,
        pid=os.getpid(),
        # torchrun's agent is the launcher at any world size (an elastic job on one node is one process):
        # train_run start and status know their launch by it.
        launcher_pid=os.getppid() if env.distributed or env.under_agent else None,
        host=socket.gethostname(), argv=p.argv, max_steps=s.runtime.max_steps, batch_size=s.optim.batch_size,
        run_dir=str(p.run_dir), data=summary.event_fields() if summary is not None else None,
        **boot_relative_start(os.getpid()), eval_scales=eval_scales(state, s))


def eval_scales(state: TrainingState, settings: Settings) -> dict[str, float] | None:
    """`run_started.eval_scales`: each teacher file's eval scale with `data.eval_scale_fit = "per_file"`."""
    if settings.data.eval_scale_fit != "per_file":
        return None
    from tideborn.data.sets.evalfix import scales_field  # teacher data only: cshogi is not needed otherwise

    fits = list(state.data.scale_fits)
    if state.evaluator is not None:
        fits += state.evaluator.scale_fits
    return scales_field(fits)


def eval_scale_warnings(state: TrainingState, settings: Settings) -> list[str]:
    if settings.data.eval_scale_fit != "per_file":
        return []
    from tideborn.data.sets.evalfix import fit_warning

    found = [fit_warning(fit, "data.train") for fit in state.data.scale_fits if fit.problem]
    if state.evaluator is not None:
        found += [fit_warning(fit, "data.test") for fit in state.evaluator.scale_fits if fit.problem]
    return found


def _text_or_none(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def _resume_point(checkpoint: Path | None) -> str:
    if checkpoint is None:
        return "and there is no healthy checkpoint to resume from yet"
    return f"the newest healthy checkpoint ({checkpoint}) is the one to resume from (train does so by default)"


def _tell(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass  # stderr is on the full disk too: the exit status is all that is left to say it


def _build_data_caches_once(resolved: Resolved, env: DistEnv) -> OpenedData | None:
    """Under torchrun, local rank 0 of each node opens the data, decoding the hcpe3 files (and building the
    averaged set) into their caches, while the other ranks wait at a barrier, then they read what it wrote: one
    decode a node, not one a process. Local rank 0 hands what it opened on (to `prepare`); the others get None
    and open the data themselves. Its failure (a malformed file) is raised after the barrier; the other ranks
    then meet the same problem in their own opening. A decode longer than `runtime.dist_timeout_seconds` times
    the waiting ranks out: build the caches first (`tideborn data inspect FILE.hcpe3`)."""
    failure: UserError | None = None
    opened = None
    if env.local_rank == 0:
        data = resolved.settings.data
        try:
            opened = open_data(data, resolved.settings.paths.data_root)
            if data.use_average and opened.train is not None:
                from tideborn.data.sets.average import averaged_source

                averaged_source(opened.train, data).close()  # (the training source reopens its files when read)
        except UserError as exc:
            if opened is not None:
                opened.close()
            opened, failure = None, exc
    barrier(env)
    if failure is not None:
        raise failure
    return opened


def run_training(resolved: Resolved, resume: Path | None = None, fresh: bool = False,
                 stop_at_step: int | None = None, argv: list[str] | None = None,
                 stop: StopRequest | None = None, env: DistEnv = DistEnv()) -> int:
    runtime = resolved.settings.runtime
    device = resolve_device(runtime, env.local_rank if env.distributed else None).device
    agent_watch = AgentWatch.start_if_under_agent() if env.under_agent else None
    init_process_group(env, device, runtime.dist_timeout_seconds)
    try:
        env = restart_count_of_job(env, device)
        workers = worker_identities(env) if agent_watch is not None else ()
        opened = _build_data_caches_once(resolved, env) if env.distributed else None
        prepared = prepare(resolved, resume, fresh, stop_at_step, argv, env, opened)
        # Every rank has read its start point before rank 0 may archive, prune or write anything.
        barrier(env)
        if prepared is None:
            return 0
        return Trainer(prepared, stop, agent_watch, workers).run()
    finally:
        if agent_watch is not None:
            agent_watch.close()
        close_process_group()
