"""The mixed-device guard, with CPU tensors next to meta tensors."""

from __future__ import annotations

import pytest

# Import torch._dynamo here, in the outer process: pytester's in-process runs
# drop the modules first imported inside them, and a second import of it
# re-registers torch's test op libraries and fails (the watch mode imports it on
# torch versions without the C-level Dynamo skip, see pytest_mps/watch.py).
import torch._dynamo  # noqa: E402, F401

USER_TESTS = """
import pytest
import torch

def test_scalar_cpu_tensor_times_device_tensor():
    x = torch.ones(4, device="meta")
    scale = torch.tensor(2.0)
    (x * scale).sum()

def test_one_device():
    x = torch.ones(4, device="meta")
    (x * 2.0).sum()
    torch.ones(4).to("meta")  # copies move data on purpose: not flagged
"""


def test_option_error_fails_the_test_naming_the_op_the_line_and_the_devices(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("--mps-mixed-devices=error")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1 op(s) mixed tensors of several devices*pytorch#142048*",
            "  aten::mul once, first at test_user.py:7: meta (4,), cpu 0-dim",
            "ops mixing devices:",
            "  aten::mul: 1 call(s) in 1 test(s)",
        ]
    )


def test_warn_reports_without_failing(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_mixed_devices = warn\n")
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "ops mixing devices:",
            "    test_user.py::test_scalar_cpu_tensor_times_device_tensor x1 "
            "(first at test_user.py:7)",
        ]
    )


def test_off_by_default_on_cpu_sessions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("*mixing devices*")


def test_marker_turns_the_guard_on_for_one_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.no_mixed_devices
        def test_guarded():
            torch.cat([torch.ones(2, device="meta"), torch.ones(2, device="meta")])
            torch.ones(2, device="meta").add(torch.tensor(1.0))
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["  aten::add once, first at *:7: meta (2,), cpu 0-dim"]
    )


def test_bad_value_names_the_flag(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--mps-mixed-devices=maybe")
    result.stderr.fnmatch_lines(
        ["*--mps-mixed-devices: 'maybe' is not a mode; choose from*"]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_marker_is_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.no_mixed_devices:*"])


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU"
)
def test_on_cuda_a_0dim_cpu_tensor_is_flagged_though_cuda_accepts_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_scale(device):
            x = torch.ones(4, device=device)
            y = x * torch.tensor(2.0)  # in the code: a test's own assert is its own
            assert y.sum().item() == 8.0
        """
    )
    result = pytester.runpytest("--device", "cuda", "--mps-mixed-devices=error")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["  aten::mul once, first at *: cuda:0 (4,), cpu 0-dim"]
    )


def test_attention_backward_philox_scalars_on_the_cpu_are_not_flagged() -> None:
    # The fused attention backwards take the forward's philox seed and offset as
    # CPU tensors by design; a guard that flagged them would fail every GPT
    # training step on CUDA. A plain op with the same arguments is flagged.
    import torch

    from pytest_mps.watch.findings import TestFindings
    from pytest_mps.watch.mixed_devices import DeviceGuard

    findings = TestFindings()
    guard = DeviceGuard(findings)
    on_device = torch.zeros(2, device="meta")
    seed, offset = (
        torch.zeros((), dtype=torch.int64),
        torch.zeros((), dtype=torch.int64),
    )
    backward = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
    guard(backward, (on_device, on_device, seed, offset), {})
    assert findings.entries == {}
    guard(torch.ops.aten.mul.Tensor, (on_device, seed), {})
    assert list(findings.entries) == [("mixed-devices", "aten::mul")]
