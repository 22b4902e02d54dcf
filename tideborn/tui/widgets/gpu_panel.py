"""Hardware pane: per GPU utilisation, memory, temperature and power with a short utilisation history;
on a CPU run it says so and shows the trainer process's CPU and memory instead."""

from __future__ import annotations

import collections
import typing

from rich.text import Text
from textual.widget import Widget

from tideborn.humanize import duration
from tideborn.tui.gpu import DeviceSample, HardwareSample

HISTORY = 24
BARS = "▁▂▃▄▅▆▇█"
ASCII_BARS = "_.-=+*#@"


def gib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f}"


def spark(values: typing.Iterable[float | None], top: float, ascii: bool) -> str:
    bars = ASCII_BARS if ascii else BARS
    out = []
    for value in values:
        if value is None:
            out.append(" ")
            continue
        level = int(min(max(value / top, 0.0), 1.0) * (len(bars) - 1) + 0.5) if top > 0 else 0
        out.append(bars[level])
    return "".join(out)


class GpuPanel(Widget):
    def __init__(self, clock: typing.Callable[[], float], ascii: bool = False, colour: bool = True,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.clock = clock
        self.ascii = ascii
        self.colour = colour
        self.sample: HardwareSample | None = None
        self.utilization: dict[int, collections.deque] = {}
        self.memory: dict[int, collections.deque] = {}
        self.cpu: collections.deque = collections.deque(maxlen=HISTORY)

    def on_mount(self) -> None:
        self.border_title = "hardware"

    def render(self) -> Text:
        return self.text()

    def show_sample(self, sample: HardwareSample) -> None:
        self.sample = sample
        for device in sample.devices:
            self.utilization.setdefault(device.index, collections.deque(maxlen=HISTORY)).append(
                device.utilization_percent)
            fraction = (device.memory_used_bytes / device.memory_total_bytes
                        if device.memory_used_bytes is not None and device.memory_total_bytes else None)
            self.memory.setdefault(device.index, collections.deque(maxlen=HISTORY)).append(fraction)
        if sample.process is not None and sample.process.running:
            self.cpu.append(sample.process.cpu_percent)
        self.border_title = {"nvml": "GPU (NVML, live)", "events": "GPU (trainer events)"}.get(
            sample.source, "hardware")
        self.refresh()  # a fixed size: no layout pass

    def _style(self, style: str) -> str:
        return style if self.colour else ""

    def text(self) -> Text:
        sample = self.sample
        if sample is None:
            return Text("waiting for the first sample", style="dim")
        out = Text(no_wrap=True, overflow="ellipsis")
        if sample.devices:
            for device in sample.devices:
                self._device(out, device)
            if sample.torch_peak_memory_bytes is not None:
                out.append(f"torch peak {gib(sample.torch_peak_memory_bytes)} GiB", style=self._style("dim"))
                if sample.torch_memory_allocated_bytes is not None:
                    out.append(f", now {gib(sample.torch_memory_allocated_bytes)}", style=self._style("dim"))
                out.append("\n")
            if sample.source == "events" and sample.event_time is not None:
                out.append(f"gpu event {duration(self.clock() - sample.event_time)} ago\n",
                           style=self._style("dim"))
        elif sample.cpu_run:
            out.append("CPU run: no GPU in use\n", style=self._style("bold"))
        elif sample.cpu_run is None:
            out.append("no run yet: device unknown\n", style=self._style("dim"))
        else:
            out.append("GPU run: no GPU figures yet\n", style=self._style("bold"))
        if sample.note:
            out.append(sample.note + "\n", style=self._style("dim"))
        process = sample.process
        if process is not None:
            if not process.running:
                out.append(f"trainer {process.pid}: exited\n", style=self._style("dim"))
            else:
                out.append(f"trainer pid {process.pid}\n")
                cpu = "?" if process.cpu_percent is None else f"{process.cpu_percent:.0f}%"
                out.append(f" CPU {cpu:>5} {spark(self.cpu, max([c or 0 for c in self.cpu] + [100.0]), self.ascii)}\n")
                rss = "?" if process.rss_bytes is None else f"{process.rss_bytes / 2**20:,.0f} MiB"
                out.append(f" RSS {rss}, {process.threads or '?'} threads\n")
        out.rstrip()
        return out

    def _device(self, out: Text, device: DeviceSample) -> None:
        name = device.name.replace("NVIDIA ", "")
        out.append(f"{device.index} {name}\n", style=self._style("bold"))
        util = "?" if device.utilization_percent is None else f"{device.utilization_percent:.0f}%"
        out.append(f" util {util:>4} ")
        out.append(spark(self.utilization.get(device.index, ()), 100.0, self.ascii) + "\n",
                   style=self._style("green"))
        out.append(f" mem {gib(device.memory_used_bytes)}/{gib(device.memory_total_bytes)} GiB ")
        out.append(spark(self.memory.get(device.index, ()), 1.0, self.ascii) + "\n", style=self._style("magenta"))
        extras = []
        if device.temperature_c is not None:
            extras.append(f"{device.temperature_c:.0f}°C" if not self.ascii else f"{device.temperature_c:.0f} C")
        if device.power_watts is not None:
            extras.append(f"{device.power_watts:.0f} W")
        if extras:
            out.append(" " + "  ".join(extras) + "\n")
