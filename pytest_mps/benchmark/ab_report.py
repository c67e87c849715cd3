"""The A/B gate's findings: each benchmark's outcome, and the report of a run.

:mod:`.ab` measures; this module holds what it found and how it reads, in the
terminal (one table, the counts) and in the JSON file.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from pytest_mps.benchmark.pairs import MIN_PAIRS_FOR_INTERVAL, P_THRESHOLD


@dataclass(frozen=True)
class Outcome:
    """One benchmark, both sides."""

    name: str
    base: tuple[float, ...]
    here: tuple[float, ...]
    pairs: tuple[float, ...]
    ratio: float
    low: float
    high: float
    p: float
    regressed: bool
    improved: bool
    #: each pair's block medians, (base, here), in pair order
    blocks: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return {
            "base_medians": list(self.base),
            "here_medians": list(self.here),
            "pair_ratios": list(self.pairs),
            "pair_blocks": [[list(b), list(h)] for b, h in self.blocks],
            "ratio": self.ratio,
            # no interval from fewer pairs: see pairs.MIN_PAIRS_FOR_INTERVAL
            "ratio_ci95": [self.low, self.high] if self.has_interval else None,
            "p": self.p,
            "verdict": self.verdict,
        }

    @property
    def has_interval(self) -> bool:
        """Enough pairs for an interval that extreme pairs do not set."""
        return len(self.pairs) >= MIN_PAIRS_FOR_INTERVAL

    @property
    def verdict(self) -> str:
        """``slower``, ``faster`` or ``same``."""
        if self.regressed:
            return "slower"
        return "faster" if self.improved else "same"


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
            f"{self.processes} pairs of processes taking turns block by block; "
            f"slower means p < {P_THRESHOLD} (one-sided Wilcoxon signed-rank "
            f"over the pairs' ratios) and over +{self.floor:.0%}"
        ]
        if self.dirty:
            files = (
                f"1 file: {self.dirty[0]}"
                if len(self.dirty) == 1
                else f"{len(self.dirty)} files, the first {self.dirty[0]}"
            )
            out.append(
                f"this tree has uncommitted changes ({files}): they are what is "
                "measured here"
            )
        rows = [
            [
                o.name,
                format_time(statistics.median(o.base)),
                format_time(statistics.median(o.here)),
                f"{(o.ratio - 1) * 100:+.1f}%",
                f"[{(o.low - 1) * 100:+.1f}%, {(o.high - 1) * 100:+.1f}%]"
                if o.has_interval
                else "n/a",
                f"{o.p:.3f}",
                o.verdict,
            ]
            for o in self.outcomes
        ]
        if rows:
            out += render(
                ["Benchmark", self.rev, "here", "change", "interval", "p", "verdict"],
                rows,
            )
        if any(not o.has_interval for o in self.outcomes):
            out.append(
                f"no interval with {self.processes} pairs: a 95% interval of the "
                "median ratio would span the most extreme pairs, so one disturbed "
                f"pair would set it; {MIN_PAIRS_FOR_INTERVAL} pairs or more give one "
                "(--mps-benchmark-compare-processes)"
            )
        out += [f"only at {self.rev}, not measured here: {n}" for n in self.only_base]
        out += [f"only here, not at {self.rev}: {n}" for n in self.only_here]
        out += self.failures
        if not self.outcomes and not self.failures:
            out.append("no benchmark ran on both sides: nothing was compared")
        out.append(f"pytest-mps A/B: {self.counts_line()}")
        return out

    def counts(self) -> dict[str, int]:
        """Benchmarks compared, and how many read slower, faster and same."""
        verdicts = [o.verdict for o in self.outcomes]
        return {
            "compared": len(verdicts),
            **{v: verdicts.count(v) for v in ("slower", "faster", "same")},
        }

    def counts_line(self) -> str:
        """``3 benchmarks compared: 1 slower, 0 faster, 2 same``."""
        counts = self.counts()
        noun = "benchmark" if counts["compared"] == 1 else "benchmarks"
        return (
            f"{counts['compared']} {noun} compared: {counts['slower']} slower, "
            f"{counts['faster']} faster, {counts['same']} same"
        )

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
