"""The training loop: steps, logging, checkpoints, signals, and exactly one terminal event per run.

`prepare` checks everything that can be wrong with the user's input and writes nothing; `Trainer.run`
then owns the run directory until it returns.
"""

from __future__ import annotations

import math
import os
import platform
import random
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import tideborn
from tideborn.config import Resolved, Settings
from tideborn.errors import UserError
from tideborn.events import EventWriter
from tideborn.rundir import EVENTS_FILE, list_checkpoints, temp_checkpoints
from tideborn.trainer.checkpoint import FORMAT, FORMAT_VERSION, prune_checkpoints, save_checkpoint
from tideborn.trainer.device import DeviceSetup, apply_global_switches, resolve_device
from tideborn.trainer.gpu_stats import gpu_snapshot
from tideborn.trainer.model import build_model
from tideborn.trainer.optim import build_optimizer, build_scheduler
from tideborn.trainer.preflight import preflight
from tideborn.trainer.progress import Progress, format_duration
from tideborn.trainer.resume import StartPoint, choose_start
from tideborn.trainer.rundir_lock import RunDirLock
from tideborn.trainer.signals import StopRequest
from tideborn.trainer.synthetic import SyntheticBatches


@dataclass(frozen=True)
class Prepared:
    settings: Settings
    run_dir: Path
    setup: DeviceSetup
    start: StartPoint
    fresh: bool
    stop_at_step: int | None
    argv: list[str]


def prepare(resolved: Resolved, resume: Path | None = None, fresh: bool = False,
            stop_at_step: int | None = None, argv: list[str] | None = None) -> Prepared | None:
    """Validate the request without writing anything. None means there is nothing to train."""
    settings = resolved.settings
    run_dir = preflight(settings, resume, fresh, stop_at_step)
    setup = resolve_device(settings.runtime)
    start = choose_start(settings, run_dir, resume, fresh)
    max_steps = settings.runtime.max_steps
    if stop_at_step is not None and not start.step < stop_at_step <= max_steps:
        raise UserError(f"--stop-at-step {stop_at_step}: must be after the start step ({start.step}) "
                        f"and at most runtime.max_steps ({max_steps})")
    if start.step >= max_steps:
        print(f"nothing to train: {start.checkpoint} is at step {start.step}, and runtime.max_steps "
              f"is {max_steps} (raise it with --set runtime.max_steps=N, or start over with --fresh)")
        return None
    return Prepared(settings, run_dir, setup, start, fresh, stop_at_step, list(argv or sys.argv))


def versions() -> dict[str, str]:
    # str(): torch.__version__ is a TorchVersion, which a weights_only load refuses as a foreign global.
    found = {"tideborn": tideborn.__version__, "python": platform.python_version(), "torch": str(torch.__version__)}
    if torch.version.cuda:
        found["cuda"] = torch.version.cuda
    return found


def rng_state(cuda: bool) -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if cuda else []}


