# ruff: noqa: E501 (pytest-benchmark's examples are quoted unchanged, long lines too)
"""Tests written for pytest-benchmark run unchanged under --mps-benchmark-alias.

The examples are pytest-benchmark's own, from its docs (usage.rst and
pedantic.rst of pytest-benchmark 5.x), with the helpers they leave undefined
(``stuff``, ``my_special_setup``) filled in. Two are not runnable as written,
under pytest-benchmark either: ``benchmark(time.sleep, duration=0.02)``
(time.sleep takes no keywords: TypeError, tested below) and the ``weave``
example (a stray colon, and aspectlib).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FAST = ("-p", "no:cacheprovider", "--mps-benchmark-max-time=0.01")

# usage.rst, "Usage", one module per example as the docs show them.
DOCS_USAGE = '''
import time


def something(duration=0.000001):
    """
    Function that needs some serious benchmarking.
    """
    time.sleep(duration)
    # You may return anything you want, like the result of a computation
    return 123


def test_my_stuff(benchmark):
    # benchmark something
    result = benchmark(something)

    # Extra code, to verify that the run completed correctly.
    # Sometimes you may want to check the result, fast functions
    # are no good if they return incorrect results :-)
    assert result == 123


def test_extra_arguments(benchmark):
    benchmark(time.sleep, 0.02)


def test_decorator_pattern(benchmark):
    @benchmark
    def something():  # unnecessary function call
        time.sleep(0.000001)


def test_the_final_function(benchmark):
    benchmark(time.sleep, 0.000001)  # way more accurate results!


def my_special_setup():
    ...


def stuff(*args, **kwargs):
    return args, kwargs


def test_with_setup(benchmark):
    benchmark.pedantic(stuff, setup=my_special_setup, args=(1, 2, 3), kwargs={'foo': 'bar'}, iterations=10, rounds=100)


def test_extra_info(benchmark):
    benchmark.extra_info['foo'] = 'bar'
    benchmark(time.sleep, 0.02)
'''

# pedantic.rst
DOCS_PEDANTIC = """
def stuff(*args, **kwargs):
    return args, kwargs


def test_with_setup(benchmark):
    benchmark.pedantic(stuff, args=(1, 2, 3), kwargs={'foo': 'bar'}, iterations=10, rounds=100)


def test_setup_returns_the_arguments(benchmark):
    def setup():
        # can optionally return a (args, kwargs) tuple
        return (1, 2, 3), {'foo': 'bar'}
    benchmark.pedantic(stuff, setup=setup, rounds=100)
"""

# usage.rst, "Markers" (pytest-benchmark 5.3.1's own hook refuses the
# documented baseline=True, so it is left out where pytest-benchmark loads).
DOCS_MARKER = """
import time

import pytest


@pytest.mark.benchmark(
    group="group-name",{baseline}
    min_time=0.1,
    max_time=0.5,
    min_rounds=5,
    timer=time.time,
    disable_gc=True,
    warmup=False
)
def test_my_stuff(benchmark):
    @benchmark
    def result():
        # Code to be measured
        return time.sleep(0.000001)

    # Extra code, to verify that the run
    # completed correctly.
    # Note: this code is not measured.
    assert result is None
"""


def entries(path: Path) -> dict[str, dict[str, object]]:
    return {b["name"]: b for b in json.loads(path.read_text())["benchmarks"]}


@pytest.fixture(params=["pytest-benchmark loaded", "pytest-benchmark blocked"])
def beside(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, ...]:
    """Run with pytest-benchmark's plugin loaded, and without it."""
    if request.param == "pytest-benchmark loaded":
        pytest.importorskip("pytest_benchmark")
        # pytest-benchmark turns itself off inside an xdist worker; the inner
        # run is not one.
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        return ()
    return ("-p", "no:benchmark")


def test_the_docs_usage_examples_run_unchanged_under_the_alias(
    pytester: pytest.Pytester, beside: tuple[str, ...]
) -> None:
    pytester.makepyfile(DOCS_USAGE)
    result = pytester.runpytest(
        *FAST, *beside, "--mps-benchmark-alias", "--mps-benchmark-json=out.json"
    )
    # usage.rst's pedantic example gives a setup with iterations=10, which
    # pytest-benchmark's pedantic refuses (a ValueError, its documented
    # contract): the alias refuses it too
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "E * ValueError: Can't use more than 1 `iterations` with a `setup` "
            "function.",
            "*pytest-mps benchmark: 5 measured*",
        ]
    )
    found = entries(pytester.path / "out.json")
    assert found["test_extra_info"]["extra_info"]["foo"] == "bar"  # type: ignore[index]
    # pytest-benchmark's own table stays empty: ours timed them all.
    result.stdout.no_fnmatch_line("*benchmark: 5 tests*")


def test_the_docs_pedantic_examples_run_unchanged_under_the_alias(
    pytester: pytest.Pytester, beside: tuple[str, ...]
) -> None:
    pytester.makepyfile(DOCS_PEDANTIC)
    result = pytester.runpytest(*FAST, *beside, "--mps-benchmark-alias")
    result.assert_outcomes(passed=2)


