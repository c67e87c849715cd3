"""Run-to-run spread on CPU workloads: pytest-mps's fixture beside pytest-benchmark's.

Both time the same functions in the same pytest process, several times over
(fresh processes, alternating which tool goes first). For each tool it prints
the within-run spread (IQR/median of the rounds) and the run-to-run spread
(IQR/median and stdev/mean of the runs' medians).

Run:  python benchmarks/benchmark_spread.py [--runs 5] [--max-time 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HEADER = """
import random

DATA = [random.Random(0).random() for _ in range(2000)]
SMALL = list(range(50))


def sort_2000():
    return sorted(DATA)


def sum_50():
    return sum(SMALL)
"""

PB = """
def test_{name}_pb(benchmark):
    benchmark({name}_{size})
"""

MPS = """
def test_{name}_mps(mps_benchmark):
    mps_benchmark({name}_{size})
"""


def tests(mps_first: bool) -> str:
    """The test file; which tool goes first alternates from run to run."""
    text = HEADER
    for name, size in (("sort", 2000), ("sum", 50)):
        pair = (MPS, PB) if mps_first else (PB, MPS)
        text += "".join(t.format(name=name, size=size) for t in pair)
    return text


def one_run(folder: Path, max_time: float, index: int) -> dict[str, dict[str, float]]:
    pb, mps = folder / f"pb{index}.json", folder / f"mps{index}.json"
    (folder / "test_spread.py").write_text(tests(mps_first=bool(index % 2)))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            str(folder / "test_spread.py"),
            f"--benchmark-json={pb}",
            f"--benchmark-max-time={max_time}",
            f"--mps-benchmark-json={mps}",
            f"--mps-benchmark-max-time={max_time}",
        ],
        check=True,
        capture_output=True,
        cwd=folder,
    )
    stats: dict[str, dict[str, float]] = {}
    for path in (pb, mps):
        for bench in json.loads(path.read_text())["benchmarks"]:
            stats[bench["name"]] = bench["stats"]
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-time", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        runs = [one_run(folder, args.max_time, i) for i in range(args.runs)]
    print(
        f"{args.runs} runs, max_time {args.max_time} s each, Python "
        f"{sys.version.split()[0]}"
    )
    header = (
        f"{'workload':<10}{'tool':<18}{'median (us)':>13}{'IQR/median':>12}"
        f"{'(worst run)':>13}{'runs IQR/med':>14}{'runs sd/mean':>13}"
        f"{'rounds':>8}{'iters':>7}"
    )
    print(header)
    print("-" * len(header))
    for workload in ("sort", "sum"):
        for tool, suffix in (("pytest-benchmark", "pb"), ("pytest-mps", "mps")):
            name = f"test_{workload}_{suffix}"
            per_run = [r[name] for r in runs]
            medians = [s["median"] for s in per_run]
            spreads = [s["iqr"] / s["median"] for s in per_run]
            q1, _, q3 = statistics.quantiles(medians, n=4)
            run_iqr = (q3 - q1) / statistics.median(medians)
            run_to_run = statistics.stdev(medians) / statistics.mean(medians)
            print(
                f"{workload:<10}{tool:<18}{statistics.median(medians) * 1e6:>13.3f}"
                f"{statistics.median(spreads) * 100:>11.2f}%"
                f"{max(spreads) * 100:>12.2f}%"
                f"{run_iqr * 100:>13.2f}%{run_to_run * 100:>12.2f}%"
                f"{int(statistics.median(s['rounds'] for s in per_run)):>8}"
                f"{int(statistics.median(s['iterations'] for s in per_run)):>7}"
            )
    print(
        "IQR/median: within a run (median over runs, and the worst run); runs "
        "IQR/med and sd/mean: spread of the runs' medians. The tools alternate "
        "which goes first."
    )


if __name__ == "__main__":
    main()
