"""Device, precision and fast-path switches resolved from `[runtime]` for the machine at hand."""

from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass

import torch

from tideborn.config.schema import RuntimeSettings
from tideborn.errors import UserError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it accepts on 64-bit (HEAP_MAX_SIZE / 2).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20
_TRIM_THRESHOLD = 1 << 30


@dataclass(frozen=True)
class DeviceSetup:
    device: torch.device
    precision: str
    """The precision actually used: fp32, bf16 or fp16."""
    channels_last: bool

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return _DTYPES.get(self.precision)

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def describe(self) -> str:
        name = str(self.device)
        if self.is_cuda:
            name += f" ({torch.cuda.get_device_name(self.device)})"
        extras = [self.precision] + (["channels_last"] if self.channels_last else [])
        return f"{name}, {', '.join(extras)}"


def resolve_device(runtime: RuntimeSettings, local_rank: int | None = None) -> DeviceSetup:
    """Pick the device and precision; raise `UserError` for a request this machine cannot meet.

    Under torchrun (`local_rank` given) each process takes the CUDA device of its local rank."""
    cuda = torch.cuda.is_available()
    if local_rank is not None and runtime.device.startswith("cuda:"):
        raise UserError(f"runtime.device={runtime.device!r}: under torchrun each process uses cuda:LOCAL_RANK; "
                        "set runtime.device to \"auto\" or \"cuda\" (choose GPUs with CUDA_VISIBLE_DEVICES)")
    if runtime.device == "auto":
        device = torch.device("cuda" if cuda else "cpu")
    else:
        device = torch.device(runtime.device)
        if device.type == "cuda":
            if not cuda:
                raise UserError(f"runtime.device={runtime.device!r}, but CUDA is not available "
                                "(no GPU or a CPU build of torch); use runtime.device=\"auto\" or \"cpu\"")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise UserError(f"runtime.device={runtime.device!r}, but only "
                                f"{torch.cuda.device_count()} CUDA device(s) are visible")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank if local_rank is not None else torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {local_rank} has no GPU: only {torch.cuda.device_count()} visible; "
                            "start no more processes per node than GPUs")
    precision = runtime.precision
    # Asked of the training device itself (torch.cuda.is_bf16_supported asks the current device, which is
    # GPU 0 until set_device). Native bf16 needs Ampere (8.0) or newer; V100 and T4 (7.x) only emulate it,
    # many times slower than fp16 on their tensor cores; older GPUs have no fp16 tensor cores either.
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)
    native_bf16 = capability >= (8, 0)
    if precision == "auto":
        precision = "bf16" if native_bf16 else "fp16" if capability >= (7, 0) else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise UserError("runtime.precision=\"fp16\" needs CUDA (its grad scaler is CUDA-only); "
                        "use \"bf16\" or \"fp32\" on the CPU")
    if precision == "bf16" and device.type == "cuda" and not native_bf16:
        raise UserError(f"runtime.precision=\"bf16\": {torch.cuda.get_device_name(device)} has no native bf16 "
                        "(only a slow emulation); use \"fp16\" or \"auto\"")
    # channels_last on the CPU too: oneDNN's convolutions in that layout trained 1.14-1.59x faster than NCHW
    # (fp32 and bf16, 2x32 and 10x192 nets; docs/benchmarks.md).
    return DeviceSetup(device, precision, channels_last=runtime.channels_last)


def auto_threads(workers: int, cores: int | None = None, load: float | None = None) -> int:
    """torch's CPU threads for `runtime.threads = 0`: the cores this process may use that are free (minus the
    1-minute load average at start, so a busy machine is not oversubscribed: on a shared 2-core CPU a second
    thread made a small net 3x slower), less one core for each data worker after the first (the first shares
    a core: a worker feeding a small net waits on its queue much of the time). At least 1."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    free = max(1, min(cores, round(cores - load)))
    return max(1, free - max(0, workers - 1))


@dataclass(frozen=True)
class CpuThreads:
    """torch's CPU threads for this run, and what chose them (`run_started.cpu_threads_source`)."""

    count: int
    source: str
    """"runtime.threads", "checkpoint" (the count the resumed run used), "auto" (free cores), "OMP_NUM_THREADS",
    or "torch" (its own default, on CUDA)."""


