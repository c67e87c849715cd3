"""The machine's fingerprint: what decides MPS results besides the code.

On a Mac the results follow the macOS build and the MPSGraph it ships more
than torch (kornia#4202: 670 failures on macOS 26, none on macOS 15, same
torch), the chip (pytorch#180776 on M5) and whether the GPU is paravirtual
(runner-images#9918). The fingerprint names them all; :func:`differences`
says which fields two runs differ in.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_mps import backend

if TYPE_CHECKING:
    from pytest_mps.mac_facts import MacFacts

#: MPSAllocator.h, default_high_watermark_ratio.
DEFAULT_HIGH_WATERMARK_RATIO = 1.7
HIGH_WATERMARK_VARIABLE = "PYTORCH_MPS_HIGH_WATERMARK_RATIO"
#: A Metal working set under this is a small, probably virtual, GPU: hosted
#: runners report 1 GiB (max allowed 1.70 GB, opensoundscape#850; 1024.00 MB,
#: runner-images#11899) or about 4.7 GiB (max allowed 7.93 GB, #9918).
SMALL_WORKING_SET = 8 << 30

#: The GPU family of the first Apple-silicon Macs (M1: Apple's Metal feature
#: set tables); a Mac's GPU below it is not Apple silicon's own.
APPLE_SILICON_FAMILY = 7

#: Fields that make two runs' results differ when they differ (compared by
#: :func:`differences`); the memory sizes and Python are reported, not compared.
COMPARED = (
    "os",
    "os_version",
    "os_build",
    "chip",
    "model",
    "gpu",
    "metal",
    "mpsgraph",
    "virtual",
    "torch",
    "torch_build",
    "emulated",
)


@dataclass(frozen=True)
class Fingerprint:
    """The machine a run ran on. Sizes in bytes; None where unknown."""

    os: str
    os_version: str
    os_build: str | None
    arch: str
    chip: str | None
    model: str | None = None
    gpu: str | None = None
    gpu_cores: int | None = None
    #: the newest MTLGPUFamilyAppleN (7 for M1), and Metal's bfloat there
    gpu_family: int | None = None
    bfloat16: bool | None = None
    metal: str | None = None
    mpsgraph: str | None = None
    virtual: bool | None = None
    #: why the GPU reads as virtual (its name, the model, the hypervisor flag)
    virtual_signs: tuple[str, ...] = ()
    memory: int | None = None
    working_set: int | None = None
    high_watermark: int | None = None
    max_buffer: int | None = None
    torch: str | None = None
    torch_build: str | None = None
    python: str = platform.python_version()
    #: the emulated Mac under ``--mps-emulate`` (``"macOS 26.0"``), or None
    emulated: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, ``virtual_signs`` as a list."""
        data = asdict(self)
        data["virtual_signs"] = list(self.virtual_signs)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        """The fingerprint saved by :meth:`as_dict` (unknown keys ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["virtual_signs"] = tuple(values.get("virtual_signs") or ())
        return cls(**values)

    def line(self) -> str:
        """One line: OS and build, chip, GPU, frameworks, the MPS memory limits."""
        os_part = f"{self.os} {self.os_version}"
        if self.os_build:
            os_part += f" ({self.os_build})"
        parts = [f"{os_part}, {self.arch}"]
        if self.chip:
            parts.append(self.chip + (f" ({self.model})" if self.model else ""))
        if self.gpu:
            cores = f", {self.gpu_cores} cores" if self.gpu_cores else ""
            family = f", Apple{self.gpu_family}" if self.gpu_family else ""
            bf16 = ", no bfloat16" if self.bfloat16 is False else ""
            parts.append(f"GPU {self.gpu}{cores}{family}{bf16}")
        if self.metal:
            parts.append(f"Metal {self.metal}")
        if self.mpsgraph:
            parts.append(f"MPSGraph {self.mpsgraph}")
        if self.virtual:
            parts.append("virtual")
        text = ", ".join(parts)
        if self.emulated:
            text += f"; emulated Mac: {self.emulated}"
        limits = self.limits()
        if limits:
            text += f"; MPS memory: {limits}"
        if self.torch_build:
            text += f"; torch build: {self.torch_build}"
        return text

    def limits(self) -> str:
        """``working set 17.76 GiB, high watermark 30.19 GiB, largest buffer ...``."""
        parts = []
        if self.working_set is not None:
            parts.append(f"working set {format_size(self.working_set)}")
        if self.working_set is not None:
            parts.append(
                "high watermark "
                + (
                    format_size(self.high_watermark)
                    if self.high_watermark is not None
                    else f"none ({HIGH_WATERMARK_VARIABLE}=0)"
                )
            )
        if self.max_buffer is not None:
            parts.append(f"largest buffer {format_size(self.max_buffer)}")
        return ", ".join(parts)


def limits_explained(found: Fingerprint) -> str:
    """The three MPS limits, each with what moves it, in one line.

    The working set is Metal's ``recommendedMaxWorkingSetSize`` (about 75%
    of memory; ``sudo sysctl iogpu.wired_limit_mb=N`` raises it: 107.52 to
    112.00 GiB on a 128 GB M5 Max, antirez/ds4#893); the high watermark is
    PyTorch's allocator limit, ``PYTORCH_MPS_HIGH_WATERMARK_RATIO`` (default
    1.7) times the working set, which
    ``torch.mps.set_per_process_memory_fraction`` also sets; the largest
    buffer is Metal's ``maxBufferLength``, past which one tensor fails.
    """
    if found.working_set is None:
        if found.emulated is not None:
            return "MPS limits: none emulated (--mps-emulate-memory sets them)"
        return "MPS limits: not known (Metal's device could not be read)"
    ceiling = (
        format_size(found.high_watermark)
        if found.high_watermark is not None
        else "none"
    )
    text = (
        f"MPS limits: working set {format_size(found.working_set)} (Metal's "
        "recommendedMaxWorkingSetSize; sudo sysctl iogpu.wired_limit_mb=N moves "
        f"it), high watermark {ceiling} ({HIGH_WATERMARK_VARIABLE}, default "
        f"{DEFAULT_HIGH_WATERMARK_RATIO:g}, times the working set; or "
        "torch.mps.set_per_process_memory_fraction)"
    )
    if found.max_buffer is not None:
        text += (
            f", largest buffer {format_size(found.max_buffer)} (Metal's "
            "maxBufferLength: one tensor past it fails)"
        )
    return text


def format_size(size: int) -> str:
    """c10's CachingAllocator::format_size, as PyTorch's MPS messages print sizes.

    ``1.50 GiB``, ``512.00 KiB``, ``256 bytes``.
    """
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


#: strtod() reads the longest numeric prefix and gives 0.0 when there is none.
STRTOD_PREFIX = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def strtod(text: str) -> float:
    """A number as C's ``strtod`` reads it (PyTorch reads MPS variables so)."""
    match = STRTOD_PREFIX.match(text)
    return float(match.group(0)) if match else 0.0


