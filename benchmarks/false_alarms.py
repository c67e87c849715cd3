"""How often does the regression gate fail unchanged code on this machine?

One baseline of the 8 benchmark tests of ``xdist_lock.py`` is saved with its
rounds (``--mps-benchmark-save-data``: the gate uses a Mann-Whitney test where
both runs kept their rounds, up to 10,000 a result, else the 99% confidence
intervals of the medians); then the same code is compared with it
``--runs`` times (20) under ``--mps-benchmark-compare-fail=median:5%``. Every
failure is a false alarm. A measurement that regresses is measured again by the
gate (up to 3 in all); the script counts those, and scores the last. Besides
the gate's own verdict (the exit status) it scores, from each run's JSON, the
same comparisons decided by the ratio of medians alone (the old gate) and by
the 99% confidence intervals alone (what the gate does when the baseline was
saved without its rounds), at the 5%, 2% and 1% thresholds.

torch runs on one intra-op thread unless ``--threads`` says otherwise (see
xdist_lock.py for why).

Run:  python benchmarks/false_alarms.py [--runs 20] [--max-time 0.2] [--threads 1]

``--ab``: the A/B gate (``--mps-benchmark-compare-rev``) instead. A throwaway
git repository holds the 8 tests twice over (16 benchmarks), each test's work
a loop of 10 calls; the committed tree is the baseline REV, and the working
tree changes one half to 11 calls: 10% more work. Every session runs
``--mps-benchmark-compare-rev=HEAD`` once (``--processes`` pairs). An
unchanged benchmark read ``slower`` is a false alarm; a 10%-slower one read
``slower`` is caught (the power). Both are printed with their 95% (Wilson)
intervals. ``--suite cuda`` times CUDA work instead, launch-bound included: an
elementwise chain of 20 ops on 1M elements, matmuls of 1024 and 4096, a
softmax.

Run:  python benchmarks/false_alarms.py --ab [--runs 25] [--processes 7]
          [--max-time 0.05] [--threads 0 (torch's default)] [--suite cpu|cuda]
          [--keep DIR]
      python benchmarks/false_alarms.py --rescore DIR
``--rescore`` scores kept sessions again with their first 5, 6, ... pairs:
what fewer pairs would have given, from the same measurements. Sessions whose
JSON keeps each pair's blocks (``pair_blocks``) are also scored with other pair
statistics (the ratio of the fastest blocks, of the median blocks) over their
first 10, 20, ... blocks; a gate measuring more blocks than its 10 (to score
30, set ``BLOCKS = 30`` in ``pytest_mps/benchmark/baton.py`` of a copy on
PYTHONPATH) measures its first 10 exactly as the gate does.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xdist_lock import tests_source

from pytest_mps.benchmark import compare, storage
from pytest_mps.benchmark.records import parse_fail_expr

GATE = "median:5%"


def pytest_run(folder: Path, *args: str) -> int:
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
            "-p",
            "no:xdist",
            *args,
        ],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 1):
        sys.exit(f"pytest {' '.join(args)} exited {done.returncode}:\n{done.stdout}")
    return done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ab", action="store_true", help="score the A/B gate")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--max-time", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--suite", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--keep", type=Path, default=None, help="copy each A/B session's JSON here"
    )
    parser.add_argument(
        "--rescore",
        type=Path,
        default=None,
        help="score the kept A/B sessions in this folder again, with the first "
        "2..N pairs of each (how many pairs the gate needs)",
    )
    args = parser.parse_args()
    if args.rescore is not None:
        rescore(args.rescore)
    elif args.ab:
        ab_mode(
            runs=args.runs or 25,
            max_time=args.max_time or 0.05,
            threads=0 if args.threads is None else args.threads,
            processes=args.processes,
            suite=args.suite,
            keep=args.keep,
        )
    else:
        saved_mode(args.runs or 20, args.max_time or 0.2, args.threads or 1)


def saved_mode(runs: int, max_time_s: float, threads: int) -> None:
    """The saved-baseline gate, compared ``runs`` times with one saved run."""
    gates = {p: [parse_fail_expr(f"median:{p}%", "gate")] for p in (5, 2, 1)}
    sessions_failed = 0
    rules = ("gate as run", "ratio only", "99% CIs only")
    flagged = {(p, rule): 0 for p in gates for rule in rules}
    sessions = dict.fromkeys(flagged, 0)
    compared = 0
    remeasured = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_eight.py").write_text(tests_source(threads))
        (folder / "pytest.ini").write_text("[pytest]\n")
        max_time = f"--mps-benchmark-max-time={max_time_s}"
        pytest_run(
            folder,
            max_time,
            "--mps-benchmark-save=base",
            "--mps-benchmark-save-data",
        )
        (base_path,) = (folder / ".benchmarks").glob("*/0001_base.json")
        base = json.loads(base_path.read_text())
        stripped = storage.without_rounds(base)
        for run in range(runs):
            started = time.perf_counter()
            out = folder / f"run{run}.json"
            status = pytest_run(
                folder,
                max_time,
                f"--mps-benchmark-compare={base_path}",
                f"--mps-benchmark-compare-fail={GATE}",
                f"--mps-benchmark-json={out}",
            )
            sessions_failed += status == 1
            now = json.loads(out.read_text())["benchmarks"]
            for percent, gate in gates.items():
                found, changes = compare.regressions(now, base, gate)
                by_ci, _ = compare.regressions(now, stripped, gate)
                counts = {
                    "gate as run": len(found),
                    "ratio only": sum(c > percent / 100 for c in changes.values()),
                    "99% CIs only": len(by_ci),
                }
                for name, count in counts.items():
                    flagged[percent, name] += count
                    sessions[percent, name] += count > 0
            compared += len(changes)
            worst = max(changes.values())
            took = time.perf_counter() - started
            again = [
                b["name"] for b in now if b["extra_info"].get("gate_attempts", 1) > 1
            ]
            remeasured += len(again)
            print(
                f"run {run + 1}/{runs}: exit {status}, slowest change "
                f"{worst:+.1%} ({took:.1f} s)"
                + (f"; measured again: {', '.join(again)}" if again else "")
            )
    print()
    print(f"gate {GATE}: {sessions_failed} of {runs} sessions failed")
    print(
        f"{remeasured} of {compared} measurements regressed at first and were "
        "measured again (up to 3 measurements in all; the last is the one scored)"
    )
    print("the same runs, scored offline (the 5% gate is the one that ran):")
    for (percent, name), count in flagged.items():
        print(
            f"median:{percent}%, {name}: {count} of {compared} comparisons "
            f"flagged ({count / compared:.1%}); {sessions[percent, name]} of "
            f"{runs} sessions"
        )


# -- the A/B gate -------------------------------------------------------------------

# The benchmarks' shared part: the same/slowed halves and the loop of calls.
AB_COMMON = """# One half of the benchmarks calls its work SLOWED times on this side.
SLOWED = 10


