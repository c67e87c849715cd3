"""``--mps-benchmark-compare-rev=REV``: the baseline's code measured beside ours.

A saved baseline comes from another process, and processes on one machine
differ (measured up to 1.45x on a cloud GPU host for launch-bound work): no
re-measuring within one session fixes that. So this session measures both
sides itself, as asv's ``continuous`` does: REV is checked out into a
temporary git worktree, and the selected benchmarks run in pairs of pytest
processes, one process on each tree.

A host also changes speed while it runs (this project's 2-core machine flips
between two speeds 1.8x apart every 0.25 to 3 s), so the two processes of a
pair run at the same time and take turns (:mod:`.baton`): each benchmark is
measured as usual, then in short blocks of rounds, a block on one side, then a
block on the other, both on the same core. A pair's ratio for a benchmark is
the median of its blocks' ratios (here over REV), each block a few milliseconds
from its partner. The pairs are the samples: a benchmark regresses when a
one-sided Wilcoxon signed-rank test over the pairs' log ratios says this tree is
slower (p < ``pairs.P_THRESHOLD``) *and* the median ratio passes the ``median:X%``
floor (``--mps-benchmark-compare-fail``, default 5%). The
change's interval is the Hodges-Lehmann interval of the pairs' ratios (95%
where the pairs allow one; with five pairs, the range of their Walsh averages,
94%). Which side takes the first turn alternates from pair to pair.

Each side imports the code of its own tree: the tests run from that tree (so
``pytest``'s rootdir-relative imports find its modules), and ``<tree>/src``
and ``<tree>`` lead ``PYTHONPATH``, ahead of an editable install of the
project, whose finder comes after them. An installed (non-editable) copy of
the project is not replaced: install it editable, or use a ``src/`` layout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_mps.benchmark import baton
from pytest_mps.benchmark.ab_report import Outcome, Report
from pytest_mps.benchmark.pairs import P_THRESHOLD, compare, pair_ratios

__all__ = ["ABError", "Outcome", "Report", "run"]

#: Fewer pairs cannot reach P_THRESHOLD (four: 1/16 at best).
MIN_PROCESSES = 5
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
    """One tree's per-process medians and block medians, by benchmark fullname."""

    label: str
    tree: Path
    medians: dict[str, list[float]] = field(default_factory=dict)
    #: benchmark -> pair index -> that process's block medians
    blocks: dict[str, dict[int, list[float]]] = field(default_factory=dict)


def check_repository(where: Path, setting: str = "--mps-benchmark-compare-rev") -> Path:
    """The top of the git repository ``where`` is in; ABError in one line if none.

    ``setting`` names where the gate was asked for (the flag, or the ini key
    and its file).
    """
    try:
        done = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        raise ABError(f"{setting} needs git, which is not installed here") from None
    if done.returncode != 0:
        raise ABError(
            f"{setting}: {where} is not inside a git repository; "
            "it measures a revision of the repository the tests are in beside its "
            "working tree (run pytest from the repository)"
        )
    return Path(done.stdout.strip()).resolve()


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


