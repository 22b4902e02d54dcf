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
import stat
import sys
import time
import traceback
import typing
from dataclasses import dataclass
from pathlib import Path

import torch

from tideborn.config import Resolved, SettingError, Settings
from tideborn.data.targets import value_lambda_at
from tideborn.errors import Interrupted, UserError
from tideborn.humanize import duration
from tideborn.network.checkpoint import REFERENCE_STEP_KEY, prune_checkpoints, save_checkpoint
from tideborn.rundir import (
    ARCHIVE_DIR,
    EVENTS_FILE,
    EXPORT_DIR,
    MATCH_REFERENCE_FILE,
    WATCHDOG_ARCHIVE,
    check_run_dir,
    checkpoint_name,
    list_checkpoints,
    move_to_archive,
    parse_step,
    refuse_link,
    temp_checkpoints,
)
from tideborn.rundir.events import EventWriter
from tideborn.rundir.files import boot_relative_start
from tideborn.rundir.lock import RunDirLock
from tideborn.safefile import link_atomically, make_dirs, os_error_text
from tideborn.trainer.agent_watch import AgentWatch
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
from tideborn.trainer.preflight import nothing_to_train, preflight, stop_at_step_too_early
from tideborn.trainer.progress import StepProgress
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint, choose_start
from tideborn.trainer.signals import StopRequest
from tideborn.trainer.state import TrainingState, versions
from tideborn.trainer.watchdog import GradientWatchdog, healthy_step_of


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


