"""What the `gpu` event reports: per-device utilisation, memory, temperature and power, plus torch's
own memory figures. torch's NVML helpers map CUDA_VISIBLE_DEVICES to the right NVML devices for us;
each figure NVML cannot give (no nvidia-ml-py, an unsupported sensor) is left out rather than guessed."""

from __future__ import annotations

import torch


def _maybe(read, device: int):
    try:
        return read(device)
    except Exception:  # NVML missing or the sensor unsupported on this card: report the figure as absent
        return None


def _memory_used(index: int, training: torch.device) -> int | None:
    """NVML's figure; without NVML, CUDA's own for the training GPU only, which already has a context."""
    used = _maybe(lambda i: torch.cuda.device_memory_used(i), index)
    if used is None and index == training.index:
        free_total = _maybe(torch.cuda.mem_get_info, index)
        used = free_total[1] - free_total[0] if free_total else None
    return used


def gpu_snapshot(device: torch.device) -> dict | None:
    """The `gpu` event's fields for every visible CUDA device, or None when not training on CUDA."""
    if device.type != "cuda":
        return None
    devices = []
    for index in range(torch.cuda.device_count()):
        # Memory through NVML (device_memory_used), not torch.cuda.mem_get_info: that one creates a CUDA
        # context on every device it is asked about, half a GiB on each other rank's GPU under torchrun.
        properties = torch.cuda.get_device_properties(index)
        devices.append({
            "index": index,
            "name": properties.name,
            "utilization_percent": _maybe(torch.cuda.utilization, index),
            "memory_used_bytes": _memory_used(index, device),
            "memory_total_bytes": properties.total_memory,
            "temperature_c": _maybe(torch.cuda.temperature, index),
            "power_watts": (lambda mw: mw / 1000 if mw is not None else None)(_maybe(torch.cuda.power_draw, index)),
        })
    return {
        "devices": devices,
        "torch_peak_memory_bytes": torch.cuda.max_memory_allocated(device),
        "torch_memory_allocated_bytes": torch.cuda.memory_allocated(device),
    }
