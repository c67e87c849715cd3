"""What the session runs on: torch, devices, the Mac, MPS variables (the record).

The ``mps_environment`` fixture returns a :class:`MpsEnvironment` and the session
header prints one (:mod:`.environment`). Apart from that module, which pytest
imports at start-up, because creating a NamedTuple class costs 0.3-0.5 ms there;
a suite that never imports torch and asks nothing of pytest-mps never reads it.
"""

# No ``from __future__ import annotations``: typing.NamedTuple compiles each
# string annotation.

import importlib.metadata
import os
import sys
from collections.abc import Mapping
from typing import NamedTuple

import pytest

from pytest_mps import backend
from pytest_mps.devices import devices_key, emulated

# The variables PyTorch reads, from docs/source/mps_environment_variables.md and
# the getenv calls in aten/src/ATen/mps/ (MPSAllocator.mm, MPSProfiler.mm,
# MPSDevice.mm) and aten/src/ATen/native/mps/OperationUtils.mm.
KNOWN_VARIABLES = (
    "PYTORCH_ENABLE_MPS_FALLBACK",
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO",
    "PYTORCH_MPS_LOW_WATERMARK_RATIO",
    "PYTORCH_MPS_FAST_MATH",
    "PYTORCH_MPS_PREFER_METAL",
    "PYTORCH_MPS_LOG_PROFILE_INFO",
    "PYTORCH_MPS_TRACE_SIGNPOSTS",
    "PYTORCH_DEBUG_MPS_ALLOCATOR",
)


def variable_warnings(env: Mapping[str, str]) -> list[str]:
    """Warnings for MPS variables that do nothing or harm, as PyTorch reads them."""
    from pytest_mps.machine.fingerprint import STRTOD_PREFIX as _STRTOD_PREFIX
    from pytest_mps.machine.fingerprint import strtod as _strtod

    found: list[str] = []
    for name in sorted(env):
        if not (name.startswith("PYTORCH_MPS_") or name in KNOWN_VARIABLES):
            continue
        value = env[name]
        if name == "PYTORCH_MPS_LOG_LEVEL":
            found.append(
                "PYTORCH_MPS_LOG_LEVEL does not exist in PyTorch: it does nothing "
                "(PYTORCH_DEBUG_MPS_ALLOCATOR and PYTORCH_MPS_LOG_PROFILE_INFO log)"
            )
        elif name not in KNOWN_VARIABLES:
            found.append(f"{name} is not read by PyTorch: it does nothing")
        elif name.endswith("_WATERMARK_RATIO"):
            # MPSAllocator.mm: strtod(value, nullptr), then
            # TORCH_CHECK(ratio >= 0.0 && ratio <= 2.0, "invalid high watermark ratio")
            ratio = _strtod(value)
            if not _STRTOD_PREFIX.match(value):
                found.append(
                    f"{name}={value!r} is not a number: PyTorch parses it as 0.0"
                    + (
                        ", which removes the memory limit altogether"
                        if "HIGH" in name
                        else ""
                    )
                )
            elif not 0.0 <= ratio <= 2.0:
                found.append(
                    f"{name}={value!r} is outside 0..2: the first MPS allocation "
                    "fails with 'invalid ... watermark ratio'"
                )
            elif "HIGH" in name and ratio == 0.0:
                found.append(f"{name}=0 removes the MPS memory limit altogether")
        elif name == "PYTORCH_MPS_PREFER_METAL" and value.strip() in ("0", ""):
            found.append(
                f"PYTORCH_MPS_PREFER_METAL={value!r} still turns it on: PyTorch "
                "checks only that the variable is set"
            )
    return found


class MpsEnvironment(NamedTuple):
    """What the session runs on: torch, devices, the Mac, and MPS variables."""

    torch_version: str | None
    devices: tuple[str, ...]
    mps_built: bool | None
    mps_available: bool | None
    macos: str | None
    chip: str | None
    variables: Mapping[str, str]
    warnings: tuple[str, ...]
    #: True under ``--mps-emulate``: MPS is there, emulated on the CPU
    emulated: bool = False

    def header(self) -> list[str]:
        """The lines of the pytest session header."""
        torch_part = f"torch {self.torch_version}" if self.torch_version else "no torch"
        if self.emulated:
            mps = "mps: emulated on the CPU (--mps-emulate), no Metal GPU"
        elif self.mps_built is None and self.macos is None:
            # known without importing torch: every non-Mac torch lacks MPS
            mps = f"mps: none on {sys.platform} (MPS needs an Apple-silicon Mac)"
        elif self.mps_built is None:
            mps = "mps: not checked (torch is not loaded yet)"
        elif self.mps_available is None:
            mps = (
                "mps built: True, available: not asked (a run that does not ask "
                "for pytest-mps starts no Metal)"
            )
        else:
            mps = f"mps built: {self.mps_built}, available: {self.mps_available}"
        line = f"pytest-mps: {torch_part}, devices: {', '.join(self.devices)}; {mps}"
        if self.macos:
            line += f"; macOS {self.macos}"
        if self.chip:
            line += f", {self.chip}"
        lines = [line]
        if self.variables:
            lines.append(
                "pytest-mps variables: "
                + ", ".join(f"{k}={v}" for k, v in self.variables.items())
            )
        lines.extend(f"pytest-mps WARNING: {w}" for w in self.warnings)
        return lines


def read_environment(
    config: pytest.Config, chip: bool = True, check: bool = True
) -> MpsEnvironment:
    """Collect the environment; imports torch only when the session already needs it.

    ``chip``: also ask macOS for the chip's name (a ``sysctl`` subprocess on a
    Mac; nothing elsewhere). ``check``: on a Mac, import torch to ask whether
    MPS is built and available (off a Mac the answer is known without it).
    """
    chosen: list[str] = config.stash[devices_key]
    devices = tuple(chosen)
    loaded = sys.modules.get("torch")
    version: str | None = getattr(loaded, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            version = None
    built = available = None
    asks = check and sys.platform == "darwin"
    if version is not None and (loaded is not None or devices != ("cpu",) or asks):
        import torch

        version = torch.__version__
        built = backend.mps_built()
        # is_available() starts Metal (MPSDevice): not in a run that never
        # asked for pytest-mps (a guest's header), where it is built
        available = backend.mps_available() if check or not built else None
    variables = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith("PYTORCH_MPS_") or k in KNOWN_VARIABLES
    }
    return MpsEnvironment(
        torch_version=version,
        devices=devices,
        mps_built=built,
        mps_available=available,
        macos=backend.macos_version(),
        chip=backend.chip_name() if chip else None,
        variables=variables,
        warnings=tuple(variable_warnings(os.environ)),
        emulated=emulated(config),
    )
