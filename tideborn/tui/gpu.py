"""What the hardware is doing: GPUs from the trainer's `gpu` events and, on the run's own host, from
NVML directly (nvidia-ml-py); on a CPU run, the trainer process's CPU and memory (psutil). No textual.

NVML is asked only for the devices the trainer has processes on when it can tell; a figure a device
will not give (an unsupported sensor) is left out, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from tideborn.rundir.anomaly import same_process
from tideborn.rundir.files import process_facts
from tideborn.rundir.kinds import as_float


@dataclass(frozen=True)
class DeviceSample:
    index: int
    name: str
    utilization_percent: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    temperature_c: float | None = None
    power_watts: float | None = None


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    running: bool
    cpu_percent: float | None = None
    """Percent of one core (200 = two cores busy)."""
    rss_bytes: int | None = None
    threads: int | None = None


@dataclass(frozen=True)
class HardwareSample:
    """One look at the hardware. `source`: "nvml" (read here, now), "events" (the trainer's last `gpu`
    event) or "" (no GPU figures). `cpu_run`: the run trains on the CPU (None: not known yet)."""

    time: float
    devices: tuple[DeviceSample, ...] = ()
    source: str = ""
    cpu_run: bool | None = None
    process: ProcessSample | None = None
    torch_peak_memory_bytes: float | None = None
    torch_memory_allocated_bytes: float | None = None
    event_time: float | None = None
    """When the last `gpu` event was written."""
    note: str = ""


def devices_from_event(event: dict) -> tuple[DeviceSample, ...]:
    """The devices of a `gpu` event; missing or null fields stay None."""
    found = []
    devices = event.get("devices")
    for number, raw in enumerate(devices if isinstance(devices, list) else []):
        if not isinstance(raw, dict):
            continue
        index = raw.get("index")
        found.append(DeviceSample(
            index=index if isinstance(index, int) else number,
            name=str(raw.get("name") or f"GPU {number}"),
            utilization_percent=as_float(raw.get("utilization_percent")),
            memory_used_bytes=as_float(raw.get("memory_used_bytes")),
            memory_total_bytes=as_float(raw.get("memory_total_bytes")),
            temperature_c=as_float(raw.get("temperature_c")),
            power_watts=as_float(raw.get("power_watts")),
        ))
    return tuple(found)


class NvmlProbe:
    """NVML on this host; `available` is False (with `reason`) where there is no driver or library."""

    def __init__(self) -> None:
        self.available = False
        self.reason = ""
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
            return
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.reason = f"NVML unavailable: {exc}"
            return
        self.available = True

    def sample(self, pids: set[int]) -> tuple[DeviceSample, ...]:
        """Devices the given processes run on; all devices if none of them is on one."""
        if not self.available:
            return ()
        nvml = self._nvml
        samples, used_by_run = [], []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self.reason = f"NVML failed: {exc}"
            return ()
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            sample = DeviceSample(
                index=index, name=_read(lambda: _text(nvml.nvmlDeviceGetName(handle)), nvml) or f"GPU {index}",
                utilization_percent=_read(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), nvml),
                memory_used_bytes=_read(lambda: float(nvml.nvmlDeviceGetMemoryInfo(handle).used), nvml),
                memory_total_bytes=_read(lambda: float(nvml.nvmlDeviceGetMemoryInfo(handle).total), nvml),
                temperature_c=_read(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                                    nvml),
                power_watts=_read(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, nvml),
            )
            samples.append(sample)
            running = _read(lambda: {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}, nvml)
            if running and pids & running:
                used_by_run.append(sample)
        return tuple(used_by_run or samples)

    def close(self) -> None:
        if self.available:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass  # shutting down: nothing left to report it to
            self.available = False


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _read(read, nvml):
    try:
        return read()
    except nvml.NVMLError:
        return None  # this device does not report that figure


class ProcessProbe:
    """CPU and memory of one process; CPU percent needs two looks, so the probe keeps the process."""

    def __init__(self) -> None:
        self._process: psutil.Process | None = None

    def sample(self, pid: int | None, identity: dict | None = None) -> ProcessSample | None:
        """`identity`: train.pid's record of the process (`PidRecord.identity()`), to tell it from a reused pid."""
        if pid is None:
            return None
        try:
            if self._process is None or self._process.pid != pid:
                self._process = psutil.Process(pid)
                self._process.cpu_percent(None)  # the first call only sets the baseline
            process = self._process
            if identity is not None and not same_process(process_facts(pid), **identity):
                return ProcessSample(pid, running=False)  # the pid now belongs to another process
            with process.oneshot():
                if process.status() == psutil.STATUS_ZOMBIE:
                    return ProcessSample(pid, running=False)
                return ProcessSample(pid, True, process.cpu_percent(None), process.memory_info().rss,
                                     process.num_threads())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._process = None
            return ProcessSample(pid, running=False)
        except psutil.AccessDenied:
            return ProcessSample(pid, running=True)
