"""The mps_memory marker and fixture (CUDA paths run with --device cuda on a GPU)."""

from __future__ import annotations

import json

import pytest
import torch

# Import torch._dynamo here, in the outer process: pytester's in-process runs
# drop the modules first imported inside them, and a second import of it
# re-registers torch's test op libraries and fails (the watch mode imports it on
# torch versions without the C-level Dynamo skip, see pytest_mps/watch.py).
import torch._dynamo  # noqa: E402, F401

USER_TESTS = """
import pytest
import torch

@pytest.mark.mps_memory(max_mb=1, leak_mb=0)
def test_budgeted(device):
    keep = torch.empty(4 * 1024 * 1024, device=device)  # 16 MiB
    test_budgeted.kept = keep

def test_fixture(mps_memory, device):
    torch.ones(1024, device=device)
    print("measured" if mps_memory.measured else "not measured")
"""


def test_cpu_says_memory_is_not_measured_instead_of_printing_zeros(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("-rA")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*- pytest-mps memory -*",
            "cpu: memory not measured (PyTorch keeps no allocator statistics for "
            "the CPU)",
        ]
    )
    result.stdout.no_fnmatch_line("*0.0 MiB*")


def test_bad_marker_arguments_fail_naming_the_marker_and_the_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps_memory(max_mb="lots")
        def test_one():
            pass

        @pytest.mark.mps_memory(64)
        def test_two():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.mps_memory on *test_one: max_mb='lots' is not a number*",
            "*@pytest.mark.mps_memory on *test_two: takes only max_mb= and leak_mb=*",
        ]
    )


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU"
)
def test_cuda_reports_peak_and_leak_and_fails_over_budget(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("--device", "cuda", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*over the memory budget on cuda:0: peak 16.0 MiB > max_mb=1; left "
            "allocated 16.0 MiB > leak_mb=0",
            "cuda:0: peak +16.0 MiB, left allocated +16.0 MiB, reserved *",
        ]
    )


def test_marker_is_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.mps_memory(max_mb=None, leak_mb=None):*"]
    )


# torch/mps/__init__.py: current_allocated_memory() "Returns the current GPU memory
# occupied by tensors in bytes" (torch._C._mps_currentAllocatedMemory),
# driver_allocated_memory() "total GPU memory allocated by Metal driver",
# recommended_max_memory() "recommended max working set size"; they cannot run
# on Linux, so this conftest fakes them (and is_built/is_available) with a byte
# counter that the user's test moves, as MPS tensors would.
FAKE_MPS_CONFTEST = """
import torch

allocated = [0]
NAMES = [
    (torch.backends.mps, "is_built"),
    (torch.backends.mps, "is_available"),
    (torch.mps, "current_allocated_memory"),
    (torch.mps, "driver_allocated_memory"),
    (torch.mps, "recommended_max_memory"),
    (torch.mps, "synchronize"),
]
saved = [getattr(module, name) for module, name in NAMES]

def pytest_unconfigure(config):
    # pytester runs in this process: leave torch as it was
    for (module, name), value in zip(NAMES, saved):
        setattr(module, name, value)

def pytest_configure(config):
    torch.backends.mps.is_built = lambda: True
    torch.backends.mps.is_available = lambda: True
    torch.mps.current_allocated_memory = lambda: allocated[0]
    torch.mps.driver_allocated_memory = lambda: allocated[0] + 8 * 2**20
    torch.mps.recommended_max_memory = lambda: 16 * 2**30
    torch.mps.synchronize = lambda: None
"""


def test_on_mps_the_peak_is_sampled_before_each_op(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKE_MPS_CONFTEST)
    pytester.makepyfile(
        """
        import pytest
        import torch
        from conftest import allocated

        @pytest.mark.mps_memory(max_mb=32)
        def test_temporary_buffer():
            allocated[0] += 64 * 2**20   # a 64 MiB activation appears
            torch.ones(3).sum()           # ops run while it is alive
            allocated[0] -= 64 * 2**20   # and it is freed
            torch.ones(3).sum()
        """
    )
    result = pytester.runpytest("--mps", "-rA", "--mps-report=r.json")
    assert torch.backends.mps.is_built() is False
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*over the memory budget on mps: peak 64.0 MiB > max_mb=32",
            "mps: peak +64.0 MiB, left allocated +0.0 MiB, driver_allocated 8.0 MiB",
        ]
    )
    (row,) = json.loads((pytester.path / "r.json").read_text())["memory"]
    assert row["device"] == "mps"
    assert (row["peak_mb"], row["left_mb"]) == (64.0, 0.0)
