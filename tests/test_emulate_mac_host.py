"""The emulated Mac as the code under test meets it: the host, integer devices,
what is not emulated, seeded randomness, and how many tests used the device.

Each runs a user's test file under ``--mps-emulate`` in a subprocess (the
emulation patches ``platform`` and torch for the whole process), except the
install/undo check, which installs in this process and compares.
"""

from __future__ import annotations

import platform
import sys
from typing import Any

import pytest
import torch

from pytest_mps.emulate.install import Emulation


def run_emulated(pytester: pytest.Pytester, *options: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--mps-emulate", *options, "-p", "no:cacheprovider"
    )


def test_the_host_answers_as_an_apple_silicon_mac(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_host="""
        import os, platform, subprocess, sys

        def test_asked_the_common_ways():
            assert platform.processor() == "arm"
            assert platform.machine() == "arm64"
            assert platform.mac_ver() == ("14.5", ("", "", ""), "arm64")

        def test_what_must_stay_linux_does():
            assert sys.platform == "linux" and os.name == "posix"
            assert platform.system() == "Linux"
            assert platform.uname().machine not in ("", "arm64")
            out = subprocess.run(
                [sys.executable, "-c", "import platform; print(platform.machine())"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()
            assert out == platform.uname().machine

        def test_lightning_style_check_finds_a_mac():
            import torch
            assert torch.backends.mps.is_available() and platform.processor() in (
                "arm", "arm64"
            )
        """
    )
    result = run_emulated(pytester, "--mps-emulate-macos=14.5")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps emulate: host: platform.processor() 'arm', machine() 'arm64', "
            "mac_ver() '14.5' (sys.platform and platform.system() stay Linux)"
        ]
    )


@pytest.mark.skipif(sys.platform != "linux", reason="compares with a Linux host")
def test_install_and_undo_put_platform_back() -> None:
    before = (platform.processor, platform.machine, platform.mac_ver)
    answers = (platform.processor(), platform.machine(), platform.mac_ver())
    emulation = Emulation((99, 0), fallback=False)
    emulation.install()
    try:
        assert platform.mac_ver()[0] == "26.0"  # the newest major MPS runs on
        assert platform.machine() == "arm64"
        from pytest_mps import backend

        assert backend.macos_version() is None  # pytest-mps's records: the host
    finally:
        emulation.undo()
    assert (platform.processor, platform.machine, platform.mac_ver) == before
    assert (platform.processor(), platform.machine(), platform.mac_ver()) == answers


def test_an_integer_device_is_the_accelerator(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_ints="""
        import torch

        MPS0 = torch.device("mps", 0)

        def test_tensor_to():
            assert torch.ones(2).to(0).device == MPS0
            assert torch.ones(2).to(device=0).device == MPS0
            moved = torch.ones(2).to(0, torch.float16)
            assert moved.device == MPS0 and moved.dtype == torch.float16

        def test_factory_device():
            assert torch.ones(2, device=0).device == MPS0
            assert torch.tensor([1.0], device=0).device == MPS0
            assert torch.ones(2).new_zeros(3, device=0).device == MPS0

        def test_module_to():
            model = torch.nn.Linear(2, 2).to(0)
            assert model.weight.device == MPS0
            assert model(torch.ones(1, 2, device=0)).device == MPS0

        def test_torch_device():
            assert torch.device(0) == MPS0

        def test_still_refused_where_a_mac_refuses():
            import pytest
            with pytest.raises(TypeError, match="float64"):
                torch.ones(2, dtype=torch.float64).to(0)
        """
    )
    run_emulated(pytester).assert_outcomes(passed=5)


def test_what_is_not_emulated_fails_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_metal="""
        import torch

        def test_shader():
            torch.mps.compile_shader("kernel void f() {}")

        def test_profiler():
            with torch.mps.profiler.profile():
                pass

        def test_capture_is_off():
            assert not torch.mps.profiler.is_capturing_metal()
            assert not torch.mps.profiler.is_metal_capture_enabled()
        """
    )
    if not hasattr(torch.mps, "compile_shader"):  # torch 2.8 onwards
        pytest.skip(f"torch {torch.__version__} has no torch.mps.compile_shader")
    result = run_emulated(pytester)
    result.assert_outcomes(failed=2, passed=1)
    text = (
        "*test_metal.py:{}: NotEmulatedError: not emulated by pytest-mps "
        "(--mps-emulate computes on the CPU): {}"
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_shader _*",
            text.format(4, "Metal shaders (torch.mps.compile_shader)"),
            "*_ test_profiler _*",
            text.format(7, "the Metal profiler (torch.mps.profiler)"),
        ]
    )
    assert "MPS is not available" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


