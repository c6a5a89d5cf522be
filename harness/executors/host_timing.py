"""Where a served step's time goes on the host and the device, and what async scheduling buys.

A step is schedule -> prepare (inputs, metadata) -> launch (the forward issued) -> device (the
forward running) -> sample. `cpu_overhead_frac` is the share of the steps' wall time the device
sat idle waiting for the host: 1 - sum(device) / sum(wall). On cuda, device time is the span
between CUDA events recorded before the forward is issued and after its logits (a launch-bound
step, where the GPU waits for each kernel, shows launch_s close to device_s); on cpu host and
device are the same processor, so device time is the forward itself.

Async scheduling (vLLM's) prepares step t + 1 while the device runs step t, so a step costs
max(device, host) instead of device + host: the lecture's 8 ms step with 2 ms of scheduling
takes 10 ms blocking and 8 ms async, 1.25x; 1 ms of serial host work costs ~17% at a 5 ms step.
"""

from __future__ import annotations

import time

import torch


def step_time_s(device_s: float, host_s: float, async_scheduling: bool) -> float:
    """Steady-state time per step when the host's work is serial with, or hidden behind, the device's."""
    return max(device_s, host_s) if async_scheduling else device_s + host_s


def async_speedup(device_s: float, host_s: float) -> float:
    return step_time_s(device_s, host_s, False) / step_time_s(device_s, host_s, True)


def overhead_share(host_s: float, device_s: float) -> float:
    """Share of a blocking step spent on serial host work (the device idle)."""
    return host_s / step_time_s(device_s, host_s, False)


class DeviceClock:
    """Per step: host seconds to issue the forward (launch) and seconds the device ran it."""

    def __init__(self, device: torch.device, threaded: bool = False):
        self.cuda = torch.device(device).type == "cuda"
        self.threaded = threaded and not self.cuda  # cpu forward on a worker thread: it reports `ran`
        self.launch_s: list[float] = []
        self._cpu_device_s: list[float] = []
        self._events: list[tuple] = []
        self._started = 0.0
        self._start_event = None
        self.timer = time.perf_counter

    def start(self) -> None:
        if self.cuda:
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
        self._started = self.timer()

    def stop(self) -> None:
        """Call right after the forward is issued, before waiting for it."""
        launch = self.timer() - self._started
        self.launch_s.append(launch)
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((self._start_event, end))
        elif not self.threaded:
            self._cpu_device_s.append(launch)

    def ran(self, seconds: float) -> None:
        """A threaded cpu forward's own duration, reported when it is collected."""
        self._cpu_device_s.append(seconds)

    def device_s(self) -> list[float]:
        if not self.cuda:
            return list(self._cpu_device_s)
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e-3 for start, end in self._events]


def overhead_columns(wall_s: list[float], clock: DeviceClock) -> dict:
    """Mean launch and device seconds per step, cpu_overhead_frac, and what async could buy.

    `async_bound_speedup` is the analytic model applied to these means: wall / max(device,
    host), the speedup of hiding all host work behind the device (1.0 when already hidden).
    """
    device = clock.device_s()
    steps = max(len(device), 1)
    wall, busy = sum(wall_s), sum(device)
    host = max(wall - busy, 0.0)
    return {
        "launch_s": sum(clock.launch_s) / steps,
        "device_s": busy / steps,
        "cpu_overhead_frac": host / wall if wall > 0 else 0.0,
        "async_bound_speedup": wall / max(busy, host) if wall > 0 else 1.0,
    }
