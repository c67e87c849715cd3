"""``--mps-benchmark-compare-rev=REV``: the baseline's code measured beside ours.

A saved baseline comes from another process, and processes on one machine
differ (measured up to 1.45x on a cloud GPU host for launch-bound work): no
re-measuring within one session fixes that. So this session measures both
sides itself, as asv's ``continuous`` does: REV is checked out into a
temporary git worktree, and the selected benchmarks run in separate pytest
processes, alternating between the two trees in ABBA blocks (A B B A A B ...)
so that drift hits both sides alike.

Each process is a sample: a benchmark's per-process medians are compared with
a Mann-Whitney U test (a slow host mode then slows both sides' samples alike
instead of deciding the verdict), and it regresses when the test says the
sides differ (p < :data:`P_THRESHOLD`) *and* the ratio of the sides' medians
passes the ``median:X%`` floor (``--mps-benchmark-compare-fail``, default
5%). The change's 95% interval is the Hodges-Lehmann/Moses interval of the
per-process ratios (from the same U distribution).

Each side imports the code of its own tree: the tests run from that tree (so
``pytest``'s rootdir-relative imports find its modules), and ``<tree>/src``
and ``<tree>`` lead ``PYTHONPATH``, ahead of an editable install of the
project, whose finder comes after them. An installed (non-editable) copy of
the project is not replaced: install it editable, or use a ``src/`` layout.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_mps.benchmark.compare import _exact_cdf, mann_whitney

#: Two process samples differ below this p (four a side reach 0.029, five 0.008).
P_THRESHOLD = 0.05
#: The change a regression must pass when --mps-benchmark-compare-fail names none.
DEFAULT_FLOOR = 0.05
#: Our options, and the ones the inner runs must not inherit.
OWN = (
    "--mps-benchmark-compare-rev",
    "--mps-benchmark-compare-processes",
    "--mps-benchmark-json",
    "--mps-benchmark-save",
    "--mps-benchmark-autosave",
    "--mps-benchmark-compare",
    "--mps-benchmark-compare-fail",
    "--mps-benchmark-histogram",
    "-n",
    "--numprocesses",
)


class ABError(Exception):
    """A comparison that cannot be made, with the line that says why."""


@dataclass
class Side:
    """One tree's per-process medians, by benchmark fullname."""

    label: str
    tree: Path
    medians: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """One benchmark, both sides."""

    name: str
    base: tuple[float, ...]
    here: tuple[float, ...]
    ratio: float
    low: float
    high: float
    p: float
    regressed: bool
    improved: bool

    def as_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return {
            "base_medians": list(self.base),
            "here_medians": list(self.here),
            "ratio": self.ratio,
            "ratio_ci95": [self.low, self.high],
            "p": self.p,
            "verdict": self.verdict,
        }

    @property
    def verdict(self) -> str:
        """``slower``, ``faster`` or ``same``."""
        if self.regressed:
            return "slower"
        return "faster" if self.improved else "same"


