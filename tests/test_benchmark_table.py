"""The table's flags, the plots, and the run options pytest-benchmark users know."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_mps.benchmark.records import Table
from pytest_mps.benchmark.report import natural_key, results_table

FAST = ("-p", "no:cacheprovider", "--mps-benchmark-max-time=0.01")
LEFT_OUT = "Dispatch/complete and Verdict are left out for the cpu"

PARAMETRIZED = """
import pytest

@pytest.mark.parametrize("n", [1024, 64, 128, 8])
def test_sum(mps_benchmark, n):
    mps_benchmark(sum, range(n))

def test_sorted(mps_benchmark):
    mps_benchmark(sorted, list(range(300, 0, -1)))
"""


def entry(name: str, median: float, **over: Any) -> dict[str, Any]:
    stats = {"min": median * 0.9, "max": median * 3, "mean": median * 1.2}
    stats.update(median=median, stddev=median * 0.2, iqr=median * 0.02)
    stats.update(rounds=12_345, iterations=1, outliers="1;2", ops=1 / median)
    stats.update(over.pop("stats", {}))
    return {
        "name": name,
        "fullname": f"t.py::{name}",
        "group": over.pop("group", None),
        "param": over.pop("param", None),
        "params": over.pop("params", None),
        "stats": stats,
        "extra_info": {"device": "cpu", **over},
    }


def rows(lines: list[str]) -> list[str]:
    return [line.split()[0] for line in lines if line.startswith("test_")]


def test_parameters_sort_naturally() -> None:
    names = ["test_mm[128]", "test_mm[64]", "test_mm[1024]", "test_mm[8-x]"]
    assert sorted(names, key=natural_key) == [
        "test_mm[8-x]",
        "test_mm[64]",
        "test_mm[128]",
        "test_mm[1024]",
    ]
    lines = results_table([entry(n, 1e-3) for n in names])
    assert rows(lines) == [
        "test_mm[8-x]",
        "test_mm[64]",
        "test_mm[128]",
        "test_mm[1024]",
    ]


def test_numbers_have_thousands_separators_ops_and_the_ratio_to_the_fastest() -> None:
    lines = results_table([entry("test_a", 2.5), entry("test_b", 5.0)])
    text = "\n".join(lines)
    assert "12,345" in text  # rounds
    header = next(line for line in lines if line.startswith("Name"))
    for column in ("Min", "Max", "Mean", "StdDev", "Median", "IQR", "Outliers"):
        assert column in header
    assert "OPS (ops/s)" in header and "vs fastest" in header
    assert "Device" not in header and "measured on cpu" in lines[0]
    (b,) = [line for line in lines if line.startswith("test_b")]
    assert b.split()[-1] == "2.00"
    lines = results_table([entry("test_slow", 1_234.5)])
    assert "1,234.5000" in "\n".join(lines)


def test_each_group_gets_its_own_time_unit_unless_one_is_chosen() -> None:
    entries = [entry("test_fast", 2e-6, group="a"), entry("test_slow", 0.02, group="b")]
    titles = [line for line in results_table(entries) if line.startswith("Name")]
    assert titles[0].startswith("Name (time in us)")
    assert titles[1].startswith("Name (time in ms)")
    lines = results_table(entries, Table(time_unit="ns"))
    assert all(t.startswith("Name (time in ns)") for t in lines if t.startswith("Name"))
    assert "20,000,000.0000" in "\n".join(lines)


def test_columns_sort_group_by_and_name_format() -> None:
    entries = [
        entry("test_mm[64]", 3e-3, param="64", params={"n": 64}),
        entry("test_mm[128]", 1e-3, param="128", params={"n": 128}),
        entry("test_add[64]", 2e-3, param="64", params={"n": 64}),
    ]
    table = Table(columns=("median", "rounds"), chosen=True, sort="median")
    lines = results_table(entries, table)
    header = next(line for line in lines if line.startswith("Name")).split()
    assert header == ["Name", "(time", "in", "us)", "Median", "Rounds"]
    assert rows(lines) == ["test_mm[128]", "test_add[64]", "test_mm[64]"]
    lines = results_table(entries, Table(group_by=("param:n",), name="short"))
    titles = [line for line in lines if "measured" in line]
    assert "(param:n 64)" in titles[0] and "(param:n 128)" in titles[1]
    assert "add[64]" in "\n".join(lines) and "test_add" not in "\n".join(lines)
    lines = results_table(entries, Table(group_by=("func",), name="long"))
    assert any("(func test_add)" in line for line in lines)
    assert any(line.startswith("t.py::test_mm[64]") for line in lines)


def test_an_unstable_result_gets_a_warning_line() -> None:
    lines = results_table([entry("test_noisy", 1e-3, stats={"iqr": 3e-4})])
    assert (
        "! test_noisy: unstable: the IQR is 30% of the median (over 10%); "
        "something else ran meanwhile, or the work itself varies" in lines
    )
    assert not any("unstable" in line for line in results_table([entry("t", 1)]))


def test_the_cpu_says_why_it_has_no_dispatch_or_verdict() -> None:
    lines = results_table([entry("test_cpu", 1e-3)])
    assert "Verdict" not in "\n".join(lines[:3])
    assert any(
        line.startswith("Dispatch/complete and Verdict are left out") for line in lines
    )
    gpu = entry("test_gpu", 1e-3, verdict="device-bound", dispatch_ratio=0.2)
    gpu["extra_info"]["device"] = "cuda:0"
    lines = results_table([entry("test_cpu", 1e-3), gpu])
    (cpu_row,) = [line for line in lines if line.startswith("test_cpu")]
    assert cpu_row.split()[-2:] == ["n/a", "n/a"]
    assert any(
        line.startswith("Dispatch/complete and Verdict are left out") for line in lines
    )


def test_the_table_flags_reach_the_table(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(PARAMETRIZED)
    result = pytester.runpytest(
        *FAST,
        "--mps-benchmark-columns=min,median,ops",
        "--mps-benchmark-sort=name",
        "--mps-benchmark-group-by=func",
        "--mps-benchmark-name=short",
        "--mps-benchmark-time-unit=us",
    )
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "*4 measured on cpu (func test_sum)*",
            "Name (time in us) * Min * Median * OPS *",
            "sum[[]8[]] *",
            "sum[[]64[]] *",
            "sum[[]128[]] *",
            "sum[[]1024[]] *",
        ]
    )


def test_the_ini_twins_of_the_table_flags(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nmps_benchmark_columns = median\nmps_benchmark_sort = median\n"
        "mps_benchmark_group_by = param\nmps_benchmark_name = long\n"
        "mps_benchmark_time_unit = ms\n"
    )
    pytester.makepyfile(PARAMETRIZED)
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*(param 1024)*", "Name (time in ms) * Median"])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--mps-benchmark-columns=min,speed", "speed is not a column; choose from"),
        ("--mps-benchmark-sort=fastest", "'fastest' is not a column to sort by"),
        ("--mps-benchmark-group-by=colour", "colour is not a grouping"),
        ("--mps-benchmark-name=tiny", "'tiny' is not a name format"),
        ("--mps-benchmark-time-unit=min", "'min' is not a time unit"),
        ("--mps-benchmark-min-rounds=0", "'0' is not a number of rounds >= 1"),
        ("--mps-benchmark-precision=5", "'5' must lie between 0 and 1"),
        ("--mps-benchmark-precision=tight", "'tight' is not a precision"),
        ("--mps-benchmark-histogram=test_x.py", "is a test path or a folder"),
    ],
)
def test_bad_values_are_argparse_errors_naming_the_flag(
    pytester: pytest.Pytester, option: str, message: str
) -> None:
    result = pytester.runpytest(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option.split('=')[0]}: *{message}*"])


def _bench(path: Path, name: str) -> dict[str, Any]:
    found = {b["name"]: b for b in json.loads(path.read_text())["benchmarks"]}
    return found[name]  # type: ignore[no-any-return]


def test_min_rounds_gc_and_precision_reach_the_timer(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import gc

        def test_gc_off(mps_benchmark):
            states = []
            mps_benchmark(lambda: states.append(gc.isenabled()))
            assert states[-1] is False and gc.isenabled()
        """
    )
    result = pytester.runpytest(
        *FAST,
        "--mps-benchmark-min-rounds=40",
        "--mps-benchmark-disable-gc",
        "--mps-benchmark-json=out.json",
    )
    result.assert_outcomes(passed=1)
    bench = _bench(pytester.path / "out.json", "test_gc_off")
    assert bench["stats"]["rounds"] >= 40
    assert bench["options"]["disable_gc"] is True


