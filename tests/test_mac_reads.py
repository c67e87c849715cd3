"""macOS's facts as a Mac gives them, read through the MPS shim.

The shim here is the operating system's side of :mod:`pytest_mps.backend`:
``on_macos``, ``_sysctl`` (``/usr/sbin/sysctl -n NAME``), ``darwin_release``
(``os.uname().release``) and ``platform.mac_ver``, answered with values
real Macs give in public reports:

- macOS 26 tells a program built with an older SDK that it is "16.0" through
  ``SystemVersion.plist`` (CPython gh-135675: ``platform.mac_ver()`` printed
  ``('16.0', ('', '', ''), 'arm64')`` on Tahoe), as macOS 11 told it "10.16"
  (pypa/packaging#497, pyinstaller#6329); ``kern.osproductversion`` and the
  Darwin release (25.x on macOS 26, 20.x on macOS 11) are not changed.
- Under Rosetta an x86-64 Python sees ``platform.machine()`` "x86_64" and
  ``sysctl.proc_translated`` 1 (Apple's "About the Rosetta translation
  environment").

Nothing here ran on a Mac.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_mps import backend, mac_facts

#: A Mac on macOS 26.1 (build 25B78), as sysctl answers.
TAHOE = {
    "kern.osproductversion": "26.1",
    "kern.osversion": "25B78",
    "hw.model": "Mac16,10",
    "machdep.cpu.brand_string": "Apple M4",
    "kern.hv_vmm_present": "0",
    "hw.memsize": str(16 << 30),
}


@pytest.fixture
def mac(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A Mac through the shim: edit the dict to change what sysctl answers."""
    answers = dict(TAHOE)
    monkeypatch.setattr(backend, "on_macos", lambda: True)
    monkeypatch.setattr(backend, "_sysctl", answers.get)
    monkeypatch.setattr(backend, "darwin_release", lambda: "25.1.0")
    monkeypatch.setattr(mac_facts, "metal_device", lambda: {})
    monkeypatch.setattr(backend, "gpu_core_count", lambda: None)
    monkeypatch.setattr(platform, "mac_ver", lambda *a: ("16.0", ("", "", ""), "arm64"))
    backend.mac_facts.cache_clear()
    yield answers
    backend.mac_facts.cache_clear()


def test_macos_26_reads_as_26_where_the_plist_says_16(mac: dict[str, str]) -> None:
    assert platform.mac_ver()[0] == "16.0"
    assert backend.macos_version() == "26.1"
    facts = backend.mac_facts()
    assert facts is not None and facts.macos == "26.1"