def prepare(resolved: Resolved, resume: Path | None = None, fresh: bool = False,
            stop_at_step: int | None = None, argv: list[str] | None = None,
            env: DistEnv = DistEnv()) -> Prepared | None:
    """Validate the request without writing anything. None means there is nothing to train."""
    settings = per_process_settings(resolved.settings, env.world_size)
    run_dir = preflight(settings, resume, fresh, stop_at_step).absolute()  # events name absolute paths
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
        return None
    return Prepared(settings, run_dir, setup, start, fresh, stop_at_step, list(argv or sys.argv), env)


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

    def emit(self, kind: str, **fields: object) -> None:
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
        self.last_saved: Path | None = prepared.start.checkpoint
        """The checkpoint of the newest save (None on ranks other than 0), or the one the attempt resumed from."""
        self.saved_step = prepared.start.step
        start = prepared.start.payload
        self.healthy_step: int | None = healthy_step_of(start) if start is not None else None
        """The step of the newest checkpoint saved with no gradient spike streak open: pruning keeps it, and
        a trip or a non-finite loss leaves it as the resume point (trainer/watchdog.py)."""
        self.skipped_reported = 0
        self.announced = False
        """run_started is in the events: from then on the attempt owes them exactly one terminal event."""
        self.events_lost = False
        """A terminal event could not be written (a full disk): the exit status must say the run went wrong."""
        recorded = (prepared.start.payload or {}).get(REFERENCE_STEP_KEY)
        whole = isinstance(recorded, int) and not isinstance(recorded, bool)
        self.reference_step: int | None = recorded if whole else None
        """The step of the run's match reference (match-reference.pt), carried in every checkpoint so that a
        reference deleted or replaced later is noticed (restored from its step file, or a re-baseline said)."""

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
                archived = self._archive_for_fresh() if p.fresh else None
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

    def _archive_for_fresh(self) -> Path | None:
        run_dir = self.p.run_dir
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
        self.progress.message(f"--fresh: moved {len(doomed)} file(s) (old checkpoints, events, match reference, "
                              f"exports) to {archive}")
        return archive

    def _run(self, warnings: list[str], archived: Path | None) -> int:
        s, p = self.settings, self.p
        try:
            resumed_threads = p.start.payload.get("cpu_threads") if p.start.payload is not None else None
            self.state = TrainingState(s, self.setup, self.env, resumed_threads)
            self.state.restore(p.start)
            self.events.emit(
                "run_started", step=self.step, settings=s.to_dict(), device=self.setup.describe(),
                precision=self.setup.precision, cpu_threads=self.state.cpu_threads,
                cpu_threads_source=self.state.threads.source, world_size=self.env.world_size,
                restart_count=self.env.restart_count, max_restarts=self.env.max_restarts,
                global_batch_size=s.optim.batch_size * self.env.world_size,
                versions=versions(),
                resumed_from=str(p.start.checkpoint) if p.start.checkpoint else None,
                changed_settings=p.start.changed_settings, fresh=p.fresh,
                archived_to=str(archived) if archived else None, pid=os.getpid(),
                # torchrun's agent is the launcher at any world size (an elastic job on one node is one process):
                # train_run start and status know their launch by it.
                launcher_pid=os.getppid() if self.env.distributed or self.env.under_agent else None,
                host=socket.gethostname(), argv=p.argv, max_steps=s.runtime.max_steps,
                batch_size=s.optim.batch_size, run_dir=str(p.run_dir), data=getattr(self.state.data, "summary", None),
                **boot_relative_start(os.getpid()), eval_scales=self._eval_scales(),
            )
            average = (getattr(self.state.data, "summary", None) or {}).get("average")
            if average:
                self.progress.message(f"data.use_average: {average['inputs']:,} positions merged into "
                                      f"{average['positions']:,} ({average['merged']:,} duplicates)")
                if average.get("skipped"):  # left out while merging, so the loader never counts them: say it here
                    warnings = [*warnings, f"data.use_average: left out {average['skipped']:,} teacher record(s) "
                                           f"with an empty or illegal move (data.bad_records=\"skip\")"]
            self.announced = True
            # Stop signals become events as they arrive (`stop_requested`, a repeat's `warning`), so a second
            # `stop` or a monitor sees a stop in progress even in the middle of a long step or save.
            self.stop.listen(lambda kind, fields: self.events.emit(kind, step=self.step, **fields))
            for text in warnings + self._eval_scale_warnings():  # after run_started: credited to this attempt
                self.events.emit("warning", step=self.step, message=text)
                self.progress.message(f"warning: {text}")
            caches = sys.modules.get("tideborn.data.cachefile")  # loaded only where teacher data was opened
            for text in caches.take_cache_warnings() if caches else []:  # said on stderr as the data was opened
                self.events.emit("warning", step=self.step, message=text)
            where = f"resuming from {p.start.checkpoint} at step {self.step}" if p.start.checkpoint else "from step 0"
            ranks = f" x {self.env.world_size} processes" if self.env.distributed else ""
            if self.state.threads.source == "checkpoint":
                self.progress.message(f"CPU threads: {self.state.cpu_threads}, as the run resumed from used, so that "
                                      "it resumes exactly (runtime.threads = 0); set runtime.threads to choose")
            self.progress.message(f"training {s.model.blocks}x{s.model.channels} on {self.setup.describe()}{ranks}, "
                                  f"{where}, to step {s.runtime.max_steps}; run directory {p.run_dir}")
            return self._loop()
        except UserError as exc:  # bad input met only now (a bad record, data that changed under a cursor)
            self.progress.end_line()
            report_failure(self.env, str(exc))
            if self.announced:
                self._terminal("run_failed", error=str(exc), traceback=None, rank=self.env.rank)
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
            self._terminal("run_failed", error=text, traceback=traceback.format_exc(limit=20),
                           rank=self.env.rank)
            traceback.print_exc()
            print(f"run failed at step {self.step} (rank {self.env.rank}): {text}", file=sys.stderr)
            return 1

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
        if getattr(state.data, "watch", None) is not None:
            from tideborn.trainer.data_watch import WatchDuty

            self.data_watch = WatchDuty(state.data, self.events, self.progress, self.stop, self.p.start.checkpoint,
                                        lambda: self.step)
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
            self.events.emit("gpu", step=self.step, **gpu_snapshot(self.setup.device))
        started = time.perf_counter()
        result = self.state.train_step(self.step)
        if self.duties.compile_report.should_run():
            # torch.compile compiles lazily, inside the first step: time that step (synchronised).
            if self.setup.is_cuda:
                torch.cuda.synchronize(self.setup.device)
            seconds = time.perf_counter() - started
            self.events.emit("compile", step=self.step + 1, first_step_seconds=seconds)
            self.progress.message(f"torch.compile: the first step took {seconds:.1f} s (compilation included)")
        self.step += 1
        self.window.add(result)
        self.watchdog.add(self.step, result.grad_norm)

    def _periodic_duties(self, final: bool) -> None:
        """What is due after a step, in this order: the `step` event, evaluation, a checkpoint and its match, the
        engine's export. `final`: the attempt's last step, where the first three are all due."""
        if self.duties.log.should_run(self.step, final):
            self._judge(self._log())
        if self.duties.evaluate.should_run(self.step, final):
            self._evaluate()
        if self.duties.checkpoint.should_run(self.step, final):
            self._checkpoint(final)
        if self.duties.engine_export.should_run(self.step, self.duties.horizon.finished(self.step)):
            self._export_for_engine()

    def _log(self) -> list[float]:
        """Close the metrics window: its `step` event, newly skipped records, the progress line. Returns its
        means (loss, policy, value, grad norm)."""
        runtime = self.settings.runtime
        read = self.window.read(self.step)
        self.events.emit("step", **read.record)
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
        with self.stop.saving():  # a repeated Ctrl-C never cuts a save short (trainer/signals.py)
            self.last_saved, self.saved_step = self._save(), self.step
        if self.last_saved is None:  # ranks other than 0 save nothing, so keep no reference and play no match
            return
        if self.duties.keep_reference:
            self._keep_reference(self.last_saved)
        if self.duties.match.should_run(self.step, final) and self.stop.reason is None:
            self._match(self.last_saved)

    def _end(self, signalled: bool) -> int:
        """The loop is over (the final step, or a stop agreed by the ranks): log and judge the steps not yet
        logged, save the last step if it is not saved, and write the terminal event."""
        if self.window.steps:
            self._judge(self._log())
        if self.saved_step != self.step:
            with self.stop.saving():
                self.last_saved, self.saved_step = self._save(), self.step
        last_saved = self.last_saved
        if self.duties.horizon.finished(self.step):
            if self.duties.export.should_run(self.step, final=True):
                self._export(last_saved)
            self._terminal("run_finished", checkpoint=str(last_saved))
            elapsed = duration(time.perf_counter() - self.started)
            self.progress.message(f"finished at step {self.step} in {elapsed}; checkpoint {last_saved}")
            return 0
        reason = self.stop.reason or ("SIGTERM" if signalled else "stop_at_step")
        orphaned = {}
        if self.agent_watch is not None and self.agent_watch.parent_gone():
            # The stop came from a worker that found torchrun's agent dead (its own SIGTERM, or another rank's).
            reason, orphaned = "agent_gone", {"agent_pid": self.agent_watch.parent}
        self._terminal("run_stopped", reason=reason, checkpoint=str(last_saved) if last_saved else None,
                       repeated_signals=self.stop.repeated, **orphaned)
        if self.step == self.p.start.step:  # stopped during start-up: this attempt trained and saved nothing
            if reason == "SIGINT":  # Ctrl-C: the command says so in one line, exit status 130
                raise Interrupted(" before the first step; no checkpoint was written, the events end in run_stopped")
            self.progress.message(f"stopped ({reason}) before the first step (step {self.step}); no checkpoint was "
                                  "written")
            return 0
        self.progress.message(f"stopped ({reason}) at step {self.step}; checkpoint {last_saved}")
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
            self.events.emit("watchdog", step=self.step, resume_from=_text_or_none(self._healthy_checkpoint()),
                             **trip.event_fields())
        resume = self._set_aside_unhealthy("saved while the gradient norm was spiking")
        text += f"; stopped without saving, {_resume_point(resume)}; settings: [watchdog]"
        self._terminal("run_failed", error=text, traceback=None, resume_from=_text_or_none(resume))
        self.progress.message(f"run failed: {text}")
        raise _Halted(1)

    def _healthy_checkpoint(self) -> Path | None:
        """The newest checkpoint saved with no spike streak open, if it is still in the run directory (pruning
        never removes it; an older one may be unhealthy, so none is guessed when it was removed by hand)."""
        if self.healthy_step is None:
            return None
        path = self.p.run_dir / checkpoint_name(self.healthy_step)
        return path if path in {p for _, p in list_checkpoints(self.p.run_dir)} else None

    def _set_aside_unhealthy(self, why: str) -> Path | None:
        """Rank 0 moves the checkpoints saved since the newest healthy one (each while a spike streak was open:
        their weights took exploding updates) to `archive/watchdog-STAMP/`, with a warning; every rank returns
        the newest checkpoint left, the healthy one, to resume from."""
        run_dir = self.p.run_dir
        newest_healthy = -1 if self.healthy_step is None else self.healthy_step
        unhealthy = [path for step, path in list_checkpoints(run_dir) if step > newest_healthy]
        if unhealthy and self.env.is_main:
            names = ", ".join(path.name for path in unhealthy)
            try:
                folder = move_to_archive(run_dir, unhealthy, WATCHDOG_ARCHIVE)
                text = f"moved {names}, {why}, to {folder}/: not a point to resume from"
            except (OSError, UserError) as exc:  # UserError: an `archive` link planted since start-up
                reason = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
                text = (f"could not move {names} ({why}) to {run_dir}/archive/: {reason}; do not resume from them "
                        "(train passes them over by default)")
            self.events.emit("warning", step=self.step, message=text)
            self.progress.message(f"warning: {text}")
        return self._healthy_checkpoint()

    def _eval_scales(self) -> dict[str, float] | None:
        """`run_started.eval_scales`: each teacher file's eval scale with `data.eval_scale_fit = "per_file"`."""
        if self.settings.data.eval_scale_fit != "per_file" or self.state is None:
            return None
        from tideborn.data.evalfix import scales_field  # teacher data only: cshogi is not needed otherwise

        fits = list(getattr(self.state.data, "scale_fits", []))
        if self.state.evaluator is not None:
            fits += self.state.evaluator.scale_fits
        return scales_field(fits)

    def _eval_scale_warnings(self) -> list[str]:
        if self.state is None or self.settings.data.eval_scale_fit != "per_file":
            return []
        from tideborn.data.evalfix import fit_warning

        found = [fit_warning(fit, "data.train") for fit in getattr(self.state.data, "scale_fits", []) if fit.problem]
        if self.state.evaluator is not None:
            found += [fit_warning(fit, "data.test") for fit in self.state.evaluator.scale_fits if fit.problem]
        return found

    def _evaluate(self) -> None:
        state = self.state
        assert state is not None and state.evaluator is not None
        started = time.perf_counter()
        # The plain module, not the DDP wrapper: only rank 0 evaluates, and DDP's forward may communicate.
        # While the value mix decays, the held-out value loss is taken at this step's mix, as training's is.
        mix = value_lambda_at(max(0, self.step - 1), self.settings.loss) if state.value_lambda_decays else None
        result = state.evaluator.run(state.model, self.setup.autocast, mix)
        if state.ema is not None:
            averaged = state.evaluator.run(state.ema.module, self.setup.autocast, mix)
            result["ema"] = {k: averaged[k] for k in ("policy_loss", "value_loss", "policy_accuracy",
                                                      "value_accuracy")}
        result["seconds"] = time.perf_counter() - started
        self.events.emit("eval", step=self.step, **result)
        value = result["value_accuracy"]
        self.progress.message(
            f"eval at step {self.step}: policy loss {result['policy_loss']:.4f}, value loss "
            f"{result['value_loss']:.4f}, policy top-1 {result['policy_accuracy']:.1%} "
            f"(among legal moves {result['policy_accuracy_legal']:.1%}), value accuracy "
            f"{'n/a' if value is None else f'{value:.1%}'} ({result['positions']:,} positions)"
            + (f"; EMA policy top-1 {result['ema']['policy_accuracy']:.1%}" if "ema" in result else ""))

    def _report_skipped_records(self) -> None:
        assert self.state is not None
        data = self.state.data
        skipped = getattr(data, "skipped_records", 0)
        if skipped > self.skipped_reported:
            examples = list(getattr(data, "skipped_examples", []))
            text = (f"skipped {skipped - self.skipped_reported} teacher record(s) with an empty or illegal move "
                    f"({skipped} in all; data.bad_records=\"skip\")")
            self.events.emit("warning", step=self.step, message=text, skipped_records=skipped, examples=examples)
            self.progress.message(f"warning: {text}")
            self.skipped_reported = skipped

    def _export(self, checkpoint: Path | None) -> None:
        """`runtime.export_onnx`: the final weights as ONNX beside the checkpoint, parity-checked. A failed
        export is a warning, not a failed run: the checkpoint is the source of truth and can be exported again."""
        from tideborn.export.onnx_export import export_onnx
        from tideborn.export.parity import ParityError

        assert self.state is not None and checkpoint is not None
        target = checkpoint.with_suffix(".onnx")
        try:
            report = export_onnx(self.state.payload(self.step), target)
        except (ParityError, UserError, OSError) as exc:
            text = f"ONNX export to {target} failed: {' '.join(str(exc).split())}"
            self.events.emit("warning", step=self.step, message=text)
            self.progress.message(f"warning: {text}")
            return
        self.events.emit("export", step=self.step, **report.event_fields())
        self.progress.message(f"exported {report.weights} weights to {report.path} (parity max abs diff: policy "
                              f"{report.policy_max_abs_diff:.1e}, value {report.value_max_abs_diff:.1e})")

    def _export_for_engine(self) -> None:
        """`runtime.export_every`: the weights for the engine in `export/`, `latest.onnx` replaced whole. Not
        while the watchdog counts gradient spikes (engines would play, and make data, with weights that may be
        exploding); a failure is a warning, and training goes on."""
        from tideborn.trainer.engine_export import EngineExportFailed, export_for_engine

        assert self.state is not None and self.watchdog is not None
        if self.watchdog.streak_open:
            self._warn(f"step {self.step} not exported for the engine: the gradient norm is spiking "
                       "(settings: [watchdog]); latest.onnx keeps the model before")
            return
        try:
            done = export_for_engine(self.state.payload(self.step), self.p.run_dir,
                                     self.settings.runtime.export_keep)
        except EngineExportFailed as exc:
            self._warn(str(exc))
            return
        self.events.emit("export", step=self.step, **done.event_fields())
        for text in done.prune_problems:
            self._warn(text)
        self.progress.message(f"exported step {self.step}'s {done.report.weights} weights for the engine: "
                              f"{done.latest} (parity max abs diff: policy {done.report.policy_max_abs_diff:.1e}, "
                              f"value {done.report.value_max_abs_diff:.1e})")

    def _terminal(self, kind: str, **fields: object) -> None:
        """End the attempt in the events. Without its run_started in the file, a terminal event would seem to
        end the attempt before; a write that fails (a full disk) cannot be reported in the events. Either
        way stderr says so and the exit status is non-zero."""
        self.stop.listen(None)  # nothing may follow the terminal event: a later stop signal is only noted on stderr
        if not self.announced:
            self.events_lost = True
            _tell(f"{kind} not written to {EVENTS_FILE}: this attempt's run_started is not there")
            return
        try:
            self.events.emit(kind, step=self.step, pid=os.getpid(),
                             elapsed_seconds=time.perf_counter() - self.started, **fields)
        except OSError as exc:
            self.events_lost = True
            _tell(f"could not write {kind} to {self.p.run_dir / EVENTS_FILE}: {exc}")

    def _save(self) -> Path | None:
        """Rank 0 writes the checkpoint; every rank returns its path (None on the others). A save while the
        watchdog counts spikes is not healthy and prunes nothing; no save prunes the newest healthy one."""
        assert self.state is not None and self.watchdog is not None
        healthy = not self.watchdog.streak_open
        if healthy:
            self.healthy_step = self.step  # before the payload: a healthy checkpoint names itself
        if not self.env.is_main:
            return None
        payload = {**self.state.payload(self.step), "watchdog": self.watchdog.state_dict(self.healthy_step)}
        if self.settings.runtime.match_every and not self.settings.runtime.match_reference:
            # The reference this save will be matched against: the first save's own step when there is none yet.
            payload[REFERENCE_STEP_KEY] = self.step if self.reference_step is None else self.reference_step
        saved = save_checkpoint(self.p.run_dir, self.step, payload)
        pruned = (prune_checkpoints(self.p.run_dir, self.settings.runtime.keep_checkpoints, saved.path,
                                    self._healthy_checkpoint()) if healthy else [])
        self.events.emit("checkpoint_saved", step=self.step, path=str(saved.path), bytes=saved.bytes,
                         seconds=saved.seconds, pruned=[str(path) for path in pruned], healthy=healthy)
        return saved.path

    def _keep_reference(self, saved: Path) -> None:
        """Keep the default match reference, the run's first checkpoint, as match-reference.pt (a hard link,
        so that pruning does not take it away). Made at the run's first save; later, one that is gone or is no
        longer a regular file (deleted, replaced by a link: never followed) is restored from the reference's
        own step file when that is still there, and otherwise re-based on `saved` with a `warning` event
        (`match_rebaseline`): the Elo curve's origin moves, and status and the monitor say so."""
        reference = self.p.run_dir / MATCH_REFERENCE_FILE
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
            own = self.p.run_dir / checkpoint_name(known)
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

    def _warn(self, text: str, **fields: object) -> None:
        self.events.emit("warning", step=self.step, message=text, **fields)
        self.progress.message(text)

    def _match_reference(self) -> Path:
        named = self.settings.runtime.match_reference
        return Path(named) if named else self.p.run_dir / MATCH_REFERENCE_FILE

    def _match(self, saved: Path) -> None:
        """Play the checkpoint just saved against the reference and write a `match` event. A match that
        cannot be played (a reference that is missing or not a checkpoint) is a warning, not a failure:
        training goes on."""
        from tideborn.match.run import run_match

        runtime = self.settings.runtime
        try:
            reference = self._match_reference()
            # Building the two networks draws initial weights from torch's global generator; fork it so that
            # a run with matches trains exactly as one without, and resumes exactly (the checkpoint holds
            # the generator's state from before the match).
            with torch.random.fork_rng(devices=[]):
                report = run_match(saved, reference, games=runtime.match_games, parallel=runtime.match_games,
                                   device=str(self.setup.device), run_files=(True, not runtime.match_reference))
        except (UserError, OSError, ImportError) as exc:  # ImportError: an image without cshogi
            text = f"match at step {self.step} not played: {exc}"
            self.events.emit("warning", step=self.step, message=text)
            self.progress.message(text)
            return
        played = report["second"]["step"]
        if not runtime.match_reference and played != self.reference_step:
            if self.reference_step is not None:  # replaced in place by another checkpoint: the origin moved
                self._warn(f"{reference} now holds step {played}, not step {self.reference_step}, the run's "
                           f"reference: Elo from here on is measured against step {played} and does not continue "
                           "the curve before", match_rebaseline=True, old_reference_step=self.reference_step,
                           reference_step=played)
            self.reference_step = played
        self.events.emit("match", step=self.step, checkpoint=str(saved), reference=str(reference),
                         reference_step=report["second"]["step"],
                         **{key: report[key] for key in ("games", "wins", "draws", "losses", "score", "los",
                                                          "model", "seconds", "games_per_second")},
                         **{key: _unbounded(report, key) for key in ("elo", "elo_low", "elo_high")})
        self.progress.message(f"match at step {self.step} vs step {report['second']['step']}: "
                              f"score {100 * report['score']:.1f}% over {report['games']} games, Elo "
                              f"{_elo(_unbounded(report, 'elo'))} [{_elo(_unbounded(report, 'elo_low'))}, "
                              f"{_elo(_unbounded(report, 'elo_high'))}]")

    def _fail_nonfinite(self, means: list[float]) -> int:
        resume = self._set_aside_unhealthy("saved while the gradient norm was spiking before the non-finite loss")
        text = (f"non-finite loss at step {self.step} (loss {means[0]}, policy {means[1]}, value {means[2]}); "
                f"stopped without saving, {_resume_point(resume)} (runtime.stop_on_nonfinite)")
        self._terminal("run_failed", error=text, traceback=None, resume_from=_text_or_none(resume))
        self.progress.message(f"run failed: {text}")
        return 1


