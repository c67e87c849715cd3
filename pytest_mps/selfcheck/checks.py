"""The self-check's items: each Mac-only read and path, run here.

Every check returns an :class:`~.report.Item`. A check that needs a Mac says
"not run" off one, with the reason; the device checks run on MPS where it is
available, else on the emulated device. Each pytest run is a subprocess in a
temporary folder, on this interpreter.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_mps import backend
from pytest_mps.selfcheck import corpus
from pytest_mps.selfcheck.report import Item

THREE_TESTS = """
import pytest
import torch


@pytest.mark.parametrize("i", range(3))
def test_uses_the_device(device, i):
    assert torch.full((4,), float(i), device=device).sum().item() == 4 * i
"""
CYCLES = """
import gc

import pytest
import torch

gc.disable()


@pytest.mark.parametrize("i", range(3))
def test_leaves_a_cycle(device, i):
    holder = {"weights": torch.ones(1 << 18, device=device)}
    holder["self"] = holder
"""
HANGS_AT_EXIT = """
import atexit
import threading

atexit.register(lambda: threading.Event().wait())
"""


def device_args() -> tuple[list[str], str]:
    """The pytest arguments that put tests on MPS here, and which device that is."""
    if backend.torch_installed() and backend.mps_built() and backend.mps_available():
        return ["--mps"], "mps"
    return ["--mps-emulate"], "emulated mps"


def _pytest(folder: Path, *args: str, timeout: float = 600) -> tuple[int, str, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def _suite(files: dict[str, str]) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="pytest-mps-selfcheck-"))
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def _not_mac(name: str, expected: str) -> Item:
    return Item(name, expected, f"not macOS ({platform.system()})", "not run")


def macos_version() -> Item:
    expected = (
        "the product version from sysctl kern.osproductversion; platform.mac_ver() "
        "may say 16.0 on macOS 26 to a Python built with an older SDK"
    )
    if not backend.on_macos():
        return _not_mac("macOS version", expected)
    product = backend._sysctl("kern.osproductversion")
    read = backend.macos_version()
    details = {
        "kern.osproductversion": product,
        "platform.mac_ver": platform.mac_ver()[0],
        "darwin": backend.darwin_release(),
        "pytest_mps": read,
    }
    agrees = bool(product and read and read.split(".")[0] == product.split(".")[0])
    observed = ", ".join(f"{k} {v}" for k, v in details.items())
    return Item("macOS version", expected, observed, _verdict(agrees), details)


def rosetta() -> Item:
    expected = "a native arm64 Python (sysctl.proc_translated 0)"
    if not backend.on_macos():
        return _not_mac("Rosetta", expected)
    translated = backend.under_rosetta()
    observed = f"machine {platform.machine()}, under Rosetta: {translated}"
    return Item("Rosetta", expected, observed, _verdict(not translated))


def gpu_facts() -> Item:
    expected = (
        "the Metal device (MTLCreateSystemDefaultDevice, else MTLCopyAllDevices) "
        "and torch's MPS API name the same GPU and working set; a physical Mac's "
        "GPU is MTLGPUFamilyApple7 or newer, with bfloat16"
    )
    if not backend.on_macos():
        return _not_mac("GPU facts, both ways", expected)
    from pytest_mps.mac_facts import metal_device
    from pytest_mps.machine.fingerprint import virtual_signs

    if backend.torch_installed():
        import torch  # noqa: F401 - torch's side needs it loaded

    metal, from_torch = metal_device(), backend.torch_gpu_facts()
    facts = backend.mac_facts()
    details = {
        "metal": metal,
        "torch": from_torch,
        "virtual_signs": list(virtual_signs(facts)) if facts else None,
    }
    agrees = bool(
        metal.get("gpu")
        and metal.get("gpu") == from_torch.get("gpu")
        and metal.get("working_set") == from_torch.get("working_set")
    )
    observed = (
        f"Metal: {metal.get('gpu')} ({metal.get('gpu_source')}), family "
        f"Apple{metal.get('gpu_family')}, bfloat16 {metal.get('bfloat16')}, working "
        f"set {metal.get('working_set')}; torch: {from_torch.get('gpu')}, working "
        f"set {from_torch.get('working_set')}"
    )
    return Item("GPU facts, both ways", expected, observed, _verdict(agrees), details)


def isolation() -> Item:
    args, device = device_args()
    expected = f"3 passed with the fork server and with spawn, on {device}"
    folder = _suite({"test_three.py": THREE_TESTS})
    found: dict[str, Any] = {}
    for start in ("forkserver", "spawn"):
        code, out, seconds = _pytest(
            folder, *args, "--mps-isolate", f"--mps-isolate-start={start}", "-q"
        )
        found[start] = {"exit": code, "seconds": round(seconds, 2), "tail": _tail(out)}
    agrees = all(
        found[s]["exit"] == 0 and "3 passed" in found[s]["tail"] for s in found
    )
    observed = "; ".join(
        f"{s}: exit {v['exit']}, {v['seconds']} s, {v['tail']}"
        for s, v in found.items()
    )
    return Item("isolation: fork server and spawn", expected, observed,
                _verdict(agrees), found)  # fmt: skip


def probe() -> Item:
    from pytest_mps.machine.probe import probe as run_probe

    args, device = device_args()
    target = "mps" if device == "mps" else "cpu"
    expected = f"a 4-element op on {target} finishes within 10 s, in a child process"
    start = time.monotonic()
    found = run_probe(target, 10.0)
    seconds = round(time.monotonic() - start, 2)
    observed = f"{'finished' if found is None else found.text} ({seconds} s in all)"
    return Item("the probe", expected, observed, _verdict(found is None),
                {"seconds": seconds})  # fmt: skip


def empty_cache() -> Item:
    args, device = device_args()
    expected = (
        "3 left device tensors in reference cycles, and a garbage collection "
        "after each freed 3.00 MiB"
    )
    folder = _suite({"test_cycles.py": CYCLES})
    code, out, seconds = _pytest(folder, *args, "--mps-empty-cache=always", "-q")
    line = next((x for x in out.splitlines() if "emptied the MPS cache" in x), "")
    agrees = code == 0 and expected in line
    return Item(f"cache emptying with cycles ({device})", expected,
                line or _tail(out), _verdict(agrees), {"exit": code})  # fmt: skip


def shutdown() -> Item:
    expected = (
        "a process that hangs at exit after its last test ends within 20 s of the "
        "session's end (--mps-timeout=1), exit status 0, the summary written"
    )
    folder = _suite(
        {"conftest.py": HANGS_AT_EXIT, "test_ok.py": "def test_ok():\n    pass\n"}
    )
    try:
        code, out, seconds = _pytest(folder, "--mps-timeout=1", "-q", timeout=120)
    except subprocess.TimeoutExpired:
        return Item("the shutdown watchdog", expected, "still running after 120 s",
                    "differs")  # fmt: skip
    agrees = code == 0 and "1 passed" in out and seconds < 50
    observed = f"exit {code} after {seconds:.1f} s; {_tail(out)}"
    return Item("the shutdown watchdog", expected, observed, _verdict(agrees))


def corpus_items() -> list[Item]:
    """One item per corpus case: the emulated outcome against the real one."""
    folder = _suite({"test_corpus.py": corpus.test_file()})
    emulated = _outcomes(folder, ["--mps-emulate"], "emulated.xml")
    real_args, device = device_args()
    real = _outcomes(folder, real_args, "real.xml") if device == "mps" else None
    items = []
    for name, _ in corpus.CASES:
        expected = emulated.get(name, "not collected")
        if real is None:
            observed = "not run: MPS is not available here"
            verdict = "not run"
        else:
            observed = real.get(name, "not collected")
            verdict = _verdict(observed == expected)
        items.append(Item(f"corpus: {name}", expected, observed, verdict))
    return items


def _outcomes(folder: Path, args: list[str], junit: str) -> dict[str, str]:
    _pytest(folder, *args, f"--junitxml={junit}", "-q")
    found = {}
    for case in ET.parse(folder / junit).getroot().iter("testcase"):
        name = case.get("name", "").removeprefix("test_").split("[")[0]
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            skipped = case.find("skipped")
            found[name] = "passed" if skipped is None else "skipped"
        else:
            message = (problem.get("message") or "").strip().splitlines()
            found[name] = (message[0] if message else "failed")[:200]
    return found


def _tail(out: str) -> str:
    lines = [line for line in out.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _verdict(agrees: bool) -> str:
    return "agrees" if agrees else "differs"


#: Every check, in the report's order (the corpus last).
CHECKS: tuple[Callable[[], Item], ...] = (
    macos_version,
    rosetta,
    gpu_facts,
    probe,
    isolation,
    empty_cache,
    shutdown,
)


def machine() -> dict[str, Any]:
    """The machine's facts for the report's head."""
    import pytest

    found: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "pytest": pytest.__version__,
        "executable": sys.executable,
        "cpus": os.cpu_count(),
    }
    if backend.torch_installed():
        import torch

        found["torch"] = torch.__version__
        found["mps"] = backend.mps_unavailable_reason() or "available"
    return found