def test_without_sysctl_the_darwin_release_corrects_the_plist(
    mac: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    del mac["kern.osproductversion"]
    assert backend.macos_version() == "26.1"
    # macOS 11 told old SDKs "10.16"; Darwin 20.6 is macOS 11.6
    monkeypatch.setattr(backend, "darwin_release", lambda: "20.6.0")
    monkeypatch.setattr(
        platform, "mac_ver", lambda *a: ("10.16", ("", "", ""), "x86_64")
    )
    assert backend.macos_version() == "11.6"


def test_a_true_answer_of_the_plist_is_kept(
    mac: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    del mac["kern.osproductversion"]
    monkeypatch.setattr(backend, "darwin_release", lambda: "24.5.0")
    monkeypatch.setattr(platform, "mac_ver", lambda *a: ("15.5", ("", "", ""), "arm64"))
    assert backend.macos_version() == "15.5"


def test_the_header_fingerprint_and_manifest_say_26(
    mac: dict[str, str], pytester: pytest.Pytester
) -> None:
    pytester.makepyfile("def test_ok(device): pass")
    folder = pytester.path / "known-failures"
    folder.mkdir()
    entry = "test_other.py::test_gone | AssertionError | cpu\n"
    (folder / "macos26.txt").write_text(entry)
    result = pytester.runpytest(
        "--mps-device=cpu",
        "--mps-known-failures=known-failures/macos{macos}.txt",
        "--mps-report=report.json",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["pytest-mps machine: macOS 26.1 (25B78), *"])
    result.stdout.no_fnmatch_line("*16.0*")
    report = (pytester.path / "report.json").read_text()
    assert '"os_version": "26.1"' in report


@pytest.mark.parametrize(
    ("torch_version", "floor"),
    [("2.4.1", (12, 3)), ("2.5.1", (13, 0)), ("2.8.0", (13, 0)), ("2.9.1", (14, 0))],
)
def test_the_macos_floor_follows_the_torch_release(
    torch_version: str, floor: tuple[int, int]
) -> None:
    assert backend.macos_floor(torch_version) == floor


def test_rosetta_is_named_as_rosetta(
    mac: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    mac["sysctl.proc_translated"] = "1"
    reason = backend.mps_unavailable_reason()
    assert reason is not None and "under Rosetta" in reason and "arm64" in reason
    del mac["sysctl.proc_translated"]  # an Intel Mac has no such name
    reason = backend.mps_unavailable_reason()
    assert reason is not None and "not Apple silicon (machine x86_64)" in reason


def test_an_old_macos_is_judged_by_the_installed_torchs_floor(
    mac: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    mac["kern.osproductversion"] = "13.6"
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    reason = backend.mps_unavailable_reason()
    assert reason is not None
    assert "macOS 13.6 is older than 14.0" in reason and "2.13.0" in reason


def test_a_sysctl_on_path_does_not_answer_for_macos(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a project's PATH may hold another sysctl (a venv's, a CI image's): the
    # reads use /usr/sbin/sysctl, which on this Linux knows no macOS names
    fake = tmp_path / "sysctl"
    fake.write_text("#!/bin/sh\necho 99.0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(backend, "on_macos", lambda: True)
    assert shutil.which("sysctl") == str(fake)
    assert backend._sysctl("kern.osproductversion") != "99.0"


class FakeObjC:
    """Metal's Objective-C answers, for :func:`mac_facts.metal_device`.

    ``default``: what ``MTLCreateSystemDefaultDevice`` gives (None: NULL, as
    in a command-line process that has not loaded CoreGraphics, pyobjc#390);
    ``devices``: ``MTLCopyAllDevices``, each a dict of the device's answers.
    """

    def __init__(self, default: int | None, devices: list[dict[str, object]]):
        self.default, self.devices = default, devices
        self.asked: list[str] = []

    def default_device(self) -> int | None:
        self.asked.append("MTLCreateSystemDefaultDevice")
        return self.default

    def all_devices(self) -> list[int]:
        self.asked.append("MTLCopyAllDevices")
        return list(range(1, len(self.devices) + 1))

    def text(self, obj: int, selector: bytes) -> str | None:
        return str(self.devices[obj - 1][selector.decode()])

    def size(self, obj: int, selector: bytes) -> int:
        return int(self.devices[obj - 1][selector.decode()])  # type: ignore[call-overload]

    def supports_family(self, obj: int, family: int) -> bool:
        return family <= int(self.devices[obj - 1]["family"])  # type: ignore[call-overload]


#: GitHub's hosted macos-26 runner: "GPU name: MTL0 (Apple Paravirtual
#: device)", "GPU family: MTLGPUFamilyApple5 (1005)", "has bfloat = false"
#: (qvac#3775); working set and largest buffer of a hosted runner's
#: paravirtual GPU (VeloxQuant-MLX#395: 5010800640 and 3758096384).
RUNNER_GPU = {
    "name": "Apple Paravirtual device",
    "recommendedMaxWorkingSetSize": 5010800640,
    "maxBufferLength": 3758096384,
    "family": 1005,
}


#: the reader itself, before a test replaces it with one that reads a fake
READ_METAL = mac_facts.metal_device


def test_a_null_default_device_falls_back_to_copy_all_devices() -> None:
    objc = FakeObjC(None, [RUNNER_GPU])
    found = mac_facts.metal_device(objc)
    assert objc.asked == ["MTLCreateSystemDefaultDevice", "MTLCopyAllDevices"]
    assert found == {
        "gpu": "Apple Paravirtual device",
        "working_set": 5010800640,
        "max_buffer": 3758096384,
        "gpu_family": 5,
        "bfloat16": False,
        "gpu_source": "MTLCopyAllDevices",
    }
    # no device at all: nothing made up
    assert mac_facts.metal_device(FakeObjC(None, [])) == {}
    if sys.platform != "darwin":  # no Objective-C runtime to load: empty
        assert mac_facts.metal_device() == {}


def test_without_metal_the_gpu_facts_come_from_torch(
    mac: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import torch

    # torch/backends/mps/__init__.py: get_name() and get_core_count() return
    # torch._C._mps_get_name() / _mps_get_core_count(); torch/mps/__init__.py:
    # recommended_max_memory() returns torch._C._mps_recommendedMaxMemory()
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "get_name", lambda: "Apple M4", False)
    monkeypatch.setattr(torch.backends.mps, "get_core_count", lambda: 10, False)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 12 << 30)
    facts = backend.mac_facts()
    assert facts is not None
    assert (facts.gpu, facts.gpu_cores, facts.working_set) == ("Apple M4", 10, 12 << 30)
    assert facts.gpu_source == "torch"


def test_an_apple5_gpu_without_bfloat16_is_named_and_its_bf16_tests_skip(
    mac: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("torch")
    import torch

    runner = FakeObjC(None, [RUNNER_GPU])
    monkeypatch.setattr(mac_facts, "metal_device", lambda: READ_METAL(runner))
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
        def test_weights(device, dtype):
            pass
        """
    )
    result = pytester.runpytest(
        "--mps", "--mps-probe-timeout=0", "--mps-empty-cache=never", "-rs"
    )
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps machine: *GPU Apple Paravirtual device, Apple5, "
            "no bfloat16*virtual*",
            "pytest-mps machine: virtual GPU (GPU 'Apple Paravirtual device'; "
            "GPU family Apple5*",
            "SKIPPED *bfloat16 on MPS: the GPU (Apple Paravirtual device, "
            "MTLGPUFamilyApple5) has no bfloat16*",
        ]
    )


def test_an_m4_runs_its_bf16_tests(
    mac: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("torch")
    import torch

    # a real M4 is MTLGPUFamilyApple9 (qvac#3775); its sizes here are examples
    m4 = dict(RUNNER_GPU, name="Apple M4", family=1009)
    m4["recommendedMaxWorkingSetSize"] = 12 << 30
    mac_with_m4 = FakeObjC(2, [{}, m4])
    monkeypatch.setattr(mac_facts, "metal_device", lambda: READ_METAL(mac_with_m4))
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    pytester.makepyfile(
        "import pytest\n\n"
        "@pytest.mark.parametrize('dtype', ['bfloat16'])\n"
        "def test_weights(device, dtype):\n    pass\n"
    )
    result = pytester.runpytest("--mps", "--mps-probe-timeout=0")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["pytest-mps machine: *GPU Apple M4, Apple9; *"])
    result.stdout.no_fnmatch_line("*virtual*")


def test_a_guest_run_on_a_mac_starts_no_metal_for_its_header(
    pytester: pytest.Pytester,
) -> None:
    # a conftest that imports torch, on a Mac (the shim: built, and an
    # availability check that records; PyTorch's _mps_is_available starts
    # the MPS device), in a run that asks nothing of pytest-mps
    pytester.makeconftest(
        """
        import torch

        asked = []
        torch.backends.mps.is_built = lambda: True
        torch.backends.mps.is_available = lambda: asked.append(1) or True

        def pytest_unconfigure(config):
            print(f"is_available asked {len(asked)} times")
        """
    )
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["pytest-mps: torch *mps built: True, available: not asked*",
         "is_available asked 0 times"]
    )  # fmt: skip