@pytest.fixture(params=["same", "slowed"])
def calls(request):
    return 10 if request.param == "same" else SLOWED


def repeat(fn, times, *args):
    for _ in range(times):
        fn(*args)
"""

AB_CPU = """
import random

import pytest
import torch

torch.manual_seed(0)
THREADS
COMMON


@pytest.mark.parametrize("n", [64, 128, 256])
def test_mm(mps_benchmark, calls, n):
    a = torch.randn(n, n)
    mps_benchmark(repeat, torch.mm, calls, a, a)


def test_softmax(mps_benchmark, calls):
    x = torch.randn(256, 1024)
    mps_benchmark(repeat, torch.softmax, calls, x, 1)


def test_conv(mps_benchmark, calls):
    conv = torch.nn.Conv2d(8, 16, 3)
    x = torch.randn(4, 8, 32, 32)
    with torch.no_grad():
        mps_benchmark(repeat, conv, calls, x)


def test_layer_norm(mps_benchmark, calls):
    norm = torch.nn.LayerNorm(512)
    x = torch.randn(64, 512)
    with torch.no_grad():
        mps_benchmark(repeat, norm, calls, x)


def test_sorted(mps_benchmark, calls):
    data = [random.Random(0).random() for _ in range(2000)]
    mps_benchmark(repeat, sorted, calls, data)


def test_sum(mps_benchmark, calls):
    mps_benchmark(repeat, sum, calls, range(1000))
