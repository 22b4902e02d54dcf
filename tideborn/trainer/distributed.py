"""The process group under torchrun: NCCL on CUDA, gloo on the CPU, and the few collectives the loop
needs. A process launched alone (world size 1, see `tideborn.trainer.rank`) creates no process group.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from tideborn.trainer.rank import DistEnv

FAILURE_KEY = "tideborn/failed"
"""Where a failing rank leaves its one-line error in the process group's store, for rank 0's event."""


def init_process_group(env: DistEnv, device: torch.device, timeout_seconds: float) -> None:
    """NCCL on CUDA (one device per local rank), gloo on the CPU."""
    if not env.distributed:
        return
    timeout = datetime.timedelta(seconds=timeout_seconds)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=env.rank, world_size=env.world_size, timeout=timeout,
                                device_id=device)
    else:
        dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size, timeout=timeout)


def close_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def any_rank(flag: bool, env: DistEnv, device: torch.device) -> bool:
    """True on every rank when `flag` is true on at least one (a stop signal that reached only some)."""
    if not env.distributed:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def mean_over_ranks(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= env.world_size
    return values


def report_failure(env: DistEnv, text: str) -> None:
    """Leave this rank's error in the store so that rank 0's `run_failed` can name the rank that failed."""
    if not (env.distributed and dist.is_initialized()):
        return
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(FAILURE_KEY, f"rank {env.rank}: {text}")
    except Exception:  # the store went down with the job: the rank's stderr in train.log still says it
        pass


def failure_elsewhere(env: DistEnv) -> str | None:
    """The error another rank reported, if any (rank 0 asks when its own step fails)."""
    if not (env.distributed and dist.is_initialized()):
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        if store.check([FAILURE_KEY]):
            return store.get(FAILURE_KEY).decode(errors="replace")
    except Exception:  # the store went down with the job: report what this rank saw
        return None
    return None


class AllReduceCounter:
    """A DDP communication hook that counts gradient all-reduces (one per bucket) and then does the default
    all-reduce; for tests and benchmarks that check `no_sync()` really skips communication."""

    def __init__(self) -> None:
        self.calls = 0

    # No annotations: DDP compares them with the real classes, and this module's are strings.
    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.calls += 1
        return allreduce_hook(state, bucket)


def check_ranks_in_sync(model: torch.nn.Module, env: DistEnv) -> None:
    """Raise if any rank's parameters differ from rank 0's (compared through a float64 fingerprint of
    every parameter: identical weights give bit-identical fingerprints)."""
    fingerprint = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                               for p in model.parameters()]).flatten()
    gathered = [torch.empty_like(fingerprint) for _ in range(env.world_size)]
    dist.all_gather(gathered, fingerprint)
    for rank, other in enumerate(gathered[1:], start=1):
        if not torch.equal(other, gathered[0]):
            raise RuntimeError(f"rank {rank}'s parameters differ from rank 0's after a step")
