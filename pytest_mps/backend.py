"""The MPS shim: the only module that touches ``torch.mps`` and ``torch.backends.mps``.

Everything else in pytest-mps talks to :mod:`pytest_mps.accelerator`, which sends
MPS work here. Tests on Linux replace only ``torch.backends.mps.is_built`` /
``is_available`` and the platform facts, never the functions below.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_mps.mac_facts import MacFacts

#: First macOS release with MPS support (PyTorch's "Getting started on Mac").
MIN_MACOS = (12, 3)
#: The oldest macOS each torch release's MPS backend starts on, newest first:
#: torch 2.5 deleted the macOS 12.3 checks and needs 13.0 (pytorch#133141;
#: 2.5.1 finds no MPS device on 12.7.6, pytorch#139425); "in 2.9+ MPS is only
#: supported on MacOS Sonoma+" (pytorch#162921, a maintainer; a 2.10 nightly
#: has no MPS on 13.7.4, pytorch#164943). Older torch runs from 12.3.
MACOS_FLOORS: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (
    ((2, 9), (14, 0)),
    ((2, 5), (13, 0)),
)

#: Where macOS keeps the tools read here: absolute, so that a PATH a project's
#: tooling changed (a venv's, Homebrew's coreutils, a CI image's) cannot
#: answer in their place.
SYSCTL = "/usr/sbin/sysctl"
IOREG = "/usr/sbin/ioreg"


def torch_installed() -> bool:
    """True when torch can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def mps_built() -> bool:
    """``torch.backends.mps.is_built()``: False for every Linux and Windows wheel."""
    import torch

    return bool(torch.backends.mps.is_built())


def mps_available() -> bool:
    """``torch.backends.mps.is_available()``, or the held answer (:func:`hold`)."""
    if holding[0]:
        return bool(answers.get("available", False))
    import torch

    answers["available"] = found = bool(torch.backends.mps.is_available())
    return found


#: What this process has read of the device (``available``, ``mac_facts``,
#: ``probe``), kept so a process that must not touch Metal can be given them:
#: the isolation's fork server forks children, and a child forked after its
#: parent used Metal inherits dead GPU-driver connections (pytorch#178037,
#: Lightning#21345). :func:`hold` fills it in such a process.
answers: dict[str, Any] = {}
#: True where ``answers`` came from the parent and nothing may be asked here.
holding: list[bool] = [False]


def read_answers() -> dict[str, Any]:
    """The device's answers a fork server needs, read here (this process may)."""
    if torch_installed() and mps_built():
        mps_available()
    facts = mac_facts()
    found = dict(answers)
    found["mac_facts"] = None if facts is None else facts._asdict()
    return found


def hold(given: dict[str, Any]) -> None:
    """Answer from ``given`` from now on: this process touches no Metal.

    ``torch.backends.mps.is_available`` answers so too (a suite's skipif at
    collection); a child forked from here asks the device again for itself.
    """
    import os

    answers.clear()
    answers.update({k: v for k, v in given.items() if k != "mac_facts"})
    holding[0] = True
    mac_facts.cache_clear()
    if given.get("mac_facts") is not None:
        from pytest_mps.mac_facts import MacFacts

        answers["mac_facts"] = MacFacts(**given["mac_facts"])
    if not torch_installed():
        return
    import torch  # here, so that no later import finds is_available unheld

    mps = torch.backends.mps
    real = mps.is_available

    def held_answer() -> bool:
        return bool(given.get("available", False))

    setattr(mps, "is_available", held_answer)  # noqa: B010

    def forked() -> None:
        if mps.is_available is held_answer:  # not where the emulation answers
            setattr(mps, "is_available", real)  # noqa: B010
        answers.clear()
        holding[0] = False
        mac_facts.cache_clear()

    os.register_at_fork(after_in_child=forked)


