"""The process group under torchrun: NCCL on CUDA, gloo on the CPU, and the few collectives the loop
needs. A process launched alone (world size 1, see `tideborn.trainer.rank`) creates no process group.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import typing

import numpy as np
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


class StopVote:
    """The ranks agree, every step, on whether to stop (a signal may reach only some of them), without
    making the host wait for the GPU.

    A plain `any_rank` each step would: its result must come back to the host, so the host would wait for
    the whole step (backward and gradient all-reduce) before queueing the next, and the GPU would idle
    while it does. Here each step's vote is all-reduced asynchronously and its result read `LAG` steps
    later. By then the GPU has long finished that vote; waiting for it leaves the newer steps queued, so
    the GPU never runs dry. Every rank reads the same vote at the same step, so all stop together, at
    most `LAG` steps after the signal. Without a process group the flag is the answer at once.
    """

    LAG = 2

    def __init__(self, env: DistEnv, device: torch.device):
        self.env, self.device = env, device
        self.pending: collections.deque[tuple[torch.Tensor, typing.Callable[[], object]]] = collections.deque()

    def __call__(self, flag: bool) -> bool:
        if not self.env.distributed:
            return flag
        # torch.full fills on the device (a kernel); torch.tensor([..], device=...) would copy from the
        # host, and such a copy waits for the GPU.
        vote = torch.full((1,), 1.0 if flag else 0.0, device=self.device)
        work = dist.all_reduce(vote, op=dist.ReduceOp.MAX, async_op=True)
        if self.device.type == "cuda":
            work.wait()  # for NCCL: the current stream waits for the all-reduce; the host does not
            host = torch.empty(1, pin_memory=True)
            host.copy_(vote, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self.pending.append((host, done.synchronize))
        else:
            self.pending.append((vote, work.wait))
        if len(self.pending) <= self.LAG:
            return False
        return self._read_oldest()

    def _read_oldest(self) -> bool:
        result, wait = self.pending.popleft()
        wait()
        return bool(result.item())

    def drain(self) -> None:
        """Wait for the votes still in flight (before the process group goes away)."""
        while self.pending:
            self._read_oldest()


def restart_count_of_job(env: DistEnv, device: torch.device) -> DistEnv:
    """`env` with the job's restart count: the highest of the ranks'. An agent that joined later counts its own
    restarts from 0, and rank 0 (which writes run_started) may be one of its workers."""
    if not env.distributed:
        return env
    value = torch.tensor([float(env.restart_count)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return dataclasses.replace(env, restart_count=int(value.item()))


def worker_identities(env: DistEnv) -> tuple[dict, ...]:
    """Every rank's process, as the run directory's lock records it (pid, host, start), gathered on every rank:
    should torchrun's agent die and a worker survive it, `train_run stop` finds and stops each one."""
    import psutil

    from tideborn.rundir.files import boot_relative_start, this_host

    me = psutil.Process()
    mine = {"rank": env.rank, "pid": me.pid, "host": this_host(), "start_time": me.create_time(),
            **boot_relative_start(me.pid)}
    if not env.distributed:
        return (mine,)
    everyone: list = [None] * env.world_size
    dist.all_gather_object(everyone, mine)
    return tuple(everyone)


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


def global_batch_digest(drawn: typing.Sequence[tuple[object, typing.Sequence[int]]], env: DistEnv) -> str:
    """A digest of one step's global batch, the same on every rank: each rank's micro-batches `(key, record
    indices)` gathered from all ranks and hashed in the order of their keys (their place in the global order),
    so a step of any world size that trained the same positions in the same micro-batches has the same digest.
    For `runtime.ddp_diagnostics`: one object all-gather a step."""
    mine = [(key, np.asarray(ids, dtype=np.int64).tobytes()) for key, ids in drawn]
    if env.distributed:
        everyone: list = [None] * env.world_size
        dist.all_gather_object(everyone, mine)
        mine = [item for part in everyone for item in part]
    digest = hashlib.sha256()
    for _, ids in sorted(mine, key=lambda item: item[0]):
        digest.update(len(ids).to_bytes(8, "little"))
        digest.update(ids)
    return digest.hexdigest()[:16]
