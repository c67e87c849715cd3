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
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xdist_lock import tests_source

from pytest_mps.benchmark import compare, storage
from pytest_mps.benchmark.options import parse_fail_expr

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
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--max-time", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    gates = {p: [parse_fail_expr(f"median:{p}%", "gate")] for p in (5, 2, 1)}
    sessions_failed = 0
    rules = ("gate as run", "ratio only", "99% CIs only")
    flagged = {(p, rule): 0 for p in gates for rule in rules}
    sessions = dict.fromkeys(flagged, 0)
    compared = 0
    remeasured = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_eight.py").write_text(tests_source(args.threads))
        (folder / "pytest.ini").write_text("[pytest]\n")
        max_time = f"--mps-benchmark-max-time={args.max_time}"
        pytest_run(
            folder,
            max_time,
            "--mps-benchmark-save=base",
            "--mps-benchmark-save-data",
        )
        (base_path,) = (folder / ".benchmarks").glob("*/0001_base.json")
        base = json.loads(base_path.read_text())
        stripped = storage.without_rounds(base)
        for run in range(args.runs):
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
                f"run {run + 1}/{args.runs}: exit {status}, slowest change "
                f"{worst:+.1%} ({took:.1f} s)"
                + (f"; measured again: {', '.join(again)}" if again else "")
            )
    print()
    print(f"gate {GATE}: {sessions_failed} of {args.runs} sessions failed")
    print(
        f"{remeasured} of {compared} measurements regressed at first and were "
        "measured again (up to 3 measurements in all; the last is the one scored)"
    )
    print("the same runs, scored offline (the 5% gate is the one that ran):")
    for (percent, name), count in flagged.items():
        print(
            f"median:{percent}%, {name}: {count} of {compared} comparisons "
            f"flagged ({count / compared:.1%}); {sessions[percent, name]} of "
            f"{args.runs} sessions"
        )


if __name__ == "__main__":
    main()
