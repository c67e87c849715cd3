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
            # torch.accelerator's statistics where this torch has them
            "peak from torch.accelerator.memory_stats"
            if hasattr(torch, "accelerator")
            and hasattr(torch.accelerator, "memory_stats")
            else "peak from torch.cuda.max_memory_allocated",
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


EMULATED_BUDGET = """
import pytest
import torch

@pytest.mark.mps_memory(max_mb=32)
def test_over(device):
    activation = torch.empty(16 * 2**20, device=device)  # 64 MiB
    activation.fill_(1.0)  # sampled before this op
    del activation
    torch.ones(3, device=device).sum()
"""


def test_the_emulated_device_names_its_peak_source_and_its_limits(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(EMULATED_BUDGET)
    result = pytester.runpytest_subprocess(
        "--mps-emulate", "--mps-emulate-memory=8GB", "-rA", "--mps-report=r.json"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*over the memory budget on mps: peak 64.0 MiB > max_mb=32",
            "mps: peak +64.0 MiB, left allocated +0.0 MiB*",
            # torch 2.13 keeps no MPS peak: sampled, and said so
            "peak from sampling torch.mps.current_allocated_memory() before each "
            "op (this torch keeps no MPS peak; torch.accelerator's statistics "
            "from 2.15)",
            "MPS limits: working set 6.00 GiB (Metal's recommendedMaxWorkingSetSize; "
            "sudo sysctl iogpu.wired_limit_mb=N moves it), high watermark 10.20 GiB "
            "(PYTORCH_MPS_HIGH_WATERMARK_RATIO, default 1.7, times the working set; "
            "or torch.mps.set_per_process_memory_fraction)",
        ]
    )
    import json

    (row,) = json.loads((pytester.path / "r.json").read_text())["memory"]
    assert row["source"].startswith("sampling torch.mps.current_allocated_memory")
    assert row["limits"].startswith("MPS limits: working set 6.00 GiB")


def test_a_macs_three_limits_are_named_with_what_moves_them() -> None:
    from pytest_mps.machine.fingerprint import Fingerprint, limits_explained

    gib = 1 << 30
    # the Mac of pytorch#189215: working set 17.76 GiB, maxBufferLength
    # 13.32 GiB, the allocator's limit 30.19 GiB
    mac = Fingerprint(
        os="macOS",
        os_version="15.5",
        os_build="24F74",
        arch="arm64",
        chip="Apple M2 Pro",
        working_set=int(17.760009765625 * gib),
        high_watermark=int(30.1920166015625 * gib),
        max_buffer=int(13.32000732421875 * gib),
    )
    text = limits_explained(mac)
    assert text.startswith("MPS limits: working set 17.76 GiB (")
    assert "high watermark 30.19 GiB (PYTORCH_MPS_HIGH_WATERMARK_RATIO" in text
    assert text.endswith(
        "largest buffer 13.32 GiB (Metal's maxBufferLength: one tensor past it fails)"
    )
    unread = mac.__class__(
        os="macOS", os_version="15.5", os_build=None, arch="arm64", chip=None
    )
    assert limits_explained(unread) == (
        "MPS limits: not known (Metal's device could not be read)"
    )