"""

AB_CUDA = """
import pytest
import torch

torch.manual_seed(0)
COMMON


def chain(x):
    # 20 elementwise kernels on 1M elements: launch-bound
    for _ in range(10):
        x = torch.sin(x)
        x = x * 1.0001
    return x


def test_chain(mps_benchmark, calls):
    x = torch.randn(1 << 20, device="cuda")
    mps_benchmark(repeat, chain, calls, x)


@pytest.mark.parametrize("n", [1024, 4096])
def test_mm(mps_benchmark, calls, n):
    a = torch.randn(n, n, device="cuda")
    mps_benchmark(repeat, torch.mm, calls, a, a)


def test_softmax(mps_benchmark, calls):
    x = torch.randn(4096, 4096, device="cuda")
    mps_benchmark(repeat, torch.softmax, calls, x, 1)
"""


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    z = 1.959964
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def git(folder: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(folder), *args], check=True, capture_output=True, text=True
    )


def ab_mode(
    runs: int,
    max_time: float,
    threads: int,
    processes: int,
    suite: str,
    keep: Path | None = None,
) -> None:
    """``runs`` A/B sessions; false alarms and power over all their comparisons."""
    source = (AB_CPU if suite == "cpu" else AB_CUDA).replace("COMMON", AB_COMMON)
    pin = (
        f"torch.set_num_threads({threads})" if threads else "# torch's default threads"
    )
    source = source.replace("THREADS", pin)
    print(
        f"A/B gate at {GATE}, {processes} pairs of processes, suite {suite}, "
        f"max time {max_time} s, "
        + (f"torch on {threads} thread(s)" if threads else "torch's default threads")
    )
    false_alarms = same = caught = slowed = faster_same = 0
    worst_same: list[float] = []
    missed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_ab.py").write_text(source)
        (folder / "pytest.ini").write_text("[pytest]\n")
        env_git = ("-c", "user.name=bench", "-c", "user.email=bench@localhost")
        git(folder, "init", "-q")
        git(folder, "add", "-A")
        git(folder, *env_git, "commit", "-q", "-m", "base")
        # the candidate: uncommitted, the slowed half doing 10% more work
        (folder / "test_ab.py").write_text(source.replace("SLOWED = 10", "SLOWED = 11"))
        for run in range(runs):
            started = time.perf_counter()
            out = folder / f"ab{run}.json"
            status = pytest_run(
                folder,
                "--mps-benchmark-compare-rev=HEAD",
                f"--mps-benchmark-compare-processes={processes}",
                f"--mps-benchmark-compare-fail={GATE}",
                f"--mps-benchmark-max-time={max_time}",
                f"--mps-benchmark-json={out}",
            )
            if not out.exists():
                sys.exit(f"session {run + 1} wrote no {out.name}")
            report = json.loads(out.read_text())
            if report["failures"] or report["only_base"] or report["only_here"]:
                sys.exit(f"session {run + 1} could not compare: {report}")
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / out.name).write_text(out.read_text())
            alarms, hits, changes = [], 0, []
            for name, found in report["benchmarks"].items():
                if "same" in name:
                    same += 1
                    changes.append(found["ratio"] - 1)
                    if found["verdict"] == "slower":
                        alarms.append(
                            f"{name} {found['ratio'] - 1:+.1%} p={found['p']:.3f}"
                        )
                    faster_same += found["verdict"] == "faster"
                else:
                    slowed += 1
                    if found["verdict"] == "slower":
                        hits += 1
                    else:
                        missed.append(
                            f"session {run + 1}: {name} {found['ratio'] - 1:+.1%} "
                            f"p={found['p']:.3f}"
                        )
            false_alarms += len(alarms)
            caught += hits
            worst_same.append(max(changes))
            session_missed = [
                m.split(": ", 1)[1]
                for m in missed
                if m.startswith(f"session {run + 1}:")
            ]
            print(
                f"session {run + 1}/{runs}: exit {status}, "
                f"{len(alarms)} false alarm(s), {hits} of "
                f"{len(report['benchmarks']) - len(changes)} slowed caught, largest "
                f"unchanged {max(changes):+.1%} ({time.perf_counter() - started:.0f} s)"
                + (f"; alarms: {'; '.join(alarms)}" if alarms else "")
                + (f"; missed: {'; '.join(session_missed)}" if session_missed else ""),
                flush=True,
            )
    low, high = wilson(false_alarms, same)
    print()
    print(
        f"false alarms: {false_alarms} of {same} unchanged comparisons "
        f"({false_alarms / same:.1%}, 95% CI {low:.1%} to {high:.1%}); "
        f"{faster_same} read faster"
    )
    low, high = wilson(caught, slowed)
    print(
        f"power for 10% more work: {caught} of {slowed} caught "
        f"({caught / slowed:.1%}, 95% CI {low:.1%} to {high:.1%})"
    )
    for line in missed:
        print(f"  missed: {line}")


def score(
    sessions: list[dict[str, Any]], ratios: Callable[[dict[str, Any]], list[float]]
) -> str:
    """False alarms and power over the sessions, pairs' ratios from ``ratios``."""
    from pytest_mps.benchmark import pairs

    counts = {"same": [0, 0], "slowed": [0, 0]}
    for session in sessions:
        for name, found in session["benchmarks"].items():
            slower = pairs.compare(ratios(found), float(session["floor"]))[4]
            kind = "same" if "same" in name else "slowed"
            counts[kind][0] += slower
            counts[kind][1] += 1
    (alarms, same), (caught, slowed) = counts["same"], counts["slowed"]
    low, high = wilson(caught, slowed)
    return (
        f"false alarms {alarms} of {same}; power for 10% {caught} of {slowed}"
        f" ({caught / slowed:.0%}, 95% CI {low:.0%} to {high:.0%})"
    )


