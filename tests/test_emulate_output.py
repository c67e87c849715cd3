"""What ``--mps-emulate`` says of itself: header, usage errors, benchmark tables."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

ONE = """
def test_one():
    pass
"""


@pytest.mark.parametrize(
    ("option", "flag"),
    [
        ("--mps-emulate-macos=13", "--mps-emulate-macos"),
        ("--mps-emulate-memory=8GB", "--mps-emulate-memory"),
    ],
)
def test_an_emulate_option_without_mps_emulate_is_a_usage_error(
    pytester: pytest.Pytester, option: str, flag: str
) -> None:
    pytester.makepyfile(test_one=ONE)
    result = pytester.runpytest(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: {flag} needs --mps-emulate: without it nothing is emulated*"]
    )
    assert len([line for line in result.stderr.lines if line.strip()]) == 1


def test_the_emulate_ini_settings_alone_are_defaults_and_stay_quiet(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmps_emulate_macos = 13.5\nmps_emulate_memory = 8GB\n")
    pytester.makepyfile(test_one=ONE)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    assert "pytest-mps emulate" not in result.stdout.str()


@pytest.mark.parametrize(
    ("ini", "message"),
    [
        (
            "mps_emulate_memory = lots",
            "ERROR: ini option mps_emulate_memory in */tox.ini: 'lots' is not *",
        ),
        (
            "mps_emulate_macos = abc",
            "ERROR: ini option mps_emulate_macos in */tox.ini: 'abc' is not a macOS "
            "version (like 14.4 or 15)",
        ),
        (
            "mps_emulate = maybe",
            "ERROR: ini option mps_emulate in */tox.ini: invalid truth value 'maybe'; "
            "use true or false",
        ),
    ],
)
def test_a_bad_emulate_ini_value_is_one_line_naming_the_key_and_file(
    pytester: pytest.Pytester, ini: str, message: str
) -> None:
    # refused even while the emulation is off: it is named the day it is
    # written, not the day someone passes --mps-emulate
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_one=ONE)
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert len([line for line in result.stderr.lines if line.strip()]) == 1


@pytest.mark.parametrize("value", ["27", "99", "30.1"])
def test_a_macos_newer_than_any_known_is_refused_not_taken_as_the_newest(
    pytester: pytest.Pytester, value: str
) -> None:
    pytester.makepyfile(test_one=ONE)
    result = pytester.runpytest("--mps-emulate", f"--mps-emulate-macos={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: --mps-emulate-macos: '{value}' is newer than any macOS known "
            "here (known: *, 26); give 'newest' for the newest"
        ]
    )


def test_the_header_names_the_emulated_mac_and_what_fails_a_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_one=ONE)
    result = pytester.runpytest("--mps-emulate", "--mps-emulate-macos=14.4")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps emulate: MPS emulated on the CPU (macOS 14.4, *",
            "pytest-mps emulate: memory: no limit (--mps-emulate-memory sets one)",
            "pytest-mps emulate: fails tests on ops without an MPS kernel, float64 "
            "and other dtypes MPS lacks, arguments MPS kernels refuse, host reads "
            "of device tensors (.numpy()), mixed devices (--mps-mixed-devices=error)",
        ]
    )
    warned = pytester.runpytest(
        "--mps-emulate", "--mps-mixed-devices=warn", "--mps-fallback=warn"
    )
    warned.stdout.fnmatch_lines(
        [
            "pytest-mps emulate: fails tests on float64 *; reports mixed devices "
            "(--mps-mixed-devices=warn), CPU fallbacks (--mps-fallback=warn)",
        ]
    )


BENCH = """
import pytest
import torch


@pytest.mark.mps_benchmark
def test_mm(mps_benchmark, device):
    x = torch.randn(64, 64, device=device)
    mps_benchmark(lambda: x @ x)
"""


def test_a_benchmark_table_under_emulation_says_its_times_are_the_cpus(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest(
        "--mps-emulate", "--mps-benchmark-max-time=0.05", "--mps-report", "r.json"
    )
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*pytest-mps benchmark: 1 measured (mps emulated: CPU times)*",
            "*test_mm[[]mps[]]*mps (emulated)*",
            "Times on mps are the CPU's: under --mps-emulate the device is emulated*",
        ]
    )
    header = next(line for line in out.splitlines() if line.startswith("Name ("))
    for column in ("Verdict", "Dispatch/complete", "Events median", "Peak memory"):
        assert column not in header
    assert "host-bound" not in out and "device-bound" not in out


def test_a_refusal_inside_a_torch_function_shows_the_users_line_in_few_lines(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch
        import torch.nn.functional as F


        def test_loss(device):
            logits = torch.randn(4, 3, device=device)
            target = torch.tensor([0, 1, 2, 0])  # left on the CPU
            loss = F.cross_entropy(logits, target)
            assert loss > 0
        """
    )
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "_ test_loss[mps] _" in line)
    end = next(i for i, line in enumerate(lines) if "short test summary" in line)
    failure = lines[start:end]
    text = "\n".join(failure)
    assert len(failure) <= 20, text
    assert ">       loss = F.cross_entropy(logits, target)" in text
    assert (
        "E       RuntimeError: Placeholder storage has not been allocated on MPS"
        in text
    )
    # torch's frames (overrides.py and its docstring) are left out
    assert "overrides.py" not in text and "handle_torch_function" not in text


def test_full_trace_still_shows_torchs_frames(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch
        import torch.nn.functional as F


        def test_loss(device):
            target = torch.tensor([0, 1, 2, 0])
            F.cross_entropy(torch.randn(4, 3, device=device), target)
        """
    )
    result = pytester.runpytest(
        "--mps-emulate", "--full-trace", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1)
    assert "overrides.py" in result.stdout.str()