def test_precision_stops_once_the_median_is_known_well_enough(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_loose(mps_benchmark):
            mps_benchmark(sum, range(200))
        """
    )
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-max-time=2",
        "--mps-benchmark-precision=50%",
        "--mps-benchmark-json=out.json",
    )
    result.assert_outcomes(passed=1)
    bench = _bench(pytester.path / "out.json", "test_loose")
    # 2 s of rounds would be thousands; a +-50% interval needs only a few.
    assert bench["stats"]["rounds"] < 100
    assert bench["extra_info"]["precision"] <= 0.5
    assert bench["options"]["precision"] == 0.5


def test_disable_runs_each_function_once_as_a_plain_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        calls = []

        def test_once(mps_benchmark):
            assert mps_benchmark(calls.append, 1) is None
            mps_benchmark.pedantic(calls.append, args=(2,), rounds=50, name="p")
            assert calls == [1, 2]
        """
    )
    result = pytester.runpytest(*FAST, "--mps-benchmark-disable")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*pytest-mps benchmark: * measured*")
    pytester.makeini("[pytest]\nmps_benchmark_disable = true\n")
    pytester.makepyfile(
        test_again="def test_b(mps_benchmark):\n    mps_benchmark(sum, [1])\n"
    )
    result = pytester.runpytest(*FAST, "test_again.py", "--mps-benchmark-enable")
    result.stdout.fnmatch_lines(["*pytest-mps benchmark: 1 measured*"])


