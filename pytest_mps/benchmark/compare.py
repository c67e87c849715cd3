"""Comparing with a baseline: thresholds, significance, and the regressions table.

A benchmark regresses when its statistic passes the threshold *and* the two
runs differ significantly, as airspeed velocity (asv) decides: a Mann-Whitney
U test on the rounds when both runs kept them (the baseline was saved with
``--mps-benchmark-save-data``) and there are enough of them for the test to
reach its threshold; otherwise the 99% confidence intervals of the medians
must not overlap. A ratio of medians alone turns the machine's noise into
failures.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pytest_mps.benchmark.records import FailExpr, parse_fail_expr
from pytest_mps.benchmark.stats import median_ci

#: asv's default: a difference with p below this is significant.
P_THRESHOLD = 0.002
#: The confidence of the medians' intervals for the fallback test.
CI_CONFIDENCE = 0.99

Entry = Mapping[str, Any]


class Verdict(NamedTuple):
    """Whether two samples differ, and by which test."""

    different: bool
    test: str


class Regression(NamedTuple):
    """One statistic of one benchmark past its threshold, significantly."""

    fullname: str
    name: str
    expr: FailExpr
    baseline: float
    now: float
    test: str


# -- Mann-Whitney U ------------------------------------------------------------------


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) and the sizes of the groups of ties."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


@functools.lru_cache(maxsize=1024)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of m and n values give each U (no ties).

    The largest value is one of the m (it beats all n: U = n + U(m-1, n)) or
    one of the n (U(m, n-1)): Mann and Whitney's recurrence.
    """
    if m == 0 or n == 0:
        return (1,)
    counts = [0] * (m * n + 1)
    for v, c in enumerate(_u_counts(m - 1, n)):
        counts[v + n] += c
    for v, c in enumerate(_u_counts(m, n - 1)):
        counts[v] += c
    return tuple(counts)


def _exact_cdf(m: int, n: int, u: float) -> float:
    """P(U <= u) for samples of m and n without ties."""
    if u < 0:
        return 0.0
    counts = _u_counts(m, n)
    return sum(counts[: math.floor(u) + 1]) / math.comb(m + n, m)


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """U of ``a`` and the two-sided p-value that ``a`` and ``b`` come from one law.

    Exact for small samples without ties; otherwise the normal approximation
    with the tie correction and a continuity correction.
    """
    m, n = len(a), len(b)
    if not m or not n:
        raise ValueError("both samples need at least one value")
    ranks, ties = _ranks([*a, *b])
    u = sum(ranks[:m]) - m * (m + 1) / 2
    if not ties and m <= 20 and n <= 20:
        low = _exact_cdf(m, n, u)
        high = 1 - _exact_cdf(m, n, u - 1)
        return u, min(1.0, 2 * min(low, high))
    mean = m * n / 2
    total = m + n
    correction = sum(t**3 - t for t in ties) / (total * (total - 1))
    variance = m * n / 12 * (total + 1 - correction)
    if variance <= 0:
        return u, 1.0
    z = (abs(u - mean) - 0.5) / math.sqrt(variance)
    return u, min(1.0, 2 * (1 - statistics.NormalDist().cdf(max(z, 0.0))))


# -- deciding ------------------------------------------------------------------------


def is_different(
    now: Sequence[float] | None,
    before: Sequence[float] | None,
    ci_now: Sequence[float] | None,
    ci_before: Sequence[float] | None,
    p_threshold: float = P_THRESHOLD,
) -> Verdict:
    """Whether two runs differ, as asv's ``is_different`` decides.

    A Mann-Whitney test on the rounds, else whether the intervals overlap.
    """
    if now and before:
        # The smallest p-value these sizes can give: when even that is not
        # below the threshold the test cannot say yes, so fall back.
        smallest = 2 / math.comb(len(now) + len(before), min(len(now), len(before)))
        if smallest < p_threshold:
            _, p = mann_whitney(now, before)
            return Verdict(p < p_threshold, f"Mann-Whitney p={p:.2g}")
    if ci_now is None and now:
        ci_now = median_ci(now, CI_CONFIDENCE)
    if ci_now is None or ci_before is None:
        # Nothing to test with: the threshold alone decides, and says so.
        return Verdict(True, "no test (too few rounds)")
    overlap = ci_now[0] <= ci_before[1] and ci_before[0] <= ci_now[1]
    return Verdict(not overlap, "99% CIs " + ("overlap" if overlap else "apart"))


def _rounds(entry: Entry) -> list[float] | None:
    data = entry.get("stats", {}).get("data")
    return list(data) if isinstance(data, list) and data else None


def _ci(entry: Entry) -> list[float] | None:
    found = entry.get("extra_info", {}).get("median_ci99")
    return found if isinstance(found, list) and len(found) == 2 else None


class MissingStatistic(ValueError):
    """A baseline lacks the statistic a threshold compares: never a pass."""


def regressions(
    current: Iterable[Entry], baseline: Mapping[str, Any], default: list[FailExpr]
) -> tuple[list[Regression], dict[str, float]]:
    """Significant slowdowns past each benchmark's thresholds, and median changes.

    A benchmark's own ``compare_fail`` (marker) replaces the session's.
    """
    base = {b["fullname"]: b for b in baseline["benchmarks"]}
    found: list[Regression] = []
    changes: dict[str, float] = {}
    for bench in current:
        old = base.get(bench["fullname"])
        if old is None:
            continue
        stats, old_stats = bench["stats"], old["stats"]
        if old_stats.get("median"):
            changes[bench["fullname"]] = stats["median"] / old_stats["median"] - 1
        own = (bench.get("options") or {}).get("compare_fail")
        exprs = [parse_fail_expr(t, "marker") for t in own] if own else default
        verdict: Verdict | None = None
        for expr in exprs:
            value = old_stats.get(expr.stat)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise MissingStatistic(
                    f"its benchmark {bench['fullname']!r} has no number at "
                    f"stats.{expr.stat}, which the threshold {expr} needs"
                )
            if expr.stat not in stats:
                continue
            if stats[expr.stat] <= expr.limit(old_stats[expr.stat]):
                continue
            if verdict is None:
                verdict = is_different(
                    _rounds(bench), _rounds(old), _ci(bench), _ci(old)
                )
            if verdict.different:
                found.append(
                    Regression(
                        str(bench["fullname"]),
                        str(bench["name"]),
                        expr,
                        float(old_stats[expr.stat]),
                        float(stats[expr.stat]),
                        verdict.test,
                    )
                )
    return found, changes


def regressions_table(found: Sequence[Regression]) -> list[str]:
    """Baseline, now, change and threshold of each regression, in one unit."""
    from pytest_mps.benchmark.report import render, time_unit

    scale, unit = time_unit(min(min(r.baseline, r.now) for r in found))
    header = ["Name", "Stat", f"Baseline ({unit})", f"Now ({unit})", "Change"]
    header += [f"Threshold ({unit})", "Significance"]
    rows = []
    for r in found:
        change = (r.now / r.baseline - 1) * 100 if r.baseline else math.inf
        rows.append(
            [
                r.name,
                r.expr.stat,
                f"{r.baseline / scale:,.4f}",
                f"{r.now / scale:,.4f}",
                f"{change:+,.1f}%",
                f"{r.expr.limit(r.baseline) / scale:,.4f} ({r.expr})",
                r.test,
            ]
        )
    return render(header, rows)
