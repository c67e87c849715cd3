"""pytest-benchmark's own fixture tests, unchanged, on pytest-mps's alias.

``tests/pytest_benchmark_suite`` holds them (pytest-benchmark 5.3.1, BSD
2-Clause). Each runs in a pytester subprocess with pytest-benchmark blocked
(``-p no:benchmark``), so the ``benchmark`` fixture and marker are ours
(``--mps-benchmark-alias``), as for a user who has only pytest-mps installed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SUITE = Path(__file__).parent / "pytest_benchmark_suite"
#: weave patches code through aspectlib: not something the alias provides
DESELECT = ("test_with_testcase.py::TerribleTerribleWayToWritePatchTests::test_foo2",)
EXPECTED = {
    "test_normal.py": {"passed": 9},
    "test_pedantic.py": {"passed": 23},
    "test_calibration.py": {"passed": 34},
    "test_sample.py": {"passed": 4},
    "test_skip.py": {"skipped": 1},
    "test_with_testcase.py": {"passed": 1, "deselected": 1},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_pytest_benchmarks_own_tests_pass_on_the_alias(
    pytester: pytest.Pytester, name: str
) -> None:
    shutil.copy(SUITE / name, pytester.path / name)
    pytester.makeini("[pytest]\n")
    args = ["-p", "no:benchmark", "-p", "no:cacheprovider", "--mps-benchmark-alias"]
    args += [f"--deselect={d}" for d in DESELECT if d.startswith(name)]
    result = pytester.runpytest_subprocess(*args, name)
    outcomes = result.parseoutcomes()
    outcomes.pop("warnings", None)
    outcomes.pop("warning", None)
    assert outcomes == EXPECTED[name], result.stdout.str()[-3000:]


PROFILED = """
import pytest


def work():
    return sum(i * i for i in range(2000))


@pytest.mark.mps_benchmark(max_time=0.05)
def test_work(mps_benchmark):
    mps_benchmark(work)
"""


def test_cprofile_saves_the_top_functions_into_the_json(
    pytester: pytest.Pytester,
) -> None:
    import json

    pytester.makepyfile(test_profiled=PROFILED)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-cprofile=tottime",
        "--mps-benchmark-json=out.json",
    )
    result.assert_outcomes(passed=1)
    (entry,) = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    rows = entry["cprofile"]
    assert 0 < len(rows) <= 25
    assert {"ncalls", "tottime", "cumtime", "function_name"} <= set(rows[0])
    assert [r["tottime"] for r in rows] == sorted(
        (r["tottime"] for r in rows), reverse=True
    )
    assert any("work" in r["function_name"] for r in rows)
    bad = pytester.runpytest("--mps-benchmark-cprofile=speed")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*'speed' is not a cprofile column (one of *tottime*"])
