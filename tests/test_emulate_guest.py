"""--mps-emulate asks for the emulation; without it, and after it, torch is as found."""

from __future__ import annotations

import builtins
import gc
import os
import sys
import textwrap
import threading

import pytest
import torch

pytest_plugins = ["pytester"]


def _torch_state() -> dict[str, object]:
    import torch.accelerator
    import torch.serialization
    from torch.amp.autocast_mode import autocast

    from pytest_mps.watch import device_mix

    return {
        "thread_start": threading.Thread.start,
        "has_mps": torch._C._has_mps,
        "functions": {
            name: getattr(torch._C, name) for name in dir(torch._C) if "_mps_" in name
        },
        "generator": torch.Generator,
        "compile": torch.compile,
        "grouping": torch._C._group_tensors_by_device_and_dtype,
        "accelerator": torch.accelerator.current_accelerator,
        "registry": list(torch.serialization._package_registry),
        "rebuild": torch._utils._rebuild_tensor,
        "autocast": (autocast.__enter__, autocast.__exit__),
        "mode": torch._C._is_torch_function_mode_enabled(),
        "on_host": device_mix.on_host[0],
        "available": torch.backends.mps.is_available(),
    }


def test_a_run_without_the_option_sees_no_mps(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_plain(device):
            assert device.type == "cpu"
            assert not torch.backends.mps.is_available()
            assert torch.Generator is torch._C.Generator
            assert not torch._C._is_torch_function_mode_enabled()
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*emulate*")


def test_the_emulation_leaves_torch_as_it_found_it(pytester: pytest.Pytester) -> None:
    before = _torch_state()
    pytester.makepyfile(
        """
        import builtins

        import torch

        def test_emulated(device):
            event = torch.mps.Event(enable_timing=True)  # outlives the session
            event.record()
            builtins.pytest_mps_event = event
            x = torch.ones(2, 2, device=device)
            with torch.autocast("mps", dtype=torch.bfloat16):
                assert (x @ x).dtype == torch.bfloat16
            assert torch.backends.mps.is_available()
        """
    )
    result = pytester.runpytest("--mps-emulate")
    result.assert_outcomes(passed=1)
    after = _torch_state()
    # an event made under the emulation is released quietly when it goes...
    assert (
        after["functions"].pop("_mps_releaseEvent")
        is not (  # type: ignore[attr-defined]
            before["functions"]["_mps_releaseEvent"]  # type: ignore[index]
        )
    )
    del builtins.pytest_mps_event  # type: ignore[attr-defined]
    gc.collect()
    # ... and then torch's own function is back, like everything else
    assert _torch_state() == before
    assert not torch.is_autocast_enabled("cpu")


def test_the_ini_setting_turns_it_on_and_the_header_says_so(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini(
        """
        [pytest]
        mps_emulate = true
        mps_emulate_macos = 14.4
        mps_emulate_memory = 16GB
        """
    )
    pytester.makepyfile(
        """
        def test_device(device):
            assert str(device) == "mps"
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps: torch *, devices: mps; mps: emulated on the CPU "
            "(--mps-emulate), no Metal GPU",
            "pytest-mps emulate: MPS emulated on the CPU (macOS 14.4, op table of "
            f"torch {torch.__version__}); PYTORCH_ENABLE_MPS_FALLBACK unset: ops "
            "without an MPS kernel raise",
            "pytest-mps emulate: memory 16.00 GiB: recommended working set "
            "12.00 GiB, max allowed 20.40 GiB (1.7 x)",
        ]
    )


def test_a_bad_macos_version_names_the_flag(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--mps-emulate", "--mps-emulate-macos=ventura")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--mps-emulate-macos: 'ventura' is not a macOS version (like 14.4 or 15)*"]
    )


def test_a_bad_memory_size_or_watermark_ratio_is_named_in_one_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = pytester.runpytest("--mps-emulate", "--mps-emulate-memory=8XB")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--mps-emulate-memory: '8XB' is not a memory size; give one like 8GB*"]
    )
    monkeypatch.setenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "2.5")
    result = pytester.runpytest("--mps-emulate", "--mps-emulate-memory=8GB")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --mps-emulate-memory: invalid high watermark ratio 2.5 "
            "(PYTORCH_MPS_HIGH_WATERMARK_RATIO in the environment)"
        ]
    )


def test_code_run_at_import_already_picks_the_emulated_device(
    pytester: pytest.Pytester,
) -> None:
    # device selection at import time, as scripts and conftests do it
    pytester.makeconftest(
        """
        import torch

        DEVICE = torch.device("mps" if torch.backends.mps.is_available() else "cpu")
        """
    )
    pytester.makepyfile(
        """
        import torch
        from conftest import DEVICE

        def test_it():
            assert DEVICE.type == "mps"
            assert torch.zeros(1, device=DEVICE).is_mps
        """
    )
    pytester.runpytest("--mps-emulate").assert_outcomes(passed=1)


def test_it_runs_in_each_xdist_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        textwrap.dedent(
            """
            import pytest
            import torch

            @pytest.mark.parametrize("n", range(4))
            def test_on_the_device(device, n):
                x = torch.full((3,), float(n), device=device)
                assert x.is_mps and x.sum().item() == 3 * n
            """
        )
    )
    result = pytester.runpytest_subprocess("--mps-emulate", "-n", "2")
    result.assert_outcomes(passed=4)


def test_a_usage_error_leaves_the_fallback_variable_as_found(
    pytester: pytest.Pytester,
) -> None:
    # --device mps:1 sets PYTORCH_ENABLE_MPS_FALLBACK before the conftests
    # load, then fails in pytest_configure: the variable must still go back
    assert "PYTORCH_ENABLE_MPS_FALLBACK" not in os.environ
    result = pytester.runpytest("--device", "mps:1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "PYTORCH_ENABLE_MPS_FALLBACK" not in os.environ
    assert "pytest_mps.emulate.install" not in sys.modules or not torch._C._has_mps