def git(tree: Path, *args: str) -> str:
    """``git -C tree args``; ABError with git's own words when it fails."""
    done = subprocess.run(
        ["git", "-C", str(tree), *args], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ABError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout.rstrip()


def inner_args(args: Sequence[str]) -> list[str]:
    """The session's arguments without the ones the A/B runs set themselves."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in OWN:
            # "--opt value" takes the next argument along, "--opt=value" not;
            # the switches among them take none
            takes_value = "=" not in arg and name != "--mps-benchmark-autosave"
            skip = takes_value
            continue
        kept.append(arg)
    return kept


def order(processes: int) -> list[str]:
    """ABBA blocks: ``A B B A A B B A ...``, ``processes`` of each."""
    found: list[str] = []
    while len(found) < 2 * processes:
        found += ["A", "B"] if (len(found) // 2) % 2 == 0 else ["B", "A"]
    return found


def compare(
    base: Sequence[float], here: Sequence[float], floor: float
) -> tuple[float, float, float, float, bool, bool]:
    """Ratio of medians, its 95% interval, p, regressed, improved."""
    ratio = statistics.median(here) / statistics.median(base)
    ratios = sorted(h / b for h in here for b in base)
    m, n = len(base), len(here)
    k = 0  # the largest U with 2 P(U <= u) <= 0.05
    while 2 * _exact_cdf(m, n, k) <= 0.05:
        k += 1
    if k == 0:
        low, high = ratios[0], ratios[-1]
    else:
        low, high = ratios[k - 1], ratios[len(ratios) - k]
    _, p = mann_whitney(list(base), list(here))
    different = p < P_THRESHOLD
    return (
        ratio,
        low,
        high,
        p,
        different and ratio > 1 + floor,
        different and ratio < 1 / (1 + floor),
    )


def run_side(
    side: Side, args: list[str], out: Path, invocation: Path, top: Path
) -> str | None:
    """One pytest process on ``side``'s tree; None, or the line why it failed."""
    where = side.tree / invocation.relative_to(top)
    env = dict(os.environ)
    paths = [str(side.tree / "src"), str(side.tree)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    command = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        "--mps-benchmark-only",
        f"--mps-benchmark-json={out}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 5) or not out.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return f"the run at {side.label} exited {done.returncode}: " + " | ".join(tail)
    for entry in json.loads(out.read_text())["benchmarks"]:
        name = str(entry["fullname"])
        side.medians.setdefault(name, []).append(float(entry["stats"]["median"]))
    return None


@dataclass
class Report:
    """What the A/B comparison found, for the terminal and the JSON."""

    rev: str
    commit: str
    processes: int
    floor: float
    outcomes: list[Outcome]
    only_base: list[str]
    only_here: list[str]
    failures: list[str]
    dirty: list[str]

    @property
    def failed(self) -> bool:
        """A regression, a benchmark on one side only, or a run that failed."""
        return bool(
            any(o.regressed for o in self.outcomes)
            or self.only_base
            or self.only_here
            or self.failures
            or not self.outcomes
        )

    def lines(self) -> list[str]:
        """The terminal section."""
        from pytest_mps.benchmark.report import format_time, render

        out = [
            f"pytest-mps A/B: {self.rev} ({self.commit[:10]}) against this tree, "
            f"{self.processes} processes a side in ABBA order; slower means "
            f"p < {P_THRESHOLD} (Mann-Whitney over per-process medians) and "
            f"over +{self.floor:.0%}"
        ]
        if self.dirty:
            out.append(
                f"this tree has uncommitted changes ({len(self.dirty)} files, "
                f"first {self.dirty[0]}): they are what is measured here"
            )
        rows = [
            [
                o.name,
                format_time(statistics.median(o.base)),
                format_time(statistics.median(o.here)),
                f"{(o.ratio - 1) * 100:+.1f}%",
                f"[{(o.low - 1) * 100:+.1f}%, {(o.high - 1) * 100:+.1f}%]",
                f"{o.p:.3f}",
                o.verdict,
            ]
            for o in self.outcomes
        ]
        if rows:
            out += render(
                ["Benchmark", self.rev, "here", "change", "95% CI", "p", "verdict"],
                rows,
            )
        out += [f"only at {self.rev}, not measured here: {n}" for n in self.only_base]
        out += [f"only here, not at {self.rev}: {n}" for n in self.only_here]
        out += self.failures
        if not self.outcomes and not self.failures:
            out.append("no benchmark ran on both sides: nothing was compared")
        return out

    def as_dict(self) -> dict[str, Any]:
        """The JSON file's content."""
        return {
            "compare_rev": self.rev,
            "commit": self.commit,
            "processes": self.processes,
            "p_threshold": P_THRESHOLD,
            "floor": self.floor,
            "benchmarks": {o.name: o.as_dict() for o in self.outcomes},
            "only_base": self.only_base,
            "only_here": self.only_here,
            "failures": self.failures,
            "dirty": self.dirty,
        }


def run(
    rev: str,
    processes: int,
    floor: float,
    args: Sequence[str],
    invocation: Path,
    progress: Any = print,
) -> Report:
    """Measure REV and this tree in alternating processes; compare."""
    top = Path(git(invocation, "rev-parse", "--show-toplevel")).resolve()
    # both resolved: on macOS /tmp is /private/tmp, and git names the latter
    invocation = invocation.resolve()
    try:
        commit = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ABError:
        raise ABError(
            f"--mps-benchmark-compare-rev: {rev!r} is not a commit of {top}"
        ) from None
    dirty = [
        line[3:]
        for line in git(top, "status", "--porcelain").splitlines()
        if "__pycache__" not in line
    ]
    kept = inner_args(args)
    with tempfile.TemporaryDirectory(prefix="pytest-mps-ab-") as temp:
        tree = Path(temp) / "tree"
        git(top, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            sides = {"A": Side(rev, tree), "B": Side("here", top)}
            failures: list[str] = []
            for i, which in enumerate(order(processes)):
                side = sides[which]
                progress(
                    f"pytest-mps A/B: process {i + 1} of {2 * processes} ({side.label})"
                )
                failed = run_side(
                    side, kept, Path(temp) / f"{which}{i}.json", invocation, top
                )
                if failed is not None:
                    failures.append(failed)
                    break
        finally:
            subprocess.run(
                ["git", "-C", str(top), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )
    base, here = sides["A"].medians, sides["B"].medians
    outcomes = []
    for name in sorted(set(base) & set(here)):
        if len(base[name]) < 2 or len(here[name]) < 2:
            continue
        ratio, low, high, p, slower, faster = compare(base[name], here[name], floor)
        outcomes.append(
            Outcome(
                name,
                tuple(base[name]),
                tuple(here[name]),
                ratio,
                low,
                high,
                p,
                slower,
                faster,
            )
        )
    return Report(
        rev,
        commit,
        processes,
        floor,
        outcomes,
        sorted(set(base) - set(here)),
        sorted(set(here) - set(base)),
        failures,
        dirty,
    )


def floor_of(exprs: Sequence[Any]) -> float:
    """The ``median:X%`` floor among ``--mps-benchmark-compare-fail`` expressions."""
    for expr in exprs:
        if expr.stat == "median" and expr.percent:
            return float(expr.amount) / 100
    return DEFAULT_FLOOR


def valid_processes(value: str, where: str) -> int:
    """At least 4 processes a side; ValueError naming ``where`` otherwise.

    With fewer, no Mann-Whitney p of two samples of process medians can pass
    :data:`P_THRESHOLD` (three a side: 0.1 at best), so nothing could regress.
    """
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a number of processes") from None
    if count < 4:
        raise ValueError(
            f"{where}: at least 4 processes a side (with {count} no difference "
            f"could reach p < {P_THRESHOLD}), got {count}"
        )
    return count
