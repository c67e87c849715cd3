"""Choosing devices: --device, --mps, the ini twin, and the 'device' fixture."""

from __future__ import annotations

import platform

import pytest
import torch

from pytest_mps import backend

DEVICE_TEST = """
import torch

def test_dev(device):
    assert isinstance(device, torch.device)
    print("DEVICE", device)
"""


def test_default_device_is_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("-v", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_dev[[]cpu[]] DEVICE cpu", "PASSED*"])


def test_bad_device_value_is_a_usage_error_naming_flag_and_value(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("--device", "gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --device: 'gpu' is not a device; a GPU is mps or cuda; use cpu, mps*"]
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mps:1", "'mps:1': MPS has one device, mps:0"),
        ("cpu:0", "'cpu:0': cpu takes no index"),
    ],
)
def test_device_values_with_impossible_indexes_are_rejected(
    pytester: pytest.Pytester, value: str, message: str
) -> None:
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest(f"--device={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_repeated_device_flag_parametrizes_over_each_once(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("-v", "--device", "cpu", "--device", "CPU")
    result.assert_outcomes(passed=1)


def test_ini_devices_are_used_without_flags(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_devices = cpu\n")
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_dev[[]cpu[]] PASSED*"])


def test_bad_ini_device_names_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_devices = tpu\n")
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*ini option mps_devices in *tox.ini: 'tpu' is not a device*"]
    )


def test_command_line_wins_over_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_devices = tpu\n")
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("--device", "cpu")
    result.assert_outcomes(passed=1)


def test_auto_resolves_to_the_best_available_device(
    pytester: pytest.Pytester,
) -> None:
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("-v", "--device", "auto")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*test_dev[[]{expected}[]] PASSED*"])


def test_auto_device_hook_can_be_overridden_in_a_conftest(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        def pytest_mps_auto_device(config):
            return "cpu"
        """
    )
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("-v", "--device", "auto")
    result.stdout.fnmatch_lines(["*test_dev[[]cpu[]] PASSED*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_names_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("--device", "cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--device cuda:0: CUDA is not available (torch *"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_parametrize_the_device_fixture(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch
        def test_dev(device):
            x = torch.ones(2, device=device)
            assert x.device.type == device.type
        """
    )
    result = pytester.runpytest("-v", "--device", "cpu", "--device", "cuda")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*[[]cpu[]] PASSED*", "*[[]cuda:0[]] PASSED*"])


@pytest.mark.skipif(torch.backends.mps.is_built(), reason="this torch has MPS")
def test_mps_flag_without_mps_build_names_the_reason(
    pytester: pytest.Pytester,
) -> None:
    # Not mocked: this Linux wheel really is built without MPS.
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest_subprocess("--mps")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --mps: MPS cannot be used: torch * was built without MPS "
            "(torch.backends.mps.is_built() is False*"
        ]
    )


def _fake_mps_built_but_unavailable(
    monkeypatch: pytest.MonkeyPatch, mac: str, machine: str
) -> None:
    # torch/backends/mps/__init__.py: is_built() returns torch._C._has_mps and
    # is_available() returns torch._C._mps_is_available(); on a Mac whose MPS
    # cannot be used the first is True and the second False.
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(platform, "mac_ver", lambda: (mac, ("", "", ""), machine))
    monkeypatch.setattr(platform, "machine", lambda: machine)


@pytest.mark.parametrize(
    ("mac", "machine", "reason"),
    [
        # the installed torch's floor: 14.0 from 2.9 (pytorch#162921), 13.0 before
        ("below", "arm64", "is older than *, the oldest that torch"),
        ("14.5", "x86_64", "this Mac is not Apple silicon (machine x86_64)"),
        ("14.5", "arm64", "no Metal GPU is visible, as in virtual machines such as"),
    ],
)
def test_mps_flag_names_why_a_built_mps_is_unavailable(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    mac: str,
    machine: str,
    reason: str,
) -> None:
    if mac == "below":
        floor = backend.macos_floor(torch.__version__)
        mac = f"{floor[0] - 1}.4"
        reason = f"macOS {mac} {reason}"
    _fake_mps_built_but_unavailable(monkeypatch, mac, machine)
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("--mps")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: --mps: MPS cannot be used: torch is built with MPS but*{reason}*"]
    )


def test_device_mps_without_mps_names_the_flag(pytester: pytest.Pytester) -> None:
    if torch.backends.mps.is_available():
        pytest.skip("MPS is usable here")
    pytester.makepyfile(DEVICE_TEST)
    result = pytester.runpytest("--device", "mps:0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --device mps: MPS cannot be used: *. To run the mps cases on "
            "this machine, add --mps-emulate (the emulated device fails where a "
            "Mac fails)"
        ]
    )


def test_mps_device_fixture_skips_off_mps_with_a_reason(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_needs(mps_device):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*mps_device needs MPS: run with --mps on an Apple-silicon Mac (this "
            "session runs on cpu)*"
        ]
    )


def test_plugin_off_with_p_no_mps(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_plain(request):
            assert "device" not in request.fixturenames
        """
    )
    result = pytester.runpytest("-p", "no:mps", "--strict-markers")
    result.assert_outcomes(passed=1)
    assert "pytest-mps" not in result.stdout.str()
    result = pytester.runpytest("-p", "no:mps", "--device", "cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --device*"])
