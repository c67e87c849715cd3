"""The mps_memory marker and fixture (CUDA paths run with --device cuda on a GPU)."""

from __future__ import annotations

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


# The MPS path (peak sampled before each op from torch.mps's counters) runs
# for real on the emulated device: tests/test_emulate_watchers.py.


def test_the_fixture_prints_what_it_holds_in_one_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_printed(mps_memory):
            print(repr(mps_memory))
        """
    )
    result = pytester.runpytest("-s")
    result.assert_outcomes(passed=1)
    shown = (
        "MemoryUsage(cpu: memory not measured (PyTorch keeps no allocator "
        "statistics for the CPU))"
    )
    (line,) = [line for line in result.stdout.lines if "MemoryUsage(" in line]
    printed = line[line.index("MemoryUsage(") :]
    assert printed == shown
    result.stdout.no_fnmatch_line("*object at 0x*")
    assert len(printed) < 100


def test_a_measured_usage_reads_as_its_summary() -> None:
    from pytest_mps.watch.memory import MIB, MemoryUsage

    usage = MemoryUsage("cuda:0", True)
    assert repr(usage) == "MemoryUsage(cuda:0: measured when the test's call ends)"
    usage.start, usage.peak, usage.end = 0, 3 * MIB, MIB
    assert repr(usage) == (
        "MemoryUsage(cuda:0: peak +3.0 MiB, left allocated +1.0 MiB)"
    )