def _text_or_none(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def _resume_point(checkpoint: Path | None) -> str:
    if checkpoint is None:
        return "and there is no healthy checkpoint to resume from yet"
    return f"the newest healthy checkpoint ({checkpoint}) is the one to resume from (train does so by default)"


def _unbounded(report: dict, key: str) -> float:
    """The report's Elo figure, its JSON null (an infinite one, at a 0% or 100% score) as +-inf again: the
    event writes it as "inf"/"-inf", which readers take back with `as_float`."""
    value = report[key]
    if value is not None:
        return value
    score = report["score"]
    if key == "elo":
        return math.inf if score >= 1 else -math.inf
    if key == "elo_low":
        return math.inf if score >= 1 else -math.inf
    return -math.inf if score <= 0 else math.inf


def _elo(value: float) -> str:
    return f"{value:+.0f}" if math.isfinite(value) else ("+inf" if value > 0 else "-inf")


def _tell(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass  # stderr is on the full disk too: the exit status is all that is left to say it


def _build_data_caches_once(resolved: Resolved, env: DistEnv) -> None:
    """Under torchrun, local rank 0 of each node decodes the hcpe3 files (and builds the averaged set) into
    their caches while the other ranks wait at a barrier, then they read what it wrote: one decode a node, not
    one a process. Its failure (a malformed file) is raised after the barrier; the other ranks then meet the
    same problem in their own checks. A decode longer than `runtime.dist_timeout_seconds` times the waiting
    ranks out: build the caches first (`tideborn data inspect FILE.hcpe3`)."""
    failure: UserError | None = None
    if env.local_rank == 0:
        from tideborn.data.loader import build_caches

        try:
            build_caches(resolved.settings)
        except UserError as exc:
            failure = exc
    barrier(env)
    if failure is not None:
        raise failure


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
        if env.distributed:
            _build_data_caches_once(resolved, env)
        prepared = prepare(resolved, resume, fresh, stop_at_step, argv, env)
        # Every rank has read its start point before rank 0 may archive, prune or write anything.
        barrier(env)
        if prepared is None:
            return 0
        return Trainer(prepared, stop, agent_watch, workers).run()
    finally:
        if agent_watch is not None:
            agent_watch.close()
        close_process_group()
