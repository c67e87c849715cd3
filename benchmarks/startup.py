"""What pytest-mps adds to every pytest start-up, measured side by side in one run.

A one-test suite that never imports torch runs in fresh processes, bytecode
cached, in rounds that interleave the configurations (so drift on a noisy
machine hits all of them alike):

- ``plain``: pytest as installed, pytest-mps active;
- ``no mps``: the same with ``-p no:mps``;
- ``no benchmark``: with ``-p no:benchmark`` (pytest-benchmark's own cost, for
  reference, when it is installed).

It prints each configuration's median wall time and the median of the paired
per-round differences against ``plain``. The goal for pytest-mps is a paired
median difference of at most 15 ms over at least 30 rounds on a developer's
machine.

    python benchmarks/startup.py --rounds 31
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "def test_one():\n    assert 1 + 1 == 2\n"


# Bytecode cached, as on a user's machine: without the cache every start
# compiles (and pytest rewrites the asserts of) every plugin module again.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_once(folder: Path, extra: list[str]) -> float:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=ENV)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()

    configs: dict[str, list[str]] = {"plain": [], "no mps": ["-p", "no:mps"]}
    if importlib.util.find_spec("pytest_benchmark") is not None:
        configs["no benchmark"] = ["-p", "no:benchmark"]

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "pytest.ini").write_text("[pytest]\n")
        (folder / "test_one.py").write_text(SUITE)
        for extra in configs.values():  # compile and cache bytecode first
            run_once(folder, extra)
        times: dict[str, list[float]] = {name: [] for name in configs}
        for round_index in range(args.rounds):
            order = list(configs)
            if round_index % 2:
                order.reverse()
            for name in order:
                times[name].append(run_once(folder, configs[name]))
            print(f"round {round_index + 1}/{args.rounds}", end="\r", file=sys.stderr)

    print(f"pytest start-up, one test, median of {args.rounds} interleaved rounds")
    print(f"{'configuration':<14} {'median ms':>10} {'plain minus this, ms':>22}")
    for name, values in times.items():
        paired = [p - v for p, v in zip(times["plain"], values, strict=True)]
        diff = "" if name == "plain" else f"{statistics.median(paired) * 1e3:+.1f}"
        print(f"{name:<14} {statistics.median(values) * 1e3:>10.1f} {diff:>22}")
    paired = [p - v for p, v in zip(times["plain"], times["no mps"], strict=True)]
    print(
        f"pytest-mps adds {statistics.median(paired) * 1e3:.1f} ms "
        "(paired median; goal <= 15 ms)"
    )


if __name__ == "__main__":
    main()
