"""What ``--mps-empty-cache=always`` costs per test over a suite that leaves cycles.

A suite of N tests, each leaving a 1 MiB device tensor in a reference cycle
(as a mock holding a model does, PriorLabs/TabPFN#1093), runs on the emulated
device as a whole pytest process in three configurations, interleaved round
after round so drift hits all alike:

- ``never``: ``--mps-empty-cache=never``, the baseline.
- ``always``: ``--mps-empty-cache=always``: after each test that left device
  memory, one ``gc.collect()`` over what the tests made since collection
  (the heap alive then is frozen), then the cache is emptied.
- ``unfrozen``: the same, with the heap given back to the collector after
  collection (a conftest's ``gc.unfreeze()``): each collection walks
  everything, torch's and pytest's objects included, as a plain
  ``gc.collect()`` per test does (TabPFN measured 0.19 s a test so).

The suite's conftest keeps a heap like a real project's (``--heap`` objects
in lists and dicts, 200,000 by default) alive for the whole session. Each
configuration's extra time over ``never`` is the median of its per-round
differences, divided by N: the cost per test.

Usage: ``python benchmarks/empty_cache_cost.py [--tests 200] [--rounds 5]
[--heap 200000]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = """
import pytest
import torch


@pytest.mark.parametrize("i", range({tests}))
def test_leaves_a_cycle(device, i):
    holder = {{"weights": torch.ones(1 << 18, device=device)}}
    holder["self"] = holder
"""
CONFTEST = """
import gc

import pytest

# a project's long-lived heap: imported libraries, fixtures' data, caches
HEAP = [{{"i": i, "row": [i, str(i)]}} for i in range({heap})]


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    if session.config.getoption("--unfrozen", False):
        gc.unfreeze()


def pytest_addoption(parser):
    parser.addoption("--unfrozen", action="store_true")
"""
CONFIGURATIONS = {
    "never": ["--mps-empty-cache=never"],
    "always": ["--mps-empty-cache=always"],
    "unfrozen": ["--mps-empty-cache=always", "--unfrozen"],
}


def run(folder: Path, args: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["--mps-emulate", *args],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed:\n{result.stdout[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--heap", type=int, default=200_000)
    options = parser.parse_args()
    found: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "test_cycles.py").write_text(SUITE.format(tests=options.tests))
        (folder / "conftest.py").write_text(CONFTEST.format(heap=options.heap))
        run(folder, CONFIGURATIONS["never"])  # warm the caches
        order = list(CONFIGURATIONS)
        for round_number in range(options.rounds):
            shift = round_number % len(order)
            for config in order[shift:] + order[:shift]:
                found[config].append(run(folder, CONFIGURATIONS[config]))
            print(
                f"round {round_number + 1}/{options.rounds}: "
                + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in found.items()),
                flush=True,
            )
    import torch

    print(
        f"\n{options.tests} tests, {options.rounds} rounds, heap {options.heap} "
        f"objects, torch {torch.__version__}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs"
    )
    for config in ("always", "unfrozen"):
        extra = statistics.median(
            a - b for a, b in zip(found[config], found["never"], strict=True)
        )
        print(
            f"{config}: {1000 * extra / options.tests:+.1f} ms a test over never "
            f"(median whole run {statistics.median(found[config]):.2f} s against "
            f"{statistics.median(found['never']):.2f} s)"
        )


if __name__ == "__main__":
    main()