def test_a_failure_after_a_device_draw_says_the_stream_differs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_seeded="""
        import torch

        def test_recorded_on_a_mac():
            torch.manual_seed(0)
            noise = torch.randn(3, device="mps")
            assert noise.sum().item() == 1.5  # a value recorded on a Mac

        def test_cpu_draw_fails_without_the_note():
            torch.manual_seed(0)
            assert torch.randn(3).sum().item() == 1.5
        """
    )
    result = run_emulated(pytester)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert out.count("pytest-mps emulate: random numbers") == 1
    result.stdout.fnmatch_lines(
        [
            "*- pytest-mps emulate: random numbers -*",
            "This test drew random numbers on the emulated device (randn at "
            "*test_seeded.py:5). The emulated device draws the CPU's stream; a "
            "Mac's MPS generator draws another*",
        ]
    )


def test_the_summary_counts_tests_that_used_the_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_some="""
        import pytest, torch

        @pytest.fixture
        def weights():
            return torch.ones(2, device="mps")

        def test_made_in_a_fixture(weights):
            assert weights.device.type == "mps"

        def test_on_the_device():
            assert torch.ones(2, device="mps").sum().item() == 2

        def test_cpu_only():
            assert torch.ones(2).sum().item() == 2

        @pytest.mark.skip(reason="not counted")
        def test_skipped():
            torch.ones(2, device="mps")
        """
    )
    result = run_emulated(pytester)
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps emulate: 2 of 3 tests that ran made tensors on the emulated "
            "device"
        ]
    )


def test_a_suite_that_never_uses_the_device_is_told(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_cpu="""
        import platform, torch

        DEVICE = "cpu" if platform.processor() == "" else "cpu"  # never mps

        def test_one():
            assert torch.ones(2, device=DEVICE).sum().item() == 2
        """
    )
    result = run_emulated(pytester, "-n", "2")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps emulate: 0 of 1 tests that ran made tensors on the emulated "
            "device: nothing ran on the emulated Mac (do the tests pick mps?)"
        ]
    )


def test_isolated_tests_are_counted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_iso="""
        import torch

        def test_on_the_device():
            assert torch.ones(2, device="mps").device.type == "mps"
        """
    )
    result = run_emulated(pytester, "--mps-isolate")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps emulate: 1 of 1 tests that ran made tensors on the emulated "
            "device"
        ]
    )


def test_torch_is_importable_here() -> None:
    assert torch.backends.mps.is_available() is False or sys.platform == "darwin"


def test_mps_only_ops_and_extensions_are_named_not_emulated(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_only="""
        import torch

        def test_int4pack():
            w = torch.zeros(64, 32, dtype=torch.uint8, device="mps")
            torch._convert_weight_to_int4pack(w, 2)

        def test_metal_extension():
            import torch.utils.cpp_extension as ce
            ce.load_inline(
                "mine",
                cpp_sources="#include <ATen/native/mps/MetalShaderLibrary.h>",
                functions=["f"],
            )
        """
    )
    result = run_emulated(pytester)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_only.py:5: NotEmulatedError: not emulated by pytest-mps "
            "(--mps-emulate computes on the CPU): aten::_convert_weight_to_int4pack, "
            "which has an MPS kernel and no CPU kernel to compute it with",
            "*test_only.py:9: NotEmulatedError: *C++ extensions built against MPS "
            "or Metal (torch.utils.cpp_extension)",
        ]
    )
    assert "'CPU' backend" not in result.stdout.str()


def test_the_extension_check_reads_sources_and_files(tmp_path: Any) -> None:
    from pytest_mps.emulate.extensions import mac_only_sources

    assert mac_only_sources(["#include <ATen/native/mps/OperationUtils.h>"])
    assert mac_only_sources(["#import <Metal/Metal.h>"])
    assert not mac_only_sources(["#include <torch/extension.h>"])
    plain = tmp_path / "ok.cpp"
    plain.write_text("#include <torch/extension.h>\n")
    assert not mac_only_sources((), [str(plain)])
    assert mac_only_sources((), [str(tmp_path / "kernel.mm")])
