"""The device side of a measurement: how to sync, read events and memory, name it.

``make_probe`` builds the timer's :class:`~pytest_mps.benchmark.timer.Probe` for
the devices a benchmark syncs; ``hardware`` names them for the table and the
JSON; ``release_memory`` hands cached device blocks back between benchmarks.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from pytest_mps import accelerator, backend
from pytest_mps.benchmark.timer import Probe
from pytest_mps.devices import emulated
from pytest_mps.machine.fingerprint import cpu_name


def make_probe(config: pytest.Config, devices: list[str]) -> Probe:
    """A probe that syncs ``devices`` through ``pytest_mps_synchronize``.

    With one accelerator it also records device events and peak memory.
    """
    hook = config.hook.pytest_mps_synchronize
    accelerators = [d for d in devices if d != "cpu"]
    if emulated(config):
        # The emulated mps device computes on the CPU as it goes: no queue to
        # drain, no events, no device memory of its own. Timed as the CPU is.
        accelerators = [d for d in accelerators if not d.startswith("mps")]
    # A conftest's own sync implementation means there is a queue to wait for.
    plugged = len(hook.get_hookimpls()) > 1
    if not accelerators and not plugged:
        # Plain CPU: the sync is a no-op, so skip even the hook call (about a
        # microsecond) that would otherwise sit inside every round.
        return Probe()
    if len(devices) == 1:
        only = devices[0]

        def synchronize() -> None:
            hook(device=only)
    else:

        def synchronize() -> None:
            for name in devices:
                hook(device=name)

    if len(accelerators) != 1:
        return Probe(synchronize, asynchronous=bool(accelerators) or plugged)
    import torch

    device = torch.device(accelerators[0])

    def new_events() -> Any:
        return accelerator.timing_event(device), accelerator.timing_event(device)

    def reset_peak_memory() -> None:
        accelerator.reset_peak_memory(device)

    def memory() -> int | None:
        # CUDA keeps a true peak; MPS reports only the current allocation, so
        # its "peak" is the largest reading at the end of a round.
        stats = accelerator.memory_stats(device)
        if stats is None:
            return None
        return stats.get("peak_allocated", stats["allocated"])

    return Probe(synchronize, new_events, reset_peak_memory, memory, True)


def hardware(device: str) -> tuple[str, str | None]:
    """The device's hardware name, and CUDA's compute capability."""
    if "+" in device:  # several devices synced: a test without 'device'
        return " + ".join(hardware(d)[0] for d in device.split("+")), None
    if device == "cpu":
        return cpu_name(), None
    if device == "mps":
        cores = backend.gpu_core_count()
        chip = backend.chip_name() or "Apple GPU"
        return (f"{chip} ({cores}-core GPU)" if cores else chip), None
    import torch

    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(device)
        return str(torch.cuda.get_device_name(device)), f"{major}.{minor}"
    return accelerator.device_name(torch.device(device)), None


def release_memory(devices: list[str]) -> None:
    """Collect garbage and hand cached device blocks back (pytest-benchmark#215)."""
    gc.collect()
    accelerators = [d for d in devices if d != "cpu"]
    if not accelerators:
        return
    import torch

    for name in accelerators:
        accelerator.empty_cache(torch.device(name))