def high_watermark_ratio(environ: Mapping[str, str]) -> float:
    """The ratio PyTorch's MPS allocator reads (strtod: a bad value reads 0)."""
    text = environ.get(HIGH_WATERMARK_VARIABLE)
    if text is None:
        return DEFAULT_HIGH_WATERMARK_RATIO
    return strtod(text)


def high_watermark(working_set: int | None, environ: Mapping[str, str]) -> int | None:
    """Ratio x working set, the allocator's limit (MPSAllocator.mm); None if off."""
    ratio = high_watermark_ratio(environ)
    if working_set is None or ratio <= 0:
        return None
    return int(ratio * working_set)


def cpu_name() -> str:
    """The CPU's brand string (``AMD EPYC 9454``, ``Apple M3 Max``)."""
    chip = backend.chip_name()
    if chip:
        return chip
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    # uname's fields: the emulated Mac answers platform.processor() itself
    return platform.uname().processor or platform.uname().machine


def virtual_signs(facts: MacFacts) -> tuple[str, ...]:
    """What says this Mac's GPU is virtual; empty for a physical Mac.

    Hosted runners' VMs show a ``"Apple Paravirtual device"`` Metal device
    (pytorch#111576), model ``VirtualMac2,1`` and a chip read as
    ``"Apple M1 (Virtual)"`` (their published system reports), and set
    ``kern.hv_vmm_present``; their GPU is ``MTLGPUFamilyApple5`` (qvac#3775),
    older than every Apple-silicon GPU (M1 is Apple7).
    """
    signs = []
    if facts.gpu and "paravirtual" in facts.gpu.lower():
        signs.append(f"GPU {facts.gpu!r}")
    if facts.model and facts.model.startswith("VirtualMac"):
        signs.append(f"model {facts.model}")
    if facts.chip and "(virtual)" in facts.chip.lower():
        signs.append(f"chip {facts.chip!r}")
    if facts.vmm:
        signs.append("kern.hv_vmm_present=1")
    if facts.gpu_family is not None and facts.gpu_family < APPLE_SILICON_FAMILY:
        signs.append(f"GPU family Apple{facts.gpu_family}")
    return tuple(signs)


