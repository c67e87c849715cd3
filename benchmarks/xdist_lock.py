"""Under pytest-xdist, do benchmarks read what they read alone?

The same 8 benchmark tests run serially (``-p no:xdist``), under ``-n 2`` with
the machine's benchmark lock (the default) and under ``-n 2`` with
``--mps-benchmark-lock=off``, interleaved: each repetition runs the three
configurations one after the other, so drifts of a shared machine's load hit
them alike. For each test it prints the median over repetitions of each
configuration's median, and the ratio of the ``-n 2`` runs to the serial one.

torch runs on ``--threads`` intra-op threads (1 by default). On a shared
2-core machine torch's default of 2 threads stalls for a scheduler time slice
(a call of a 64x64 matmul read 15,987 us here against 7.2 us) whenever any
other process holds a core: serial runs suffer it as much as xdist runs, so it
would measure the neighbours, not the lock.

Run:  python benchmarks/xdist_lock.py [--repeats 5] [--max-time 0.2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = """
import random

import pytest
import torch

torch.manual_seed(0)
torch.set_num_threads(THREADS)


@pytest.mark.parametrize("n", [64, 128, 256])
def test_mm(mps_benchmark, n):
    a = torch.randn(n, n)
    mps_benchmark(torch.mm, a, a)


def test_softmax(mps_benchmark):
    x = torch.randn(256, 1024)
    mps_benchmark(torch.softmax, x, 1)


def test_conv(mps_benchmark):
    conv = torch.nn.Conv2d(8, 16, 3)
    x = torch.randn(4, 8, 32, 32)
    with torch.no_grad():
        mps_benchmark(conv, x)


def test_layer_norm(mps_benchmark):
    norm = torch.nn.LayerNorm(512)
    x = torch.randn(64, 512)
    with torch.no_grad():
        mps_benchmark(norm, x)


def test_sorted(mps_benchmark):
    data = [random.Random(0).random() for _ in range(2000)]
    mps_benchmark(sorted, data)


def test_sum(mps_benchmark):
    mps_benchmark(sum, range(1000))
"""

CONFIGS = {
    "serial": ["-p", "no:xdist"],
    "-n 2, lock": ["-n", "2"],
    "-n 2, no lock": ["-n", "2", "--mps-benchmark-lock=off"],
}


def tests_source(threads: int) -> str:
    """The 8 tests, torch on ``threads`` intra-op threads."""
    return TESTS.replace("THREADS", str(threads))


def write_tests(folder: Path, threads: int) -> None:
    (folder / "test_eight.py").write_text(tests_source(threads))
    (folder / "pytest.ini").write_text("[pytest]\n")


def run_once(folder: Path, args: list[str], max_time: float) -> dict[str, float]:
    out = folder / "out.json"
    out.unlink(missing_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            f"--mps-benchmark-max-time={max_time}",
            f"--mps-benchmark-json={out}",
            *args,
        ],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(f"pytest {' '.join(args)} failed:\n{done.stdout[-3000:]}")
    doc = json.loads(out.read_text())
    return {b["name"]: b["stats"]["median"] for b in doc["benchmarks"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-time", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_tests(folder, args.threads)
        for repeat in range(args.repeats):
            for name, extra in CONFIGS.items():
                started = time.perf_counter()
                runs[name].append(run_once(folder, extra, args.max_time))
                took = time.perf_counter() - started
                print(f"repeat {repeat + 1}/{args.repeats}: {name} ({took:.1f} s)")
    tests = sorted(runs["serial"][0])
    print()
    print(f"{'test':<22}{'serial':>12}{'-n 2 lock':>12}{'ratio':>8}", end="")
    print(f"{'-n 2 no lock':>14}{'ratio':>8}")
    worst = {"-n 2, lock": 0.0, "-n 2, no lock": 0.0}
    spread: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for test in tests:
        medians = {}
        for name in CONFIGS:
            values = [run[test] for run in runs[name]]
            medians[name] = statistics.median(values)
            low, high = min(values), max(values)
            spread[name].append((high - low) / medians[name])
        base = medians["serial"]
        cells = [f"{test:<22}", f"{base * 1e6:>10.1f}us"]
        for name in ("-n 2, lock", "-n 2, no lock"):
            ratio = medians[name] / base
            worst[name] = max(worst[name], abs(ratio - 1))
            cells.append(f"{medians[name] * 1e6:>10.1f}us{ratio:>8.3f}")
        print("".join(cells))
    print()
    for name, value in worst.items():
        print(f"{name}: worst |ratio - 1| over the 8 tests = {value:.1%}")
    for name, values in spread.items():
        print(
            f"{name}: run-to-run spread (max-min)/median, median over tests = "
            f"{statistics.median(values):.1%}"
        )


if __name__ == "__main__":
    main()
