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

def test_scalar_cpu_tensor_as_a_lerp_weight():
    x = torch.ones(4, device="meta")
    weight = torch.tensor(0.5)
    x.lerp(torch.zeros(4, device="meta"), weight).sum()

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
            "*1 op(s) mixed tensors of several devices, which fails on a Mac*",
            "  aten::lerp once, first at test_user.py:7: meta (4,), cpu 0-dim",
            "ops mixing devices:",
            "  aten::lerp: 1 call(s) in 1 test(s)",
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
            "    test_user.py::test_scalar_cpu_tensor_as_a_lerp_weight x1 "
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
            meta = torch.ones(2, device="meta")
            meta.lerp_(torch.ones(2, device="meta"), torch.tensor(1.0))
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["  aten::lerp_ once, first at *:8: meta (2,), cpu 0-dim"]
    )


def test_what_a_mac_runs_passes_and_its_cpu_scalars_are_noted(
    pytester: pytest.Pytester,
) -> None:
    # A Mac reads 0-dim CPU inputs as scalars (TensorIterator.cpp admits
    # them), moves CPU indices to the device (make_info) and reads a 0-dim
    # CPU fill value on the host: none of these fails there.
    pytester.makepyfile(
        """
        import torch

        def test_scalars_indices_and_fill():
            x = torch.ones(6, device="meta")
            lr, wd = torch.tensor(0.1), torch.tensor(0.5)
            x.mul_(1 - lr * wd)
            x * torch.tensor(2.0)
            x > torch.tensor(0.5)
            idx = torch.tensor([0, 2])
            x[idx]
            x.index_put_((idx,), torch.ones(2, device="meta"))
            x.fill_(torch.tensor(3.0))
        """
    )
    result = pytester.runpytest("--mps-mixed-devices=error")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("ops mixing devices:")
    result.stdout.no_fnmatch_line("*aten::index*")
    result.stdout.no_fnmatch_line("*aten::fill_*")
    result.stdout.fnmatch_lines(
        [
            "0-dim CPU tensors read as scalars by device ops (legal on MPS; each "
            "is a host read per call*",
            "  aten::gt: 1 call(s) in 1 test(s)",
            "  aten::mul: 1 call(s) in 1 test(s)",
            "  aten::mul_: 1 call(s) in 1 test(s)",
        ],
        consecutive=False,
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
def test_on_cuda_a_0dim_cpu_lerp_weight_is_flagged_though_cuda_accepts_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_scale(device):
            x = torch.ones(4, device=device)
            y = x.lerp(torch.zeros(4, device=device), torch.tensor(0.5))
            assert y.sum().item() == 2.0  # CUDA takes the scalar; a Mac crashes
            assert (x * torch.tensor(2.0)).sum().item() == 8.0  # legal on a Mac
        """
    )
    result = pytester.runpytest("--device", "cuda", "--mps-mixed-devices=error")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["  aten::lerp once, first at *: cuda:0 (4,), cpu 0-dim"]
    )
    result.stdout.no_fnmatch_line("  aten::mul once*")


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
    guard(torch.ops.aten.lerp.Tensor, (on_device, on_device, seed), {})
    assert list(findings.entries) == [("mixed-devices", "aten::lerp")]
