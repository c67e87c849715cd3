"""Under pytest-xdist every worker's measurements reach the controller."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xdist")


def test_every_workers_results_reach_the_table_and_the_json(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import os
        import pytest

        @pytest.mark.parametrize("n", range(6))
        def test_bench(mps_benchmark, n):
            mps_benchmark.measure("sum", sum, range(n))
            mps_benchmark.extra_info["worker"] = os.environ["PYTEST_XDIST_WORKER"]
        """
    )
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-max-time=0.01",
        "--mps-benchmark-json=out.json",
    )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*pytest-mps benchmark: 6 measured*"])
    for n in range(6):
        result.stdout.fnmatch_lines([f"test_bench[[]{n}[]]::sum *cpu*"])
    doc = json.loads((pytester.path / "out.json").read_text())
    names = sorted(b["name"] for b in doc["benchmarks"])
    assert names == [f"test_bench[{n}]::sum" for n in range(6)]
    workers = {b["extra_info"]["worker"] for b in doc["benchmarks"]}
    assert workers == {"gw0", "gw1"}