def restore_rng(state: dict, cuda: bool) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if cuda and state.get("cuda"):
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    def __init__(self, prepared: Prepared, stop: StopRequest | None = None):
        self.p = prepared
        self.settings = prepared.settings
        self.setup = prepared.setup
        self.progress = Progress(self.settings.runtime.progress)
        # The CLI installs the handler before torch loads, so a stop during start-up is not lost.
        self.stop = stop or StopRequest().install()
        self.started = time.perf_counter()
        self.step = prepared.start.step
        self.events: EventWriter | None = None

    # -- building -------------------------------------------------------------------------------
    def _build(self) -> None:
        s, setup = self.settings, self.setup
        apply_global_switches(s.runtime, setup)
        torch.manual_seed(s.runtime.seed)
        random.seed(s.runtime.seed)
        model = build_model(s.model).to(setup.device)
        if setup.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = build_optimizer(model, s.optim, fused=setup.is_cuda)
        self.scheduler = build_scheduler(self.optimizer, s.optim, s.runtime.max_steps)
        self.scaler = torch.amp.GradScaler("cuda") if setup.uses_grad_scaler else None
        if s.data.resolved_kind == "synthetic":
            self.data = SyntheticBatches(s.runtime.seed, s.optim.micro_batch_size, setup.device)
        else:
            from tideborn.data.loader import TeacherBatches

            self.data = TeacherBatches(s, setup.device)
        self.evaluator = None
        if s.data.resolved_kind != "synthetic" and s.data.test:
            from tideborn.data.evaluation import Evaluator

            self.evaluator = Evaluator(s, setup.device)
        self.skipped_reported = 0
        start = self.p.start
        if start.payload is not None:
            payload = start.payload
            model.load_state_dict(payload["model"])
            self.optimizer.load_state_dict(payload["optimizer"])
            self.scheduler.load_state_dict(payload["scheduler"])
            if self.scaler is not None and payload.get("scaler"):
                self.scaler.load_state_dict(payload["scaler"])
            self.data.load_state_dict(payload["data_cursor"])
            restore_rng(payload["rng"], setup.is_cuda)
        elif start.init_weights is not None:
            model.load_state_dict(start.init_weights)
        self.forward = torch.compile(model) if s.runtime.compile else model

    def _checkpoint_payload(self) -> dict:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "step": self.step,
            "settings": self.settings.to_dict(), "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng_state(self.setup.is_cuda), "data_cursor": self.data.state_dict(),
            "versions": versions(), "saved_at": time.time(), "world_size": 1,
        }

    # -- the step -------------------------------------------------------------------------------
    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """One optimizer step; returns (loss/policy/value means, grad norm, data-wait seconds, lr used)."""
        s, setup = self.settings, self.setup
        self.model.train()
        micro_steps = s.optim.accumulation_steps
        totals = torch.zeros(3, device=setup.device)
        data_wait = 0.0
        for _ in range(micro_steps):
            waited = time.perf_counter()
            batch = self.data.next_batch()
            data_wait += time.perf_counter() - waited
            x1, x2 = batch.features1, batch.features2
            if setup.channels_last:
                x1 = x1.contiguous(memory_format=torch.channels_last)
                x2 = x2.contiguous(memory_format=torch.channels_last)
            with setup.autocast():
                policy_logits, value_logit = self.forward(x1, x2)
            policy_loss = F.cross_entropy(policy_logits.float(), batch.policy)
            value_loss = F.binary_cross_entropy_with_logits(value_logit.float(), batch.value)
            loss = s.loss.policy_weight * policy_loss + s.loss.value_weight * value_loss
            scaled = loss / micro_steps
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            totals += torch.stack([loss, policy_loss, value_loss]).detach() / micro_steps
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        if s.optim.grad_clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, s.optim.grad_clip_norm)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        return totals, grad_norm.detach(), data_wait, lr

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> int:
        p = self.p
        p.run_dir.mkdir(parents=True, exist_ok=True)
        with RunDirLock(p.run_dir):
            archived = self._archive_for_fresh() if p.fresh else None
            warnings = list(p.start.warnings)
            for temp in temp_checkpoints(p.run_dir):
                temp.unlink(missing_ok=True)
                warnings.append(f"removed {temp.name}, left by a checkpoint save that did not finish")
            self.events = EventWriter(p.run_dir / EVENTS_FILE)
            try:
                return self._run(warnings, archived)
            finally:
                self.stop.uninstall()
                self.progress.end_line()
                self.events.close()
                if hasattr(self, "data"):
                    self.data.close()

    def _archive_for_fresh(self) -> Path | None:
        run_dir = self.p.run_dir
        doomed = [path for _, path in list_checkpoints(run_dir)]
        if (run_dir / EVENTS_FILE).exists():
            doomed.append(run_dir / EVENTS_FILE)
        if not doomed:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        archive = run_dir / "archive" / f"fresh-{stamp}"
        archive.mkdir(parents=True, exist_ok=True)
        for path in doomed:
            os.replace(path, archive / path.name)
        self.progress.message(f"--fresh: moved {len(doomed)} file(s) (old checkpoints and events) to {archive}")
        return archive

    def _run(self, warnings: list[str], archived: Path | None) -> int:
        assert self.events is not None
        events, s, p = self.events, self.settings, self.p
        try:
            self._build()
            for text in warnings:
                events.emit("warning", step=self.step, message=text)
                self.progress.message(f"warning: {text}")
            events.emit(
                "run_started", step=self.step, settings=s.to_dict(), device=self.setup.describe(),
                precision=self.setup.precision, world_size=1, versions=versions(),
                resumed_from=str(p.start.checkpoint) if p.start.checkpoint else None,
                changed_settings=p.start.changed_settings, fresh=p.fresh,
                archived_to=str(archived) if archived else None, pid=os.getpid(),
                host=socket.gethostname(), argv=p.argv, max_steps=s.runtime.max_steps,
                batch_size=s.optim.batch_size, run_dir=str(p.run_dir),
            )
            where = f"resuming from {p.start.checkpoint} at step {self.step}" if p.start.checkpoint else "from step 0"
            self.progress.message(f"training {s.model.blocks}x{s.model.channels} on {self.setup.describe()}, "
                                  f"{where}, to step {s.runtime.max_steps}; run directory {p.run_dir}")
            return self._loop()
        except UserError as exc:  # bad input met only now (a bad record, data that changed under a cursor)
            self.progress.end_line()
            self._terminal("run_failed", error=str(exc), traceback=None)
            raise
        except Exception as exc:  # any failure after run_started must still end with one terminal event
            self.progress.end_line()
            text = f"{type(exc).__name__}: {exc}"
            self._terminal("run_failed", error=text, traceback=traceback.format_exc(limit=20))
            traceback.print_exc()
            print(f"run failed at step {self.step}: {text}", file=sys.stderr)
            return 1

    def _loop(self) -> int:
        s, events = self.settings, self.events
        assert events is not None
        runtime = s.runtime
        last_saved = self.p.start.checkpoint
        window_start, window_steps, window_wait = time.perf_counter(), 0, 0.0
        window = torch.zeros(4, device=self.setup.device)  # loss, policy, value, grad norm (sums)
        next_gpu_event = time.perf_counter()
        while self.step < runtime.max_steps:
            if self.setup.is_cuda and time.perf_counter() >= next_gpu_event:
                next_gpu_event = time.perf_counter() + runtime.gpu_event_seconds
                events.emit("gpu", step=self.step, **gpu_snapshot(self.setup.device))
            if self.stop.reason is not None and window_steps == 0:  # signalled before this attempt's first step
                return self._stopped(self.stop.reason, last_saved)
            totals, grad_norm, data_wait, lr = self._train_step()
            self.step += 1
            window += torch.cat([totals, grad_norm.reshape(1).float()])
            window_steps += 1
            window_wait += data_wait
            final = self.step == runtime.max_steps
            stopping = self.stop.reason is not None or self.step == self.p.stop_at_step
            if self.step % runtime.log_every == 0 or final or stopping:
                means = (window / window_steps).tolist()
                elapsed = time.perf_counter() - window_start
                positions = window_steps * s.optim.batch_size
                record = {
                    "step": self.step, "loss": means[0], "policy_loss": means[1], "value_loss": means[2],
                    "grad_norm": means[3], "lr": lr, "positions_per_second": positions / elapsed,
                    "data_wait_seconds": window_wait, "compute_seconds": max(0.0, elapsed - window_wait),
                    "steps": window_steps,
                }
                events.emit("step", **record)
                self._report_skipped_records()
                eta = (runtime.max_steps - self.step) * elapsed / window_steps
                self.progress.step(self.step, runtime.max_steps, record, eta)
                window_start, window_steps, window_wait = time.perf_counter(), 0, 0.0
                window.zero_()
                if runtime.stop_on_nonfinite and not all(math.isfinite(v) for v in means[:3]):
                    return self._fail_nonfinite(means)
            if self.evaluator is not None and (self.step % runtime.eval_every == 0 or final):
                self._evaluate()
            if self.step % runtime.checkpoint_every == 0 or final or stopping:
                if window_steps and not bool(torch.isfinite(window[:3]).all()):
                    return self._fail_nonfinite((window / window_steps).tolist())
                last_saved = self._save()
            if stopping:
                return self._stopped(self.stop.reason or "stop_at_step", last_saved)
        self._terminal("run_finished", checkpoint=str(last_saved))
        self.progress.message(f"finished at step {self.step} in {format_duration(time.perf_counter() - self.started)}; "
                              f"checkpoint {last_saved}")
        return 0

    def _evaluate(self) -> None:
        assert self.evaluator is not None and self.events is not None
        started = time.perf_counter()
        result = self.evaluator.run(self.forward, self.setup.autocast)
        result["seconds"] = time.perf_counter() - started
        self.events.emit("eval", step=self.step, **result)
        value = result["value_accuracy"]
        self.progress.message(
            f"eval at step {self.step}: policy loss {result['policy_loss']:.4f}, value loss "
            f"{result['value_loss']:.4f}, policy top-1 {result['policy_accuracy']:.1%}, value accuracy "
            f"{'n/a' if value is None else f'{value:.1%}'} ({result['positions']:,} positions)")

    def _report_skipped_records(self) -> None:
        skipped = getattr(self.data, "skipped_records", 0)
        if skipped > self.skipped_reported:
            assert self.events is not None
            examples = list(getattr(self.data, "skipped_examples", []))
            text = (f"skipped {skipped - self.skipped_reported} teacher record(s) with an empty or illegal move "
                    f"({skipped} in all; data.bad_records=\"skip\")")
            self.events.emit("warning", step=self.step, message=text, skipped_records=skipped, examples=examples)
            self.progress.message(f"warning: {text}")
            self.skipped_reported = skipped

    def _terminal(self, kind: str, **fields: object) -> None:
        assert self.events is not None
        self.events.emit(kind, step=self.step, pid=os.getpid(),
                         elapsed_seconds=time.perf_counter() - self.started, **fields)

    def _stopped(self, reason: str, checkpoint: Path | None) -> int:
        self._terminal("run_stopped", reason=reason, checkpoint=str(checkpoint) if checkpoint else None)
        self.progress.message(f"stopped ({reason}) at step {self.step}; checkpoint {checkpoint}")
        return 0

    def _save(self) -> Path:
        assert self.events is not None
        saved = save_checkpoint(self.p.run_dir, self.step, self._checkpoint_payload())
        pruned = prune_checkpoints(self.p.run_dir, self.settings.runtime.keep_checkpoints)
        self.events.emit("checkpoint_saved", step=self.step, path=str(saved.path), bytes=saved.bytes,
                         seconds=saved.seconds, pruned=[str(path) for path in pruned])
        return saved.path

    def _fail_nonfinite(self, means: list[float]) -> int:
        assert self.events is not None
        text = (f"non-finite loss at step {self.step} (loss {means[0]}, policy {means[1]}, value {means[2]}); "
                f"stopped without saving, the last checkpoint is intact (runtime.stop_on_nonfinite)")
        self._terminal("run_failed", error=text, traceback=None)
        self.progress.message(f"run failed: {text}")
        return 1


def run_training(resolved: Resolved, resume: Path | None = None, fresh: bool = False,
                 stop_at_step: int | None = None, argv: list[str] | None = None,
                 stop: StopRequest | None = None) -> int:
    prepared = prepare(resolved, resume, fresh, stop_at_step, argv)
    if prepared is None:
        return 0
    return Trainer(prepared, stop).run()
