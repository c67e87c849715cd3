"""The MPS shim: the only module that touches ``torch.mps`` and ``torch.backends.mps``.

Everything else in pytest-mps talks to :mod:`pytest_mps.accelerator`, which sends
MPS work here. Tests on Linux replace only ``torch.backends.mps.is_built`` /
``is_available`` and the platform facts, never the functions below.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache
from typing import Any

#: First macOS release with MPS support (PyTorch's "Getting started on Mac").
MIN_MACOS = (12, 3)


def torch_installed() -> bool:
    """True when torch can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def mps_built() -> bool:
    """``torch.backends.mps.is_built()``: False for every Linux and Windows wheel."""
    import torch

    return bool(torch.backends.mps.is_built())


def mps_available() -> bool:
    """``torch.backends.mps.is_available()``."""
    import torch

    return bool(torch.backends.mps.is_available())


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def macos_version() -> str | None:
    """The macOS version (``"14.5"``), or None off macOS.

    The real host's: under ``--mps-emulate`` ``platform.mac_ver()`` answers
    as the emulated Mac and keeps the host's answer beside it (emulate/host.py).
    """
    import platform

    answer = getattr(platform.mac_ver, "pytest_mps_real", None)
    release = (answer if answer is not None else platform.mac_ver())[0]
    return release or None


def mps_unavailable_reason() -> str | None:
    """Why MPS cannot be used in this process, or None when it can.

    The three cases are the ones PyTorch itself distinguishes in the
    ``torch.backends.mps`` docs: not installed, not built, built but not available.
    """
    if not torch_installed():
        return "torch is not installed (pip install torch)"
    import platform

    import torch

    if not mps_built():
        return (
            f"torch {torch.__version__} was built without MPS "
            "(torch.backends.mps.is_built() is False, as for every Linux and "
            f"Windows wheel; this machine runs {platform.system()} "
            f"{platform.machine()})"
        )
    if mps_available():
        return None
    mac = macos_version()
    if mac is not None and _version_tuple(mac) < MIN_MACOS:
        return (
            f"torch is built with MPS but it is not available: macOS {mac} is "
            "older than 12.3, the first release with MPS"
        )
    machine = platform.machine()
    if machine != "arm64":
        return (
            "torch is built with MPS but it is not available: this Mac is not "
            f"Apple silicon (machine {machine})"
        )
    return (
        "torch is built with MPS but it is not available: no Metal GPU is "
        "visible, as in virtual machines such as GitHub's hosted macOS runners"
    )


def _sysctl(name: str) -> str | None:
    if sys.platform != "darwin":
        return None
    import subprocess

    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    value = out.stdout.strip()
    return value or None


@lru_cache(maxsize=1)
def chip_name() -> str | None:
    """The Apple chip's name (``"Apple M3 Max"``), or None off macOS."""
    return _sysctl("machdep.cpu.brand_string")


@lru_cache(maxsize=1)
def gpu_core_count() -> int | None:
    """The GPU core count that ``ioreg`` reports for the AGX accelerator."""
    if sys.platform != "darwin":
        return None
    import subprocess

    try:
        out = subprocess.run(
            ["ioreg", "-rc", "AGXAccelerator", "-d1"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        if '"gpu-core-count"' in line:
            tail = line.rsplit("=", 1)[-1].strip()
            if tail.isdigit():
                return int(tail)
    return None


def synchronize() -> None:
    """Wait for every kernel queued on the MPS device (``torch.mps.synchronize``)."""
    import torch

    torch.mps.synchronize()


def manual_seed(seed: int) -> None:
    """Seed the MPS generator."""
    import torch

    torch.mps.manual_seed(seed)


def empty_cache() -> None:
    """Release the MPS allocator's cached blocks."""
    import torch

    torch.mps.empty_cache()


def memory_stats() -> dict[str, int]:
    """The MPS allocator's counters, in bytes."""
    import torch

    return {
        "allocated": int(torch.mps.current_allocated_memory()),
        "driver_allocated": int(torch.mps.driver_allocated_memory()),
        "recommended_max": int(torch.mps.recommended_max_memory()),
    }


def timing_event() -> Any:
    """A ``torch.mps.Event(enable_timing=True)``."""
    import torch

    return torch.mps.Event(enable_timing=True)


def computed_kernel(op_name: str) -> str:
    """The dispatcher's MPS kernel for ``op_name``; names MPSFallback.mm for fallbacks.

    Only meaningful on a Mac with an MPS build.
    """
    import torch

    return repr(
        torch._C._dispatch_get_computed_kernel_for_dispatch_key(
            op_name, torch._C.DispatchKey.MPS
        )
    )


def has_kernel(op_name: str, dispatch_key: str = "MPS") -> bool:
    """True when ``op_name`` has a kernel registered directly at ``dispatch_key``.

    Alias keys (``CompositeImplicitAutograd``) count their own registrations;
    the MPS answer is only meaningful on a Mac with an MPS build.
    """
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op_name, dispatch_key))
