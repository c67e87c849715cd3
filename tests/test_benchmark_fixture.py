"""The mps_benchmark fixture, marker and options, as a user's test file meets them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FAST = (
    "-p",
    "no:cacheprovider",
    "-p",
    "no:hypothesispytest",
    "--mps-benchmark-max-time=0.01",
)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*FAST, *args)


def entries(path: Path) -> dict[str, dict[str, object]]:
    doc = json.loads(path.read_text())
    return {b["name"]: b for b in doc["benchmarks"]}


def test_call_returns_the_result_and_exposes_stats(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_sum(mps_benchmark):
            assert mps_benchmark(sum, range(100)) == 4950
            s = mps_benchmark.stats
            assert 0 < s.min <= s.median <= s.max
            assert s.q1 <= s.median <= s.q3 and s.iqr == s.q3 - s.q1
            assert s.mean > 0 and s.stddev >= 0 and s.ops > 0
            assert s.rounds >= 5 and s.iterations >= 1
            assert s.median < 1.0  # an absolute budget, as pytest-benchmark#178 asks
        """
    )
    result = run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*pytest-mps benchmark: 1 measured*",
            "Name (time in *)*Min*Max*Mean*StdDev*Median*IQR*Outliers*OPS*",
            "test_sum *",
        ]
    )


def test_calling_twice_asks_for_named_measurements(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_twice(mps_benchmark):
            mps_benchmark(sum, [1])
            mps_benchmark(sum, [2])
        """
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*already called in this test; give each measurement a name*"]
    )


def test_named_measurements_are_each_reported_and_readable(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import time

        def test_two(mps_benchmark):
            mps_benchmark.measure("fast", sum, range(10))
            mps_benchmark.measure("slow", time.sleep, 0.001)
            slow, fast = mps_benchmark["slow"], mps_benchmark["fast"]
            assert slow.stats.median / fast.stats.median > 5
            assert set(mps_benchmark.results) == {"fast", "slow"}
        """
    )
    result = run(pytester, "--mps-benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_two::fast *", "test_two::slow *"])
    found = entries(pytester.path / "out.json")
    assert set(found) == {"test_two::fast", "test_two::slow"}
    assert (
        found["test_two::slow"]["fullname"]
        == "test_named_measurements_are_each_reported_and_readable.py::test_two::slow"
    )  # noqa: E501


