"""The watchers fire for real on the emulated device, as they would on a Mac.

Host reads, mixed devices, fallbacks and memory are watched through the same
code paths as on MPS: the emulated tensors are device tensors to them, and
``torch.mps``'s counters count the emulated tensors' bytes.
"""

from __future__ import annotations

import json

import pytest
from conftest import needs_svd_fallback

pytest_plugins = ["pytester"]


def test_host_reads_of_device_tensors_fail_a_no_host_sync_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.no_host_sync
        def test_item(device):
            loss = torch.ones(4, device=device).mean()
            value = loss.item()  # in the code, not the test's own assert

        @pytest.mark.no_host_sync
        def test_tolist(device):
            torch.arange(3, device=device).tolist()

        @pytest.mark.no_host_sync
        def test_printing(device):
            print(torch.ones(2, device=device))

        @pytest.mark.no_host_sync
        def test_a_step_that_stays_on_the_device(device):
            w = torch.ones(3, 3, device=device, requires_grad=True)
            (w @ w).relu().sum().backward()
            w.grad.mul_(0.5)
        """
    )
    result = pytester.runpytest("--mps-emulate")
    result.assert_outcomes(failed=3, passed=1)
    result.stdout.fnmatch_lines(
        [
            "E*HostSyncError: aten::_local_scalar_dense makes the host wait for "
            "the device * at *.py:7; forbidden by @pytest.mark.no_host_sync",
            "E*HostSyncError: Tensor.tolist makes the host wait for the device "
            "* at *.py:11; forbidden by @pytest.mark.no_host_sync",
            "E*HostSyncError: Tensor.__repr__ makes the host wait * at *.py:15; *",
        ],
        consecutive=False,
    )


@pytest.mark.parametrize(
    "level", [None, "error", "off"], ids=["default", "error", "off"]
)
def test_mixed_devices_fail_only_where_a_mac_fails(
    pytester: pytest.Pytester, level: str | None
) -> None:
    pytester.makepyfile(
        """
        import torch
        import torch.nn.functional as F

        def test_a_cpu_scalar_in_device_math(device):
            x = torch.ones(3, device=device)
            y = x * torch.tensor(2.0)  # runs: MPS takes the scalar
            x.mul_(1 - torch.tensor(0.1) * torch.tensor(0.5))
            assert (y > torch.tensor(1.0)).all()
            assert torch.equal(y.cpu(), torch.full((3,), 2.0))

        def test_cpu_indices_and_a_cpu_fill_value(device):
            x = torch.arange(6.0, device=device)
            idx = torch.tensor([0, 2])
            assert x[idx].tolist() == [0.0, 2.0]
            x[idx] = torch.tensor(7.0)
            x.fill_(torch.tensor(3.0))
            assert x.tolist() == [3.0] * 6

        def test_attention_makes_its_own_mask(device):
            # math attention (dropout on, which a gradient takes on MPS) builds
            # its causal mask from q's options: a CPU tensor here, an MPS one on
            # a Mac; nothing the user mixed
            q = torch.randn(1, 2, 8, 4, device=device, requires_grad=True)
            out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, is_causal=True)
            assert out.is_mps

        def test_a_cpu_lerp_weight(device):
            x = torch.ones(3, device=device)
            x.lerp_(torch.zeros(3, device=device), torch.tensor(0.5))
        """
    )
    flags = [f"--mps-mixed-devices={level}"] if level else []
    # a process of its own: the guard's summary depends on no earlier run
    result = pytester.runpytest_subprocess("--mps-emulate", *flags)
    # the Mac's crash is the emulation's, whatever the guard's level
    result.assert_outcomes(failed=1, passed=3)
    result.stdout.fnmatch_lines(
        [
            "E *RuntimeError: MPS (emulated by pytest-mps): aten::lerp_.Tensor "
            "binds its tensor inputs as Metal buffers, and the 0-dim CPU tensor "
            "weight cannot be one*Lerp.mm*",
        ]
    )
    if level == "off":
        result.stdout.no_fnmatch_line("0-dim CPU tensors read as scalars*")
        return
    result.stdout.fnmatch_lines(
        [
            "0-dim CPU tensors read as scalars by device ops*",
            "  aten::mul: 1 call(s) in 1 test(s)",
        ],
        consecutive=False,
    )
    result.stdout.no_fnmatch_line("*mixed tensors of several devices*")


@needs_svd_fallback
def test_forced_fallbacks_run_and_are_listed(pytester: pytest.Pytester) -> None:
    # MPSFallback.mm registers linalg_svd with mps_fallback: on a Mac it runs
    # on the CPU without PYTORCH_ENABLE_MPS_FALLBACK, with PyTorch's warning
    pytester.makepyfile(
        """
        import torch

        def test_svd(device):
            u, s, v = torch.linalg.svd(torch.eye(3, device=device))
            assert s.is_mps and s.sum().item() == 3
        """
    )
    listed = pytester.runpytest("--mps-emulate", "--mps-fallback=warn")
    listed.assert_outcomes(passed=1)
    listed.stdout.fnmatch_lines(
        ["ops that fell back to the CPU (no MPS kernel):", "  aten::_linalg_svd*"]
    )
    failed = pytester.runpytest("--mps-emulate", "--mps-fallback=error")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(
        ["*1 op(s) fell back from MPS to the CPU (--mps-fallback=error):*"]
    )


def test_fallback_error_fails_an_op_without_an_mps_kernel_and_passes_clean_code(
    pytester: pytest.Pytester,
) -> None:
    # special_ndtri has no MPS kernel in any torch pyproject.toml allows; with
    # the fallback on it runs on the CPU and the check names it
    pytester.makepyfile(
        """
        import torch

        def test_ndtri(device):
            y = torch.special.ndtri(torch.full((3,), 0.5, device=device))
            assert y.is_mps and y.abs().sum().item() == 0

        def test_clean(device):
            x = torch.randn(4, 4, device=device)
            assert (x @ x.T).is_mps
        """
    )
    result = pytester.runpytest("--mps-emulate", "--mps-fallback=error")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1 op(s) fell back from MPS to the CPU (--mps-fallback=error):*",
            "*aten::special_ndtri*",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED *test_ndtri*"])


def test_memory_is_the_emulated_tensors_bytes(pytester: pytest.Pytester) -> None:
    # replaces a test that faked torch.mps's counters: here a real 64 MiB
    # tensor on the emulated device is counted, sampled before each op
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.mps_memory(max_mb=32)
        def test_temporary_buffer(device):
            activation = torch.empty(16 * 2**20, device=device)  # 64 MiB
            activation.fill_(1.0)
            del activation
            torch.ones(3, device=device).sum()

        @pytest.mark.mps_memory(leak_mb=1)
        def test_a_leak(device):
            test_a_leak.kept = torch.zeros(2**20, device=device)  # 4 MiB kept
        """
    )
    # a process of its own: driver_allocated counts every device tensor alive
    # in the process, and an earlier in-process run's failure keeps its
    # tensors alive through sys.last_traceback
    result = pytester.runpytest_subprocess(
        "--mps-emulate", "-rA", "--mps-report=r.json"
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "over the memory budget on mps: peak 64.0 MiB > max_mb=32",
            "mps: peak +64.0 MiB, left allocated +0.0 MiB, driver_allocated 0.0 MiB",
            "over the memory budget on mps: left allocated 4.0 MiB > leak_mb=1",
            "mps: peak +4.0 MiB, left allocated +4.0 MiB, driver_allocated 4.0 MiB",
        ],
        consecutive=False,
    )
    rows = json.loads((pytester.path / "r.json").read_text())["memory"]
    assert {(row["device"], row["peak_mb"]) for row in rows} >= {("mps", 64.0)}


