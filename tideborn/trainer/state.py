"""Everything a run trains and checkpoints: model (and its DDP/compiled forms), optimizer, schedule, grad
scaler, weight average, data stream and evaluator; how one step updates them; and how they are saved to
and restored from a checkpoint payload (tensors and plain data only, so `weights_only` loads it).
"""

from __future__ import annotations

import contextlib
import platform
import random
import time
import typing
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import tideborn
from tideborn.config.schema import Settings
from tideborn.data.decode.targets import mixed_value_target, policy_entropy, value_lambda_at, value_lambda_decays
from tideborn.network.checkpoint import FORMAT, FORMAT_VERSION
from tideborn.network.model import build_model
from tideborn.network.optim import (
    build_optimizer,
    build_scheduler,
    load_optimizer_state,
    load_scheduler_state,
)
from tideborn.trainer.device import DeviceSetup, apply_global_switches
from tideborn.trainer.distributed import AllReduceCounter, check_ranks_in_sync, global_batch_digest
from tideborn.trainer.ema import WeightAverage
from tideborn.trainer.losses import policy_loss as policy_cross_entropy
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.resume import StartPoint
from tideborn.trainer.synthetic import SyntheticBatches

if typing.TYPE_CHECKING:
    from tideborn.data.training.batch import BatchSource
    from tideborn.data.training.loader import LoaderSettings, TeacherBatches
    from tideborn.data.training.opened import OpenedData


def versions() -> dict[str, str]:
    # str(): torch.__version__ is a TorchVersion, which a weights_only load refuses as a foreign global.
    found = {"tideborn": tideborn.__version__, "python": platform.python_version(), "torch": str(torch.__version__)}
    if torch.version.cuda:
        found["cuda"] = torch.version.cuda
    return found


def rng_state(device: torch.device) -> dict:
    """The generators' states; on CUDA only the training device's (a resume may see fewer GPUs)."""
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []}