def choose_threads(runtime: RuntimeSettings, setup: DeviceSetup, workers: int = 0,
                   resumed_threads: int | None = None) -> int | None:
    """The count to set, or None to keep torch's. With `runtime.threads = 0` a resumed run takes the count of
    the run it continues (`resumed_threads`, from its checkpoint): a different count sums floats in another
    order, and the resume would no longer be exact; the load that chose it then is no reason to change now."""
    if runtime.threads:
        return runtime.threads
    if setup.is_cuda or "OMP_NUM_THREADS" in os.environ:  # an OMP_NUM_THREADS given is a choice
        return None
    return resumed_threads if resumed_threads is not None else auto_threads(workers)


def keep_freed_host_memory() -> bool:
    """Let glibc's malloc keep the memory a training step frees for the next step instead of handing it back to
    the kernel; False where the C library is not glibc (nothing changed).

    A CPU step allocates and frees its activations and gradients (megabytes each) every step. By default glibc
    unmaps a block above its adaptive mmap threshold when it is freed, and trims the top of its heap once more
    than twice that threshold is free, so the next step maps the same memory afresh and takes a page fault per
    4 KiB page: 20,000 to 50,000 faults per 2x32 batch-1024 step here, about 10% of the step, and the source of
    the gap to dlshogi's step at batch 1024 (docs/benchmarks.md, per-step speed). Fixed thresholds keep blocks
    up to 32 MiB on the heap and up to 1 GiB of free heap mapped, as CUDA's caching allocator keeps GPU memory.
    A tuning of the C library's own allocator, not a replacement (jemalloc, tcmalloc): nothing to install."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):  # the name is unknown outside glibc (musl, macOS): that allocator is left alone
        glibc = None
    if not glibc:
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and libc.mallopt(_M_TRIM_THRESHOLD,
                                                                                      _TRIM_THRESHOLD))


def apply_global_switches(runtime: RuntimeSettings, setup: DeviceSetup, workers: int = 0,
                          resumed_threads: int | None = None) -> CpuThreads:
    """Set torch's global switches; returns the CPU threads torch uses and what chose them."""
    chosen = choose_threads(runtime, setup, workers, resumed_threads)
    if chosen is not None:
        torch.set_num_threads(chosen)
    if runtime.threads:
        source = "runtime.threads"
    elif chosen is None:
        source = "OMP_NUM_THREADS" if "OMP_NUM_THREADS" in os.environ and not setup.is_cuda else "torch"
    else:
        source = "checkpoint" if resumed_threads is not None else "auto"
    if runtime.deterministic:
        # cuBLAS is deterministic only with a fixed workspace, read when it first starts: set before any matmul.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: an op without a deterministic kernel says so in the log instead of failing a long run. Set
    # either way, so that a process building several trainers (the GPU check's sweep) does not keep it on.
    torch.use_deterministic_algorithms(runtime.deterministic, warn_only=True)
    if setup.is_cuda:
        # The training device becomes the current one, so that calls without a device (synchronize, the
        # pin-memory thread, new CUDA tensors) never create a context on GPU 0 when training on cuda:N.
        torch.cuda.set_device(setup.device)
        torch.backends.cuda.matmul.allow_tf32 = runtime.tf32
        torch.backends.cudnn.allow_tf32 = runtime.tf32
        # autotuning picks kernels by timing, so two processes can pick different ones (and sum differently)
        torch.backends.cudnn.benchmark = not runtime.deterministic
        torch.backends.cudnn.deterministic = runtime.deterministic
    else:
        keep_freed_host_memory()
    return CpuThreads(torch.get_num_threads(), source)