def _command(out: Path, args: list[str]) -> list[str]:
    return [
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


def run_pair(
    index: int,
    sides: Sequence[Side],
    args: list[str],
    temp: Path,
    invocation: Path,
    top: Path,
) -> list[str]:
    """One process on each side, side by side, taking turns; the lines of failures."""
    workers, runs = [], []
    cpu = baton.shared_cpu()
    try:
        for side in sides:
            where = side.tree / invocation.relative_to(top)
            env = dict(os.environ)
            paths = [str(side.tree / "src"), str(side.tree)]
            if env.get("PYTHONPATH"):
                paths.append(env["PYTHONPATH"])
            env["PYTHONPATH"] = os.pathsep.join(paths)
            worker = baton.Worker(side.label, cpu)
            env[baton.ENV] = worker.env_value
            out = temp / f"{side.label}-{index}.json"
            log = open(temp / f"{side.label}-{index}.log", "w+")  # noqa: SIM115
            process = subprocess.Popen(
                _command(out, args),
                cwd=where,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=worker.child_fds,
            )
            worker.started()
            workers.append(worker)
            runs.append((side, process, out, log))
        baton.serve(workers)
    finally:
        for worker in workers:
            worker.close()
    failures = []
    for side, process, out, log in runs:
        code = process.wait()
        log.seek(0)
        tail = log.read().strip().splitlines()[-3:]
        log.close()
        if code not in (0, 5) or not out.exists():
            failures.append(
                f"the run at {side.label} exited {code}: " + " | ".join(tail)
            )
            continue
        for entry in json.loads(out.read_text())["benchmarks"]:
            name = str(entry["fullname"])
            side.medians.setdefault(name, []).append(float(entry["stats"]["median"]))
            blocks = entry.get("extra_info", {}).get("ab_blocks")
            if blocks:
                side.blocks.setdefault(name, {})[index] = [float(b) for b in blocks]
    return failures


def run(
    rev: str,
    processes: int,
    floor: float,
    args: Sequence[str],
    invocation: Path,
    progress: Any = print,
) -> Report:
    """Measure REV and this tree in alternating processes; compare."""
    top = check_repository(invocation)
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
            base_side, here_side = Side(rev, tree), Side("here", top)
            failures: list[str] = []
            started = time.monotonic()
            for index in range(processes):
                # who takes the first turn alternates from pair to pair
                pair = (
                    [base_side, here_side] if index % 2 == 0 else [here_side, base_side]
                )
                progress(
                    f"pytest-mps A/B: pair {index + 1} of {processes}"
                    + _eta(index, processes, time.monotonic() - started)
                )
                failures += run_pair(index, pair, kept, Path(temp), invocation, top)
                if failures:
                    break
        finally:
            subprocess.run(
                ["git", "-C", str(top), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )
    base, here = base_side.medians, here_side.medians
    outcomes = []
    for name in sorted(set(base) & set(here)):
        base_blocks = base_side.blocks.get(name, {})
        here_blocks = here_side.blocks.get(name, {})
        pairs = pair_ratios(base_blocks, here_blocks)
        if len(pairs) < 2:
            continue
        ratio, low, high, p, slower, faster = compare(pairs, floor)
        outcomes.append(
            Outcome(
                name,
                tuple(base[name]),
                tuple(here[name]),
                tuple(pairs),
                ratio,
                low,
                high,
                p,
                slower,
                faster,
                tuple(
                    (tuple(base_blocks[i]), tuple(here_blocks[i]))
                    for i in sorted(set(base_blocks) & set(here_blocks))
                ),
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


def _eta(done: int, total: int, elapsed: float) -> str:
    """`` (2 done in 3m 10s; about 7m 55s left)``, from the pairs done so far."""
    if done == 0:
        return ""
    left = elapsed / done * (total - done)
    return f" ({done} done in {_clock(elapsed)}; about {_clock(left)} left)"


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m {rest:02d}s" if minutes else f"{rest}s"


def floor_of(exprs: Sequence[Any]) -> float:
    """The ``median:X%`` floor among ``--mps-benchmark-compare-fail`` expressions."""
    for expr in exprs:
        if expr.stat == "median" and expr.percent:
            return float(expr.amount) / 100
    return DEFAULT_FLOOR


def valid_processes(value: str, where: str) -> int:
    """At least :data:`MIN_PROCESSES` pairs; ValueError naming ``where`` otherwise.

    With fewer, no signed-rank p over the pairs can pass :data:`P_THRESHOLD`
    (four pairs: 1/16 at best), so nothing could regress.
    """
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a number of processes") from None
    if count < MIN_PROCESSES:
        raise ValueError(
            f"{where}: at least {MIN_PROCESSES} processes a side (with {count} no "
            f"difference could reach p < {P_THRESHOLD}), got {count}"
        )
    return count
