"""The host the code under test sees: an Apple-silicon Mac, where code asks.

Code that picks the MPS device often checks for a Mac as well as for MPS:
PyTorch Lightning's ``MPSAccelerator.is_available()`` wants
``platform.processor()`` in ("arm", "arm64") (without it every
``RunIf(mps=True)`` test skips and the run looks green), PyTorch's own test
helpers read ``platform.machine()`` (``IS_ARM64``) and ``platform.mac_ver()``
(``MACOS_VERSION``, which decides its xfails by macOS version). While the
emulation is installed these answer as an Apple-silicon Mac on the emulated
macOS answers:

========================  ==================================  ============
call                      emulated                            a Linux host
========================  ==================================  ============
``platform.processor()``  ``"arm"``                           ``""`` or ``"x86_64"``
``platform.machine()``    ``"arm64"``                         ``"x86_64"``
``platform.mac_ver()``    ``("26.0", ("", "", ""), "arm64")`` ``("", ("", "", ""), "")``
========================  ==================================  ============

The version is ``--mps-emulate-macos`` (the newest, 26.0, by default).
What must stay Linux does: ``sys.platform``, ``os.name``, ``platform.system()``
and ``platform.uname()`` (paths, shared libraries, subprocesses and the
wheels pip picks follow them), and every subprocess, which does not load
the emulation: a Python process a test starts is noted
(:func:`note_processes`), and named if the test fails.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

from pytest_mps.emulate import patching

#: ``platform.processor()`` on an Apple-silicon Mac.
PROCESSOR = "arm"
#: ``platform.machine()`` on an Apple-silicon Mac.
MACHINE = "arm64"
#: The macOS a "newest" emulated Mac reports (the newest major MPS runs on).
NEWEST = (26, 0)


def release(macos: tuple[int, int]) -> str:
    """``platform.mac_ver()[0]`` of the emulated Mac: ``"14.5"``, ``"26.0"``."""
    major, minor = macos if macos[0] < 99 else NEWEST
    return f"{major}.{minor}"


def present(patches: patching.Patches, macos: tuple[int, int]) -> None:
    """Make ``platform`` answer as an Apple-silicon Mac on ``macos`` does."""
    version = release(macos)
    real = platform.mac_ver()

    def processor() -> str:
        return PROCESSOR

    def machine() -> str:
        return MACHINE

    def mac_ver(
        release: str = "",
        versioninfo: tuple[str, str, str] = ("", "", ""),
        machine: str = "",
    ) -> tuple[str, Any, str]:
        return version, ("", "", ""), MACHINE

    # the real host's answer, for pytest-mps's own records (backend.py)
    mac_ver.pytest_mps_real = real  # type: ignore[attr-defined]
    for function in (processor, machine, mac_ver):
        function.__doc__ = getattr(platform, function.__name__).__doc__
        patches.patch(platform, function.__name__, function)


def note_processes(patches: patching.Patches) -> None:
    """Note each Python process started through ``subprocess.Popen``."""
    original = subprocess.Popen.__init__

    def __init__(popen: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        try:
            if isinstance(args, (str, bytes, os.PathLike)):
                first = os.fsdecode(args).split(" ", 1)[0]
            else:
                first = os.fsdecode(next(iter(args)))
        except (TypeError, StopIteration):
            first = ""
        if first == sys.executable or os.path.basename(first).startswith("python"):
            from pytest_mps.emulate.unreproduced import note_process

            note_process(first)
        original(popen, args, *rest, **kwargs)

    __init__.__doc__ = original.__doc__
    patches.patch(subprocess.Popen, "__init__", __init__)


def describe(macos: tuple[int, int]) -> str:
    """One line for the session header."""
    return (
        f"host: platform.processor() {PROCESSOR!r}, machine() {MACHINE!r}, "
        f"mac_ver() {release(macos)!r} (sys.platform and platform.system() stay "
        f"{platform.system()})"
    )