def test_pedantic_with_setup_and_several_iterations(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_sort(mps_benchmark):
            made = []
            def setup():
                made.append(list(range(100, 0, -1)))
                return (made[-1],), {}
            out = mps_benchmark.pedantic(
                list.sort, setup=setup, rounds=3, iterations=5, warmup_rounds=2
            )
            assert out is None
            assert len(made) == (3 + 2) * 5
            assert all(m == sorted(m) for m in made)  # every call had its own list
            assert mps_benchmark.stats.rounds == 3
            assert mps_benchmark.stats.iterations == 5
        """
    )
    run(pytester).assert_outcomes(passed=1)


def test_a_cpu_benchmark_collects_garbage_once_per_measurement(
    pytester: pytest.Pytester,
) -> None:
    # a full collection takes 0.15 s once torch is imported: one before the
    # measurement (outside the lock), none inside it, none after on the CPU
    pytester.makepyfile(
        """
        import gc

        full = []

        def count(phase, info):
            if phase == "start" and info["generation"] == 2:
                full.append(1)

        def test_sum(mps_benchmark):
            gc.callbacks.append(count)
            try:
                mps_benchmark.measure("a", sum, range(10))
                mps_benchmark.measure("b", sum, range(10))
            finally:
                gc.callbacks.remove(count)
            assert len(full) == 2

        def test_after():
            assert len(full) == 2  # the first test's end collected nothing
        """
    )
    run(pytester).assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("pedantic(sum, ([1],), rounds=0)", "rounds must be an integer >= 1, got 0"),
        ("pedantic(sum, ([1],), iterations=1.5)", "iterations must be an integer >= 1"),
        (
            "pedantic(sum, ([1],), setup=lambda: (([2],), {}))",
            "setup returned arguments, and args or kwargs were given too",
        ),
        ("measure('', sum, [1])", "name must be a non-empty string"),
        ("measure('a', 42)", "42 is not callable"),
    ],
)
def test_bad_fixture_arguments_fail_with_a_message(
    pytester: pytest.Pytester, call: str, message: str
) -> None:
    pytester.makepyfile(f"def test_bad(mps_benchmark):\n    mps_benchmark.{call}\n")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{message}*"])


MARKED = """
import pytest

@pytest.mark.mps_benchmark({args})
def test_marked(mps_benchmark):
    mps_benchmark(sum, range(10))
"""


def test_marker_group_rounds_and_warmup_reach_table_and_json(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(MARKED.format(args="group='sums', rounds=7, warmup=3"))
    result = run(pytester, "--mps-benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 measured on cpu (group 'sums')*"])
    bench = entries(pytester.path / "out.json")["test_marked"]
    assert bench["group"] == "sums"
    assert bench["stats"]["rounds"] == 7  # type: ignore[index]
    assert bench["extra_info"]["warmup_rounds"] == 3  # type: ignore[index]


def test_marker_warmup_false_skips_warmup(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED.format(args="warmup=False"))
    run(pytester, "--mps-benchmark-json=out.json").assert_outcomes(passed=1)
    bench = entries(pytester.path / "out.json")["test_marked"]
    assert bench["extra_info"]["warmup_rounds"] == 0  # type: ignore[index]


def test_marker_min_time_lengthens_rounds_and_max_time_bounds_them(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(MARKED.format(args="min_time=0.002, max_time=0.02"))
    run(pytester, "--mps-benchmark-json=out.json").assert_outcomes(passed=1)
    bench = entries(pytester.path / "out.json")["test_marked"]
    stats: dict[str, float] = bench["stats"]  # type: ignore[assignment]
    # Calibration itself is tested without a clock in test_benchmark_timer.py;
    # here: the marker's min_time reached the timer (a 2 ms round of sum(range(10))
    # needs many calls per round).
    assert bench["options"]["min_time"] == 0.002  # type: ignore[index]
    assert stats["iterations"] > 1
    assert bench["options"]["max_time"] == 0.02  # type: ignore[index]
    assert stats["rounds"] < 50


def test_marker_beats_command_line_which_beats_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nmps_benchmark_max_time = 0.5\nmps_benchmark_warmup = 4\n"
    )
    pytester.makepyfile(MARKED.format(args="warmup=2"))
    result = run(pytester, "--mps-benchmark-json=o.json")
    result.assert_outcomes(passed=1)
    bench = entries(pytester.path / "o.json")["test_marked"]
    assert bench["options"]["max_time"] == 0.01  # type: ignore[index]
    assert bench["extra_info"]["warmup_rounds"] == 2  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("rounds=0", "rounds must be an integer >= 1, got 0"),
        ("rounds=True", "rounds must be an integer >= 1, got True"),
        ("warmup=-1", "warmup must be True, False or a number of rounds >= 0"),
        ("min_time=0", "min_time must be a positive number of seconds, got 0"),
        ("max_time='1s'", "max_time must be a positive number of seconds, got '1s'"),
        ("group=3", "group must be a string, got 3"),
        ("compare_fail='median:lots'", "'median:lots' is not a threshold"),
        ("compare_fail=[1]", "compare_fail must be strings, got 1"),
        ("rounds=3, iterations=2", "unexpected argument(s) [[]'iterations'[]]"),
        ("5", "takes keyword arguments only, got (5,)"),
    ],
)
def test_bad_marker_arguments_fail_naming_marker_and_test(
    pytester: pytest.Pytester, args: str, message: str
) -> None:
    pytester.makepyfile(MARKED.format(args=args))
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [f"@pytest.mark.mps_benchmark on *::test_marked: *{message}*"]
    )


BOTH = """
def test_bench(mps_benchmark):
    mps_benchmark(sum, [1, 2])

def test_plain():
    pass
"""


def test_only_runs_benchmarks_and_skip_skips_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(BOTH)
    result = run(pytester, "--mps-benchmark-only", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*not a benchmark (--mps-benchmark-only)*"])
    result = run(pytester, "--mps-benchmark-skip", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*benchmarks are skipped (--mps-benchmark-skip)*"])
    result.stdout.no_fnmatch_line("*pytest-mps benchmark: 1 measured*")


def test_only_and_skip_together_are_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(BOTH)
    result = run(pytester, "--mps-benchmark-only", "--mps-benchmark-skip")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mps-benchmark-only and --mps-benchmark-skip*"])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--mps-benchmark-max-time=0",
            "--mps-benchmark-max-time: '0' must be a positive",
        ),
        ("--mps-benchmark-min-time=fast", "'fast' is not a number of seconds"),
        ("--mps-benchmark-warmup=lots", "'lots' is not 'auto', 'off' or a number"),
        ("--mps-benchmark-devices=gpu", "'gpu' is not a device"),
        ("--mps-benchmark-compare-fail=median", "'median' is not a threshold"),
    ],
)
def test_bad_option_values_are_argparse_errors_naming_the_flag(
    pytester: pytest.Pytester, option: str, message: str
) -> None:
    pytester.makepyfile(BOTH)
    result = pytester.runpytest(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_bad_ini_value_is_a_usage_error_naming_the_ini_option(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmps_benchmark_max_time = soon\n")
    pytester.makepyfile(BOTH)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*ini option mps_benchmark_max_time in *: 'soon' is not a number of seconds*"]
    )


def test_benchmark_devices_that_cannot_be_used_stop_the_session(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(BOTH)
    result = pytester.runpytest("--mps-benchmark-devices=cpu,mps")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mps-benchmark-devices mps: MPS cannot be used*"])


def test_benchmark_devices_time_benchmarks_there_and_leave_other_tests_alone(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_bench(mps_benchmark, device):
            mps_benchmark(sum, [1])

        def test_unit(device):
            pass
        """
    )
    result = run(pytester, "--mps-benchmark-devices=cpu", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*test_bench[[]cpu[]] PASSED*", "*test_unit[[]cpu[]] PASSED*"]
    )