def rescore(folder: Path) -> None:
    """The kept sessions' verdicts had they run only their first k pairs."""
    from pytest_mps.benchmark import ab

    sessions = [json.loads(p.read_text()) for p in sorted(folder.glob("ab*.json"))]
    if not sessions:
        sys.exit(f"{folder} holds no ab*.json (run --ab --keep {folder} first)")
    most = min(
        len(b["pair_ratios"]) for s in sessions for b in s["benchmarks"].values()
    )
    print(f"{len(sessions)} sessions, {most} pairs each, scored again at {GATE}")
    for first in range(ab.MIN_PROCESSES, most + 1):
        verdicts = score(sessions, lambda found, k=first: found["pair_ratios"][:k])
        print(f"{first} pairs: {verdicts}")
    if all("pair_blocks" in b for s in sessions for b in s["benchmarks"].values()):
        rescore_blocks(sessions, most)


def _pair_statistic(kind: str, base: list[float], here: list[float]) -> float:
    """One pair's ratio (here over base) from its blocks, by ``kind``."""
    import statistics

    if kind == "median of block ratios":  # the gate's own
        return statistics.median(h / b for b, h in zip(base, here, strict=False))
    if kind == "ratio of fastest blocks":
        return min(here) / min(base)
    if kind == "ratio of median blocks":
        return statistics.median(here) / statistics.median(base)
    raise ValueError(kind)


def rescore_blocks(sessions: list[dict[str, Any]], pairs_kept: int) -> None:
    """Other pair statistics from the kept blocks: the first k blocks of each."""

    blocks = min(
        len(side)
        for s in sessions
        for b in s["benchmarks"].values()
        for pair in b["pair_blocks"]
        for side in pair
    )
    print(f"pair statistics from the kept blocks (up to {blocks} a pair):")
    kinds = (
        "median of block ratios",
        "ratio of fastest blocks",
        "ratio of median blocks",
    )
    for kind in kinds:
        for count in sorted({min(10, blocks), min(20, blocks), blocks}):
            for first in sorted({5, pairs_kept}):

                def ratios(
                    found: dict[str, Any],
                    kind: str = kind,
                    count: int = count,
                    first: int = first,
                ) -> list[float]:
                    return [
                        _pair_statistic(kind, base[:count], here[:count])
                        for base, here in found["pair_blocks"][:first]
                    ]

                print(f"  {kind}, {count} blocks, {first} pairs: "
                      f"{score(sessions, ratios)}")  # fmt: skip


if __name__ == "__main__":
    main()
