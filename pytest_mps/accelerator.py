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


#: The key of an allocator's peak in ``torch.accelerator.memory_stats`` (the
#: CUDA caching allocator's names, which MPS's follow from torch 2.15 on:
#: pytorch#186748, #193838).
PEAK_KEY = "allocated_bytes.all.peak"


def _accelerator_stats(device: torch.device) -> dict[str, Any] | None:
    """``torch.accelerator.memory_stats(device)`` where it holds a peak, else None.

    torch 2.13 raises for MPS ("Cannot access accelerator device ..."), and
    a build without the device's allocator answers an empty mapping.
    """
    import torch

    reader = getattr(getattr(torch, "accelerator", None), "memory_stats", None)
    if reader is None or device.type in ("cpu", "meta"):
        return None
    if device.type == "cuda" and not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        # asking before CUDA starts leaves torch.cuda's calls refusing the
        # device ("Invalid device argument", torch 2.11 on an H200)
        return None
    try:
        stats = dict(reader(device))
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError):
        return None
    return stats if PEAK_KEY in stats else None


def memory_stats(device: torch.device) -> dict[str, int] | None:
    """Allocator counters in bytes, or None where the backend reports none (CPU).

    ``allocated`` always; ``peak_allocated`` where the allocator keeps a peak
    (:func:`peak_source` names it).
    """
    import torch

    if device.type == "mps":
        stats = backend.memory_stats()
        found = _accelerator_stats(device)
        if found is not None:
            stats["peak_allocated"] = int(found[PEAK_KEY])
        return stats
    if device.type == "cuda":
        found = _accelerator_stats(device)
        return {
            "allocated": int(torch.cuda.memory_allocated(device)),
            "peak_allocated": int(
                found[PEAK_KEY]
                if found is not None
                else torch.cuda.max_memory_allocated(device)
            ),
            "reserved": int(torch.cuda.memory_reserved(device)),
        }
    return None


def peak_source(device: torch.device) -> str | None:
    """Where ``memory_stats``'s peak comes from, or None where there is none.

    ``torch.accelerator.memory_stats`` (any accelerator whose torch keeps
    them: CUDA, and MPS from torch 2.15), ``torch.cuda.max_memory_allocated``
    (an older torch's CUDA); None for MPS before 2.15 and the CPU.
    """
    if _accelerator_stats(device) is not None:
        return "torch.accelerator.memory_stats"
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated"
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
    """Restart the allocator's peak counter; False where there is none."""
    import torch

    if _accelerator_stats(device) is not None:
        torch.accelerator.reset_peak_memory_stats(device)
        return True
    if device.type == "cuda":
        # Before CUDA starts its counters are zero already, and torch refuses
        # the reset ("Invalid device argument", torch 2.11: synchronizing
        # through torch.accelerator does not start it)
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.reset_peak_memory_stats(device)
        return True
    return False