_VERSION_LINE = re.compile(
    r"^(__version__|cuda|hip|git_version)\b[^=]*=\s*'([^']*)'", re.M
)


def _torch() -> tuple[str | None, str | None]:
    """Torch's version and build (``CUDA 12.8, git cf30153``, ``CPU``, ``MPS``).

    Read from ``torch/version.py`` without importing torch (the header is
    written before a suite imports it): its ``cuda``, ``hip`` and
    ``git_version``. A build with neither is the CPU's, or MPS's on a Mac.
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        text = (Path(spec.submodule_search_locations[0]) / "version.py").read_text(
            encoding="utf-8"
        )
    except OSError:
        return None, None
    found = dict(_VERSION_LINE.findall(text))
    if found.get("cuda"):
        build = f"CUDA {found['cuda']}"
    elif found.get("hip"):
        build = f"ROCm {found['hip']}"
    else:
        build = "MPS" if sys.platform == "darwin" else "CPU"
    if found.get("git_version"):
        build += f", git {found['git_version'][:7]}"
    return found.get("__version__"), build


def read(
    emulated: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Fingerprint:
    """The fingerprint of the machine this runs on.

    ``emulated``: the emulated Mac under ``--mps-emulate`` (``macos``, and
    ``memory``, ``working_set``, ``high_watermark`` in bytes when
    ``--mps-emulate-memory`` sets them); its limits are then the memory's.
    """
    torch_version, torch_build = _torch()
    uname = platform.uname()
    facts = backend.mac_facts()
    if facts is not None:
        signs = virtual_signs(facts)
        working = facts.working_set
        return Fingerprint(
            os="macOS",
            os_version=facts.macos or uname.release,
            os_build=facts.build,
            arch=uname.machine,
            chip=facts.chip,
            model=facts.model,
            gpu=facts.gpu,
            gpu_cores=facts.gpu_cores,
            gpu_family=facts.gpu_family,
            bfloat16=facts.bfloat16,
            metal=facts.metal,
            mpsgraph=facts.mpsgraph,
            virtual=bool(signs),
            virtual_signs=signs,
            memory=facts.memory,
            working_set=working,
            high_watermark=high_watermark(working, environ),
            max_buffer=facts.max_buffer,
            torch=torch_version,
            torch_build=torch_build,
        )
    described = None
    working = ceiling = memory = None
    if emulated is not None:
        described = f"macOS {emulated['macos']}"
        memory = emulated.get("memory")
        working = emulated.get("working_set")
        ceiling = emulated.get("high_watermark")
    return Fingerprint(
        os=uname.system,
        os_version=uname.release,
        os_build=None,
        arch=uname.machine,
        chip=cpu_name(),
        virtual=None,
        memory=memory,
        working_set=working,
        high_watermark=ceiling,
        torch=torch_version,
        torch_build=torch_build,
        emulated=described,
    )


def differences(
    mine: Mapping[str, Any],
    other: Mapping[str, Any],
    compared: tuple[str, ...] = COMPARED,
) -> list[str]:
    """``os_build 24F74 -> 25A354``, one per field of ``compared`` that differs.

    ``other`` is the earlier run (the baseline), ``mine`` this one; a field
    missing from either reads None.
    """
    found = []
    for name in compared:
        before, now = other.get(name), mine.get(name)
        if before != now:
            found.append(f"{name} {_show(before)} -> {_show(now)}")
    return found


def _show(value: Any) -> str:
    return "unknown" if value is None else str(value)