def restore_rng(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda"):
        torch.cuda.set_rng_state(state["cuda"][0], device)


@dataclass
class StepResult:
    losses: torch.Tensor
    """[loss, policy loss, value loss], means over the step's micro-batches (on the device, not synced)."""
    grad_norm: torch.Tensor
    data_wait_seconds: float
    lr: float
    batch_digest: str | None = None
    """`runtime.ddp_diagnostics`: the digest of the step's global batch (`distributed.global_batch_digest`)."""


def loader_settings(settings: Settings) -> LoaderSettings:
    """What the teacher-data loader needs from outside `[data]`."""
    from tideborn.data.training.loader import LoaderSettings

    return LoaderSettings(
        data_root=settings.paths.data_root, seed=settings.runtime.seed,
        micro_batch_size=settings.optim.micro_batch_size, accumulation_steps=settings.optim.accumulation_steps,
        value_lambda=settings.loss.value_lambda, value_lambda_decays=value_lambda_decays(settings.loss),
        pin_memory=settings.runtime.pin_memory)


def teacher_batches(settings: Settings, device: torch.device, rank: int = 0, world_size: int = 1,
                    **options: typing.Any) -> TeacherBatches:
    """`TeacherBatches` for `settings` (`options`: its keyword arguments, `source=` among them)."""
    from tideborn.data.training.loader import TeacherBatches

    return TeacherBatches(settings.data, loader_settings(settings), device, rank, world_size, **options)


class TrainingState:
    """`opened`: the teacher data as `loop.prepare` opened it, taken over (the training source goes to the loader,
    the held-out one to the evaluator); None: opened here."""

    def __init__(self, settings: Settings, setup: DeviceSetup, env: DistEnv, opened: OpenedData | None = None,
                 resumed_threads: int | None = None):
        self.settings, self.setup, self.env = settings, setup, env
        s = settings
        self.threads = apply_global_switches(s.runtime, setup, s.data.workers if s.data.train else 0, resumed_threads)
        self.cpu_threads = self.threads.count
        torch.manual_seed(s.runtime.seed)
        random.seed(s.runtime.seed)
        model = build_model(s.model).to(setup.device)
        if setup.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = build_optimizer(model, s.optim, fused=setup.is_cuda and s.runtime.fused_optimizer)
        self.scheduler = build_scheduler(self.optimizer, s.optim, s.runtime.max_steps)
        self.scaler = torch.amp.GradScaler("cuda") if setup.uses_grad_scaler else None
        self.ema = WeightAverage(model, s.optim.ema_decay) if s.optim.ema_decay > 0 else None
        self.data: BatchSource
        self.evaluator = None
        if s.data.resolved_kind == "synthetic":
            self.data = SyntheticBatches(s.runtime.seed, s.optim.micro_batch_size, setup.device,
                                         env.rank, env.world_size)
        else:
            from tideborn.data.training.opened import open_data

            if opened is None:
                opened = open_data(s.data, s.paths.data_root)
            try:
                self.data = teacher_batches(s, setup.device, env.rank, env.world_size, source=opened.train)
                if env.is_main and opened.test is not None:
                    from tideborn.trainer.evaluation import Evaluator

                    self.evaluator = Evaluator(s, setup.device, records=opened.test)  # it closes the source
                elif opened.test is not None:  # rank 0 evaluates
                    opened.test.close()
            except BaseException:
                opened.close()
                raise
        # At any world size, so that a run's global batches can be compared with a single process's.
        self.data.record_draws = s.runtime.ddp_diagnostics
        self.value_lambda_decays = value_lambda_decays(s.loss)
        self.allreduce_counter: AllReduceCounter | None = None
        self.ddp: DistributedDataParallel | None = None

    def restore(self, start: StartPoint) -> None:
        if start.payload is not None:
            payload = start.payload
            self.model.load_state_dict(payload["model"])
            load_optimizer_state(self.optimizer, payload["optimizer"])
            load_scheduler_state(self.scheduler, payload["scheduler"])
            if self.scaler is not None and payload.get("scaler"):
                self.scaler.load_state_dict(payload["scaler"])
            if self.ema is not None and payload.get("ema"):
                self.ema.load_state_dict(payload["ema"])
            self.data.load_state_dict(payload["data_cursor"])
            restore_rng(payload["rng"], self.setup.device)
        elif start.init_weights is not None:
            self.model.load_state_dict(start.init_weights)
        self._wrap()

    def _wrap(self) -> None:
        """DDP around the model under torchrun, then torch.compile around that if asked."""
        forward: torch.nn.Module = self.model
        if self.env.distributed:
            # broadcast_buffers=False: BatchNorm running statistics stay per rank (checkpoints keep rank 0's),
            # so each step makes exactly one gradient all-reduce and no buffer broadcast per micro-batch.
            self.ddp = DistributedDataParallel(
                self.model, device_ids=[self.setup.device.index] if self.setup.is_cuda else None,
                broadcast_buffers=False)
            if self.settings.runtime.ddp_diagnostics:
                self.allreduce_counter = AllReduceCounter()
                self.ddp.register_comm_hook(None, self.allreduce_counter.hook)
            forward = self.ddp
        runtime = self.settings.runtime
        self.forward = torch.compile(forward, mode=runtime.compile_mode) if runtime.compile else forward
        self.graphed = runtime.compile and runtime.compile_mode in ("reduce-overhead", "max-autotune")

    def payload(self, step: int) -> dict:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
            "settings": self.settings.to_dict(), "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": rng_state(self.setup.device), "data_cursor": self.data.state_dict(),
            "versions": versions(), "saved_at": time.time(), "world_size": self.env.world_size,
            "cpu_threads": self.cpu_threads,
        }

    def _value_target(self, batch, step: int) -> torch.Tensor:
        """The decoder's mixed target, or, while `loss.value_lambda` decays, the step's own mix of the result and
        eval parts (synthetic batches have only their one target)."""
        if self.value_lambda_decays and batch.result is not None and batch.eval_value is not None:
            return mixed_value_target(batch.result, batch.eval_value, value_lambda_at(step, self.settings.loss))
        return batch.value

    def train_step(self, step: int = 0) -> StepResult:
        """One optimizer step, the one that makes step `step + 1`. Under DDP every micro-batch but the last runs
        in `no_sync()`, so the step makes one gradient all-reduce however many micro-batches it has."""
        s, setup = self.settings, self.setup
        self.model.train()
        micro_steps = s.optim.accumulation_steps
        totals = torch.zeros(3, device=setup.device)
        data_wait = 0.0
        self.data.drawn.clear()
        for micro in range(micro_steps):
            if self.graphed:
                # CUDA graphs replay into the same output memory: a new step begins, so the last one's outputs
                # (already read) may be overwritten, and torch need not keep them alive.
                torch.compiler.cudagraph_mark_step_begin()
            waited = time.perf_counter()
            batch = self.data.next_batch()
            data_wait += time.perf_counter() - waited
            x1, x2 = batch.features1, batch.features2
            if setup.channels_last:
                x1 = x1.contiguous(memory_format=torch.channels_last)
                x2 = x2.contiguous(memory_format=torch.channels_last)
            else:
                # The loader's hand planes are a stride-0 view ([n, 57] broadcast to 9x9). Materialised once here,
                # since the convolution otherwise copies the view in its forward and again for the weight
                # gradient in its backward, and the strided input takes a slower CPU kernel: on a 2x32 net,
                # batch 256, that cost 15% of the step (docs/benchmarks.md, per-step speed).
                x2 = x2.contiguous()
            skip_sync = self.ddp is not None and micro < micro_steps - 1
            with self.ddp.no_sync() if skip_sync else contextlib.nullcontext():
                with setup.autocast():
                    policy_logits, value_logit = self.forward(x1, x2)
                policy_loss = policy_cross_entropy(policy_logits, batch)
                value_loss = F.binary_cross_entropy_with_logits(value_logit.float(), self._value_target(batch, step))
                loss = s.loss.policy_weight * policy_loss + s.loss.value_weight * value_loss
                if s.optim.policy_entropy_beta > 0:  # dlshogi's --beta: adds beta * sum(p log p), i.e. - beta * H
                    loss = loss - s.optim.policy_entropy_beta * policy_entropy(policy_logits).mean()
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
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        if self.allreduce_counter is not None:
            check_ranks_in_sync(self.model, self.env)
        digest = global_batch_digest(self.data.drawn, self.env) if self.data.record_draws else None
        return StepResult(totals, grad_norm.detach(), data_wait, lr, digest)

    def close(self) -> None:
        self.data.close()