def test_histogram_writes_a_box_plot_per_group(pytester: pytest.Pytester) -> None:
    pytest.importorskip("matplotlib")
    pytester.makepyfile(PARAMETRIZED)
    result = pytester.runpytest(
        *FAST, "--mps-benchmark-histogram=plots/bench", "--mps-benchmark-group-by=func"
    )
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        ["pytest-mps benchmark: plotted *plots/bench-func_test_*.png"]
    )
    pngs = sorted(p.name for p in (pytester.path / "plots").iterdir())
    assert pngs == ["bench-func_test_sorted.png", "bench-func_test_sum.png"]
    assert (pytester.path / "plots" / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_histogram_without_matplotlib_is_a_one_line_error(
    pytester: pytest.Pytester,
) -> None:
    # A matplotlib that cannot be imported, first on the path: as if missing.
    pytester.mkpydir("matplotlib").joinpath("__init__.py").write_text(
        "raise ImportError('No module named matplotlib')\n"
    )
    pytester.makepyfile(PARAMETRIZED)
    result = pytester.runpytest_subprocess(*FAST, "--mps-benchmark-histogram")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --mps-benchmark-histogram needs matplotlib, which is not "
            "installed: pip install 'pytest-mps[plot]'"
        ]
    )
    assert len([line for line in result.stderr.lines if line.strip()]) == 1


def test_a_result_marked_baseline_false_is_never_the_groups_reference() -> None:
    quick = entry("test_quick", 1e-3)
    quick["options"] = {"baseline": False}  # pytest-benchmark's marker argument
    lines = results_table([quick, entry("test_ref", 2e-3), entry("test_slow", 4e-3)])
    ratios = {line.split()[0]: line.split()[-1] for line in lines if "test_" in line}
    assert ratios == {"test_quick": "0.50", "test_ref": "1.00", "test_slow": "2.00"}