def metal_unusable() -> str | None:
    """Why Metal cannot be used in this forked process, or None.

    PyTorch marks a child forked after its parent started MPS
    (``torch.mps._is_in_bad_fork()``); its ops would fail or hang there.
    """
    torch = sys.modules.get("torch")
    mps = getattr(torch, "mps", None)
    bad = getattr(mps, "_is_in_bad_fork", None)
    if bad is None or not bad():
        return None
    return (
        "Metal cannot be used in this child process: it was forked from a "
        "process that had started MPS (torch.mps._is_in_bad_fork() is True); "
        "run with --mps-isolate-start=spawn or forkserver"
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def macos_version() -> str | None:
    """The macOS version (``"26.1"``, ``"14.5"``), or None off macOS.

    ``platform.mac_ver()`` reads ``SystemVersion.plist``, which macOS answers
    with the old numbering to a program built with an older SDK: "16.0" on
    macOS 26, "10.16" on macOS 11 (CPython gh-135675; python.org's and
    conda's Pythons were built so). ``sysctl kern.osproductversion`` from
    ``/usr/sbin/sysctl`` (built with the system's own SDK) gives the real
    one; where it cannot be read, a compatibility answer is corrected from
    the Darwin kernel's release (``os.uname()``, which no SDK changes).

    The real host's: under ``--mps-emulate`` ``platform.mac_ver()`` answers
    as the emulated Mac and keeps the host's answer beside it (emulate/host.py).
    """
    import platform

    answer = getattr(platform.mac_ver, "pytest_mps_real", None)
    release = (answer if answer is not None else platform.mac_ver())[0]
    if not release:
        return None
    product = _sysctl("kern.osproductversion")
    if product and _version_tuple(product):
        return product
    return _uncompat(release, darwin_release())


def darwin_release() -> str:
    """The Darwin kernel's release (``"25.1.0"`` on macOS 26.1): ``os.uname()``."""
    import os

    return os.uname().release


def _uncompat(release: str, darwin: str) -> str:
    """``release`` with macOS's compatibility numbers replaced from ``darwin``.

    Darwin 20 to 24 are macOS 11 to 15, Darwin 25 is macOS 26 (the year-based
    numbering); 10.16 and 16.x are the placeholders old SDKs are told.
    """
    version = _version_tuple(release)
    kernel = _version_tuple(darwin)
    if version[:2] != (10, 16) and version[:1] != (16,) or not kernel:
        return release
    major = kernel[0] + 1 if kernel[0] >= 25 else kernel[0] - 9
    minor = kernel[1] if len(kernel) > 1 else 0
    return f"{major}.{minor}" if major > 10 else release


def macos_floor(torch_version: str) -> tuple[int, int]:
    """The oldest macOS on which ``torch_version``'s MPS backend is available."""
    release = _version_tuple(torch_version.split("+")[0])[:2]
    for since, floor in MACOS_FLOORS:
        if release >= since:
            return floor
    return MIN_MACOS


def under_rosetta() -> bool:
    """True for an x86-64 process translated by Rosetta on Apple silicon.

    ``sysctl.proc_translated`` is 1 there, 0 for a native process, and
    missing on an Intel Mac (Apple's "About the Rosetta translation
    environment").
    """
    return _sysctl("sysctl.proc_translated") == "1"


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
    floor = macos_floor(torch.__version__)
    if mac is not None and _version_tuple(mac) < floor:
        return (
            f"torch is built with MPS but it is not available: macOS {mac} is "
            f"older than {floor[0]}.{floor[1]}, the oldest that torch "
            f"{torch.__version__}'s MPS backend starts on"
        )
    machine = platform.machine()
    if machine != "arm64":
        if under_rosetta():
            return (
                "torch is built with MPS but it is not available: this Python "
                f"is an {machine} build running under Rosetta on Apple silicon, "
                "and MPS needs a native arm64 Python (python -c 'import "
                "platform; print(platform.machine())' prints arm64)"
            )
        return (
            "torch is built with MPS but it is not available: this Mac is not "
            f"Apple silicon (machine {machine})"
        )
    return (
        "torch is built with MPS but it is not available: no Metal GPU is "
        "visible, as in virtual machines such as GitHub's hosted macOS runners"
    )


def on_macos() -> bool:
    """True on macOS: the one test of the platform that the Mac reads below ask."""
    return sys.platform == "darwin"


def _sysctl(name: str) -> str | None:
    """``sysctl -n name``, or None where macOS has no such name (or off macOS)."""
    if not on_macos():
        return None
    import os
    import subprocess

    # SYSTEM_VERSION_COMPAT=0: no compatibility answers (see macos_version)
    env = dict(os.environ, SYSTEM_VERSION_COMPAT="0")
    try:
        out = subprocess.run(
            [SYSCTL, "-n", name], capture_output=True, text=True, timeout=5, env=env
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
    if not on_macos():
        return None
    import subprocess

    try:
        out = subprocess.run(
            [IOREG, "-rc", "AGXAccelerator", "-d1"],
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


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


@lru_cache(maxsize=1)
def mac_facts() -> MacFacts | None:
    """The :class:`MacFacts` of the Mac this runs on (read once); None off macOS."""
    if holding[0]:
        held: MacFacts | None = answers.get("mac_facts")
        return held
    if not on_macos():
        return None
    from pytest_mps.mac_facts import MacFacts, framework_version, metal_device

    metal = metal_device()
    if not metal.get("gpu"):
        metal = torch_gpu_facts()
    vmm = _sysctl("kern.hv_vmm_present")
    return MacFacts(
        macos=macos_version(),
        build=_sysctl("kern.osversion"),
        model=_sysctl("hw.model"),
        chip=chip_name(),
        vmm=None if vmm is None else vmm.strip() == "1",
        memory=_int(_sysctl("hw.memsize")),
        gpu=metal.get("gpu"),
        gpu_cores=gpu_core_count() or metal.get("gpu_cores"),
        working_set=metal.get("working_set"),
        max_buffer=metal.get("max_buffer"),
        metal=framework_version("Metal"),
        mpsgraph=framework_version("MetalPerformanceShadersGraph"),
        gpu_family=metal.get("gpu_family"),
        bfloat16=metal.get("bfloat16"),
        gpu_source=metal.get("gpu_source"),
    )


def torch_gpu_facts() -> dict[str, Any]:
    """The GPU's name, cores and working set from torch's MPS API, or empty.

    Where torch is loaded and MPS available: PyTorch finds its device with
    ``MTLCopyAllDevices``, so it has one where ``MTLCreateSystemDefaultDevice``
    gave none.

    ``torch.backends.mps.get_name`` and ``get_core_count`` are newer than
    ``torch.mps.recommended_max_memory``: each is read where the torch has it.
    """
    torch = sys.modules.get("torch")
    if torch is None or not mps_built() or not mps_available():
        return {}
    found: dict[str, Any] = {"gpu_source": "torch"}
    for key, read in (
        ("gpu", getattr(torch.backends.mps, "get_name", None)),
        ("gpu_cores", getattr(torch.backends.mps, "get_core_count", None)),
        ("working_set", getattr(torch.mps, "recommended_max_memory", None)),
    ):
        try:
            found[key] = None if read is None else read()
        except RuntimeError:
            found[key] = None
    return found


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
