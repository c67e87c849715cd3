"""Under pytest-xdist: every worker's results reach the controller, and workers
take turns to measure."""

from __future__ import annotations

import json
from pathlib import Path

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
    result.stdout.fnmatch_lines(
        [
            "*pytest-mps benchmark: 6 measured on cpu*",
            "pytest-mps benchmark: 2 xdist workers took turns, one benchmark "
            "measuring at a time; they waited * s in all for their turn",
        ]
    )
    for n in range(6):
        result.stdout.fnmatch_lines([f"test_bench[[]{n}[]]::sum *"])
    doc = json.loads((pytester.path / "out.json").read_text())
    names = sorted(b["name"] for b in doc["benchmarks"])
    assert names == [f"test_bench[{n}]::sum" for n in range(6)]
    workers = {b["extra_info"]["worker"] for b in doc["benchmarks"]}
    assert workers == {"gw0", "gw1"}


OVERLAP = """
import json
import os
import time

import pytest

@pytest.mark.parametrize("n", range(6))
def test_bench(mps_benchmark, n):
    calls = []

    def work():
        calls.append(time.time())
        return sum(range(2000))

    mps_benchmark(work)
    # The wall-clock span of this benchmark's measured section.
    mps_benchmark.extra_info["span"] = [calls[0], calls[-1]]
    mps_benchmark.extra_info["worker"] = os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.parametrize("n", range(4))
def test_plain(n):
    time.sleep(0.05)
"""


def _spans(path: Path) -> list[tuple[float, float, str]]:
    doc = json.loads(path.read_text())
    return sorted(
        (*b["extra_info"]["span"], b["extra_info"]["worker"]) for b in doc["benchmarks"]
    )


def test_workers_take_turns_so_measured_sections_never_overlap(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(OVERLAP)
    lock = pytester.path / "bench.lock"
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-max-time=0.05",
        f"--mps-benchmark-lock={lock}",
        "--mps-benchmark-json=out.json",
    )
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps benchmarks: 2 xdist workers take turns, one benchmark "
            f"measures at a time ({lock}); other tests run in parallel",
        ]
    )
    spans = _spans(pytester.path / "out.json")
    assert {worker for _, _, worker in spans} == {"gw0", "gw1"}
    for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
        assert end <= start


def test_without_the_lock_the_header_says_timings_disturb_each_other(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(OVERLAP)
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-max-time=0.05",
        "--mps-benchmark-lock=off",
    )
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps benchmarks: 2 xdist workers measure at the same time "
            "(--mps-benchmark-lock=off): their timings disturb each other"
        ]
    )


def test_a_lock_file_that_cannot_be_made_fails_the_benchmark_naming_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_b(mps_benchmark):\n    mps_benchmark(sum, [1])\n")
    pytester.path.joinpath("a_file").write_text("not a folder")
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-max-time=0.01",
        "--mps-benchmark-lock=a_file/x.lock",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*--mps-benchmark-lock: cannot use the lock file a_file/x.lock*"]
    )


HOLDER = """
import sys, time
from pathlib import Path
from pytest_mps.benchmark.lock import measuring

with measuring(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGINT"])
def test_a_lock_left_by_a_killed_holder_does_not_hang_the_next_run(
    pytester: pytest.Pytester, signal_name: str
) -> None:
    import signal
    import subprocess
    import sys

    from filelock import FileLock, Timeout

    lock = pytester.path / "bench.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        # while the holder lives, nobody else gets the lock
        with pytest.raises(Timeout):
            FileLock(lock).acquire(timeout=0.3)
        holder.send_signal(getattr(signal, signal_name))
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert lock.exists()  # the file stays behind; the OS dropped the lock itself
    pytester.makepyfile("def test_b(mps_benchmark):\n    mps_benchmark(sum, [1])\n")
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-max-time=0.01",
        f"--mps-benchmark-lock={lock}",
        timeout=60,
    )
    result.assert_outcomes(passed=1)
