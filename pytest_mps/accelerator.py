"""Device-generic operations: one path for CPU, CUDA and MPS.

MPS calls go through :mod:`pytest_mps.backend`; CUDA and other accelerators
through ``torch.accelerator`` where it serves and ``torch.cuda`` for the rest;
CPU operations are no-ops where there is nothing to wait for or measure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pytest_mps import backend

if TYPE_CHECKING:
    import torch

_SPEC = re.compile(r"^(cpu|mps|cuda|meta)(?::(\d+))?$")


def canonical(device: str | torch.device) -> str:
    """One name per device: ``mps`` and ``mps:0`` are both ``mps:0``.

    ``cuda`` without an index is the current CUDA device, as torch reads it.
    """
    text = str(device)
    match = _SPEC.match(text)
    if match is None:
        return text
    kind, index = match.group(1), match.group(2)
    if kind in ("cpu", "meta"):
        return kind
    if index is None:
        index = "0"
        if kind == "cuda":
            import torch

            # current_device() would start CUDA in this process, and a
            # process that forks children for tests (the isolation's fork
            # server) must not have: before CUDA starts, it is device 0.
            if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
                index = str(torch.cuda.current_device())
    return f"{kind}:{index}"


def synchronize(device: torch.device) -> None:
    """Block until every kernel queued on ``device`` has finished."""
    if device.type == "cpu" or device.type == "meta":
        return
    if device.type == "mps":
        backend.synchronize()
        return
    import torch

    torch.accelerator.synchronize(device)


def manual_seed(device: torch.device, seed: int) -> None:
    """Seed ``device``'s own generator (CPU is seeded by ``torch.manual_seed``)."""
    import torch

    if device.type == "mps":
        backend.manual_seed(seed)
    elif device.type == "cuda":
        # torch.cuda.manual_seed seeds the current device; cuda:N is not always it
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)


def empty_cache(device: torch.device) -> None:
    """Release the device allocator's cached, unused blocks."""
    import torch

    if device.type == "mps":
        backend.empty_cache()
    elif device.type == "cuda":
        torch.cuda.empty_cache()


def memory_stats(device: torch.device) -> dict[str, int] | None:
    """Allocator counters in bytes, or None where the backend reports none (CPU)."""
    import torch

    if device.type == "mps":
        return backend.memory_stats()
    if device.type == "cuda":
        return {
            "allocated": int(torch.cuda.memory_allocated(device)),
            "peak_allocated": int(torch.cuda.max_memory_allocated(device)),
            "reserved": int(torch.cuda.memory_reserved(device)),
        }
    return None


def timing_event(device: torch.device) -> Any | None:
    """A device timing event, or None where the backend has none (CPU)."""
    import torch

    if device.type == "mps":
        return backend.timing_event()
    if device.type == "cuda":
        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    return None


def device_name(device: torch.device) -> str:
    """A human name for the device's hardware (``NVIDIA H100 80GB HBM3``)."""
    import platform

    import torch

    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    if device.type == "mps":
        return backend.chip_name() or "Apple GPU"
    return platform.processor() or platform.machine()


def reset_peak_memory(device: torch.device) -> bool:
    """Restart the allocator's peak counter; False where there is none (CPU, MPS)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    return False
