"""What isolation and the watchdog cost per test, measured side by side.

A suite of N small tests (each a few torch ops on the chosen device) runs as a
whole pytest process in each configuration, the configurations interleaved
round after round so drift hits all alike:

- ``plain``: no isolation, no limit.
- ``watchdog``: ``--mps-timeout=600``: a limit on every test, in the main
  process (a thread and faulthandler's timer per test, and the op record's
  dispatch mode around each test's call).
- ``forkserver``: ``--mps-isolate``: each test in a child forked from the fork
  server (the default start).
- ``fork``: ``--mps-isolate --mps-isolate-start=fork``: each child forked from
  the pytest process itself.
- ``spawn``: what a fresh process per test would cost: one ``pytest
  file::test`` process running a single test of the same file (its
  interpreter start-up, imports and collection), timed in the same rounds.

Each configuration's extra time over plain is the median of its per-round
differences; measured at two suite sizes, the slope is the cost per test and
the intercept the cost once per session (the fork server's start-up).

Usage: ``python benchmarks/isolation_cost.py [--tests 20,80] [--rounds 5]
[--device cpu|cuda] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = """
import torch


def test_small(i, device):
    x = torch.randn(64, 64, device=device)
    for _ in range(20):
        x = torch.tanh(x @ x.T / 64)
    assert torch.isfinite(x).all().item()
"""
CONFTEST = """
import pytest


def pytest_generate_tests(metafunc):
    if "i" in metafunc.fixturenames:
        metafunc.parametrize("i", range({tests}))
"""
CONFIGURATIONS = {
    "plain": [],
    "watchdog": ["--mps-timeout=600"],
    "forkserver": ["--mps-isolate"],
    "fork": ["--mps-isolate", "--mps-isolate-start=fork"],
}


def run(folder: Path, args: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed:\n{result.stdout[-3000:]}")
    return elapsed


def measure(
    sizes: list[int], rounds: int, device: str
) -> dict[int, dict[str, list[float]]]:
    """Whole-run seconds per configuration and suite size, interleaved by round."""
    found: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as name:
        base = Path(name)
        folders = {}
        for n in sizes:
            folder = folders[n] = base / f"suite-{n}"
            folder.mkdir()
            (folder / "test_suite.py").write_text(SUITE)
            (folder / "conftest.py").write_text(CONFTEST.format(tests=n))
            found[n] = {config: [] for config in [*CONFIGURATIONS, "spawn"]}
            run(folder, [f"--device={device}"])  # warm the caches
        one = [f"test_suite.py::test_small[0-{device}]"]
        for round_number in range(rounds):
            order = list(CONFIGURATIONS)
            shift = round_number % len(order)
            for n in sizes:
                times = found[n]
                for config in order[shift:] + order[:shift]:
                    args = [f"--device={device}", *CONFIGURATIONS[config]]
                    times[config].append(run(folders[n], args))
                times["spawn"].append(run(folders[n], [f"--device={device}", *one]))
                print(
                    f"round {round_number + 1}/{rounds}, {n} tests: "
                    + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                    flush=True,
                )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="20,80", help="suite sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    if options.device == "cuda":
        options.device = "cuda:0"  # the test ids name the index
    if options.device.startswith("cuda"):
        # a child forked from the pytest process cannot use CUDA: the parent
        # asked the driver (torch.cuda.is_available) before forking
        del CONFIGURATIONS["fork"]
    sizes = sorted(int(n) for n in options.tests.split(","))

    import torch

    found = measure(sizes, options.rounds, options.device)
    print(
        f"\n{options.rounds} rounds, device {options.device}, torch "
        f"{torch.__version__}, {platform.platform()}, {os.cpu_count()} CPUs"
    )
    rows: dict[str, dict[str, object]] = {}
    for config in CONFIGURATIONS:
        extra = {}
        for n in sizes:
            times, plain = found[n][config], found[n]["plain"]
            extra[n] = statistics.median(
                t - p for t, p in zip(times, plain, strict=True)
            )
            ratio = statistics.median(t / p for t, p in zip(times, plain, strict=True))
            print(
                f"{config:>10}, {n:3d} tests: whole run "
                f"{statistics.median(times):6.2f} s, {ratio:5.2f}x plain, "
                f"+{extra[n]:.2f} s ({extra[n] / n * 1000:+.1f} ms per test)"
            )
        rows[config] = {"extra_s": extra}
        if len(sizes) >= 2:
            small, large = sizes[0], sizes[-1]
            marginal = (extra[large] - extra[small]) / (large - small)
            fixed = extra[small] - marginal * small
            rows[config].update(marginal_ms=marginal * 1000, fixed_s=fixed)
            print(
                f"{config:>10}: {marginal * 1000:+.1f} ms per test, {fixed:+.2f} s "
                "once per session (from the two sizes)"
            )
    spawn = statistics.median(found[sizes[0]]["spawn"]) * 1000
    rows["spawn"] = {"per_test_ms": spawn}
    print(f"     spawn: a fresh pytest process for one test: {spawn:.0f} ms per test")
    if options.json:
        options.json.write_text(json.dumps({"rows": rows, "raw": found}, default=str))


if __name__ == "__main__":
    main()