def test_marker_is_listed_and_clean_under_strict_markers(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.mps_benchmark(group=None, warmup=None, rounds=None, *"]
    )
    pytester.makepyfile(MARKED.format(args="rounds=2"))
    run(pytester, "--strict-markers").assert_outcomes(passed=1)


def test_no_mps_turns_the_fixture_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(BOTH)
    result = pytester.runpytest("-p", "no:mps")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*fixture 'mps_benchmark' not found*"])


def test_loads_beside_pytest_benchmark_without_clashes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pytest_benchmark")
    # pytest-benchmark turns itself off inside an xdist worker (this suite may
    # run under -n): the inner run is not one.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.benchmark(group="theirs")
        @pytest.mark.mps_benchmark(group="ours")
        def test_both(benchmark, mps_benchmark):
            benchmark(sum, [1, 2])
            mps_benchmark(sum, [1, 2])
        """
    )
    result = run(
        pytester,
        "--strict-markers",
        "--benchmark-max-time=0.01",
        "--benchmark-json=theirs.json",
        "--mps-benchmark-json=ours.json",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*1 measured on cpu (group 'ours')*", "*benchmark 'theirs': 1 tests*"]
    )
    assert entries(pytester.path / "ours.json")["test_both"]["group"] == "ours"
    theirs = json.loads((pytester.path / "theirs.json").read_text())["benchmarks"]
    assert [b["group"] for b in theirs] == ["theirs"]
    help_text = pytester.runpytest("--help").stdout.str()
    for flag in ("--benchmark-only", "--mps-benchmark-only", "--mps-benchmark-json"):
        assert flag in help_text


def test_a_pure_python_benchmark_never_imports_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_bench(mps_benchmark):
            mps_benchmark(sum, [1, 2])

        def test_last():
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess(*FAST, "--mps-benchmark-json=out.json")
    result.assert_outcomes(passed=2)


def test_the_fixture_docstring_is_shown_by_fixtures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines(["mps_benchmark*", "*Time a callable honestly*"])


def test_plugin_module_imports_without_pytest_running() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pytest_mps.benchmark.plugin, sys; print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_the_label_follows_the_accelerator_tensors_passed_to_the_call() -> None:
    # FakeTensorMode makes tensors whose device really is mps:0, even on Linux.
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pytest_mps.benchmark.targets import _argument_devices

    with FakeTensorMode():
        on_mps = torch.zeros(2, device="mps")
    cpu = torch.zeros(2)
    assert _argument_devices((on_mps, cpu), {}) == ["mps"]
    assert _argument_devices(([cpu], {"x": on_mps}), {"y": on_mps}) == ["mps"]
    assert (
        _argument_devices((cpu, range(3)), {"z": torch.zeros(1, device="meta")}) == []
    )