def test_the_audit_judges_the_devices_tensors_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_a_float64_reference_kept_on_the_cpu(device):
            reference = torch.linspace(0, 1, 5, dtype=torch.float64)  # on purpose
            x = torch.linspace(0, 1, 5, device=device)
            assert torch.allclose(x.cpu().double(), reference)

        def test_a_missing_op_on_host_data(device):
            host = torch.full((2,), 0.5)  # runs on a Mac's CPU, kernel or not
            assert torch.special.ndtri(host).abs().max() < 1e-6

        def test_float64_asked_of_the_device(device):
            torch.ones(2, device=device).double()
        """
    )
    # in processes of their own: in-process runs before it leave dispatcher
    # registrations that change whether the audit or the emulation meets the
    # float64 cast first
    plain = pytester.runpytest_subprocess("--mps-audit=error")
    # on the CPU alone, every tensor looks like the device's (ndtri too: only
    # an assert's reads are the test's own)
    plain.assert_outcomes(failed=3)
    emulated = pytester.runpytest_subprocess(
        "--mps-audit=error", "--mps-emulate", "--mps-report=r.json"
    )
    emulated.assert_outcomes(failed=1, passed=2)
    tests = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"]
    # the code's findings; the test's own assert reads (x.cpu()) are listed apart
    findings = {
        name.split("::")[1]: [row for row in rows if row["side"] != "test"]
        for name, rows in tests.items()
    }
    assert findings["test_a_float64_reference_kept_on_the_cpu[mps]"] == []
    assert findings["test_a_missing_op_on_host_data[mps]"] == []
    (row,) = findings["test_float64_asked_of_the_device[mps]"]
    assert (row["kind"], row["name"]) == ("dtype", "torch.float64")