def test_the_docs_marker_example_sets_group_rounds_and_gc(
    pytester: pytest.Pytester, beside: tuple[str, ...]
) -> None:
    baseline = "" if not beside else "\n    baseline=True,"
    pytester.makepyfile(DOCS_MARKER.format(baseline=baseline))
    result = pytester.runpytest(
        *FAST, *beside, "--mps-benchmark-alias", "--mps-benchmark-json=out.json"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 measured on cpu (group 'group-name')*"])
    bench = entries(pytester.path / "out.json")["test_my_stuff"]
    assert bench["group"] == "group-name"
    options: dict[str, object] = bench["options"]  # type: ignore[assignment]
    assert options["disable_gc"] is True and options["min_time"] == 0.1
    assert options["max_time"] == 0.5
    assert bench["stats"]["rounds"] >= 5  # type: ignore[index]


def test_the_stats_and_names_read_as_pytest_benchmarks(
    pytester: pytest.Pytester, beside: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest

        FIELDS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3",
                  "ops", "rounds", "iterations", "total", "outliers",
                  "iqr_outliers", "stddev_outliers", "ld15iqr", "hd15iqr")

        @pytest.mark.parametrize("n", [100])
        @pytest.mark.benchmark(group="sums", min_rounds=7)
        def test_sum(benchmark, n):
            assert benchmark(sum, range(n)) == 4950
            for field in FIELDS:
                assert getattr(benchmark.stats.stats, field) is not None, field
                assert benchmark.stats[field] == getattr(benchmark.stats, field)
            stats = benchmark.stats.stats
            assert stats.min <= stats.median <= stats.max
            assert stats.rounds >= 7 and len(stats.data) == stats.rounds
            assert benchmark.name == "test_sum[100]"
            assert benchmark.fullname.endswith("::test_sum[100]")
            assert benchmark.param == "100" and benchmark.params == {"n": 100}
            assert benchmark.group == "sums" and benchmark.enabled
            benchmark.group = "renamed"
        """
    )
    result = pytester.runpytest(*FAST, *beside, "--mps-benchmark-alias")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 measured on cpu (group 'renamed')*"])


def test_the_ini_twin_turns_the_alias_on(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_benchmark_alias = true\n")
    pytester.makepyfile("def test_sum(benchmark):\n    benchmark(sum, [1, 2])\n")
    result = pytester.runpytest(*FAST, "-p", "no:benchmark")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*pytest-mps benchmark: 1 measured*"])


def test_without_the_option_pytest_benchmark_keeps_its_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pytest_benchmark")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(
        """
        from pytest_benchmark.fixture import BenchmarkFixture

        def test_theirs(benchmark):
            assert type(benchmark) is BenchmarkFixture
            benchmark(sum, [1, 2])
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--benchmark-max-time=0.01")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*pytest-mps benchmark*")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:mps", "--benchmark-max-time=0.01"
    )
    result.assert_outcomes(passed=1)


def test_without_the_option_and_pytest_benchmark_there_is_no_benchmark_fixture(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_sum(benchmark):\n    benchmark(sum, [1])\n")
    result = pytester.runpytest(*FAST, "-p", "no:benchmark")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'benchmark' not found*"])


def test_the_projects_own_benchmark_fixture_wins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def benchmark():
            return "the project's"
        """
    )
    pytester.makepyfile(
        'def test_own(benchmark):\n    assert benchmark == "the project\'s"\n'
    )
    result = pytester.runpytest(*FAST, "-p", "no:benchmark", "--mps-benchmark-alias")
    result.assert_outcomes(passed=1)


def test_weave_and_bad_marker_arguments_say_what_is_wrong(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_weave(benchmark):
            benchmark.weave(print, lazy=True)

        @pytest.mark.benchmark(rounds=3)
        def test_bad_marker(benchmark):
            benchmark(sum, [1])
        """
    )
    result = pytester.runpytest(*FAST, "-p", "no:benchmark", "--mps-benchmark-alias")
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.benchmark on *::test_bad_marker: unexpected argument(s) "
            "[[]'rounds'[]]*",
            "*benchmark.weave is pytest-benchmark's (through aspectlib) and is not "
            "provided by --mps-benchmark-alias*",
        ]
    )
    result.stdout.no_fnmatch_line("*During handling of the above exception*")


def test_the_alias_is_a_benchmark_for_only_and_skip(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_bench(benchmark):
            benchmark(sum, [1])

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest(
        *FAST, "-p", "no:benchmark", "--mps-benchmark-alias", "--mps-benchmark-only"
    )
    result.assert_outcomes(passed=1, skipped=1)


def test_the_marker_is_registered_for_strict_markers_without_pytest_benchmark(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.benchmark(group="g")
        def test_sum(benchmark):
            benchmark(sum, [1])
        """
    )
    result = pytester.runpytest(
        *FAST, "-p", "no:benchmark", "--mps-benchmark-alias", "--strict-markers"
    )
    result.assert_outcomes(passed=1)
    result = pytester.runpytest(
        "-p", "no:benchmark", "--mps-benchmark-alias", "--markers"
    )
    result.stdout.fnmatch_lines(["@pytest.mark.benchmark(group=None, *"])


def test_keyword_arguments_reach_the_function_as_in_pytest_benchmark(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import time

        def something(duration=0.000001):
            time.sleep(duration)
            return 123

        def test_keywords(benchmark):
            assert benchmark(something, duration=0.0001) == 123

        def test_my_stuff(benchmark):
            benchmark(time.sleep, duration=0.02)
        """
    )
    result = pytester.runpytest(*FAST, "-p", "no:benchmark", "--mps-benchmark-alias")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*TypeError: *sleep() takes no keyword arguments*"])
