"""The A/B gate's statistics over pairs of processes: each pair's ratio, the test.

A pair's ratio is the median of its blocks' ratios (here over base); the pairs
are the samples. A benchmark is slower when a one-sided exact Wilcoxon
signed-rank test over the pairs' log ratios gives p < ``P_THRESHOLD`` and the
median ratio passes the floor; the interval is the Hodges-Lehmann one from the
Walsh averages.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: A one-sided p below this says a side is slower (five pairs reach 1/32).
P_THRESHOLD = 0.05
#: Fewer pairs give no interval worth printing: the 95% Hodges-Lehmann
#: interval's ends are then the lowest and highest Walsh averages (six pairs:
#: the second lowest at best), so one disturbed pair sets an end (a session
#: under load read [-5.6%, +15971.3%] with five). Seven pairs drop the two most
#: extreme averages at each end.
MIN_PAIRS_FOR_INTERVAL = 7


def _rank_sum_counts(n: int) -> list[int]:
    """How many of the 2**n sign patterns give each positive-rank sum 0..n(n+1)/2."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    return counts


def signed_rank(logs: Sequence[float]) -> tuple[float, float]:
    """Exact one-sided Wilcoxon signed-rank p values: (above 0, below 0).

    Zeros are dropped, as Wilcoxon's test does; ties of magnitude are ranked
    in their order (ratios of timings hardly tie).
    """
    values = [x for x in logs if x != 0]
    n = len(values)
    if n == 0:
        return 1.0, 1.0
    order = sorted(range(n), key=lambda i: abs(values[i]))
    positive = sum(rank + 1 for rank, i in enumerate(order) if values[i] > 0)
    counts = _rank_sum_counts(n)
    total = 2**n
    above = sum(counts[positive:]) / total
    below = sum(counts[: positive + 1]) / total
    return above, below


def compare(
    pairs: Sequence[float], floor: float
) -> tuple[float, float, float, float, bool, bool]:
    """Median ratio, its interval, p, regressed, improved, from the pairs' ratios."""
    logs = [math.log(r) for r in pairs]
    ratio = statistics.median(pairs)
    above, below = signed_rank(logs)
    n = len(logs)
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    counts = _rank_sum_counts(n)
    k, tail = 0, 0  # the largest k with P(W <= k - 1) <= 0.025
    while tail + counts[k] <= 0.025 * 2**n:
        tail += counts[k]
        k += 1
    if k == 0:
        low, high = walsh[0], walsh[-1]
    else:
        low, high = walsh[k - 1], walsh[len(walsh) - k]
    slower = above < P_THRESHOLD and ratio > 1 + floor
    faster = below < P_THRESHOLD and ratio < 1 / (1 + floor)
    p = above if ratio >= 1 else below
    return ratio, math.exp(low), math.exp(high), p, slower, faster


def pair_ratios(
    base: dict[int, list[float]], here: dict[int, list[float]]
) -> list[float]:
    """Each pair's median block ratio, here over base, in pair order."""
    found = []
    for index in sorted(set(base) & set(here)):
        ratios = [
            h / b for b, h in zip(base[index], here[index], strict=False) if b > 0
        ]
        if ratios:
            found.append(statistics.median(ratios))
    return found
