"""Statistics of benchmark rounds, field for field as pytest-benchmark's."""

from __future__ import annotations

import dataclasses
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Stats:
    """Per-call times in seconds, with pytest-benchmark's fields and quartiles."""

    data: tuple[float, ...]
    iterations: int
    min: float
    max: float
    mean: float
    stddev: float
    median: float
    q1: float
    q3: float
    iqr: float
    ld15iqr: float
    hd15iqr: float
    iqr_outliers: int
    stddev_outliers: int
    total: float

    @property
    def rounds(self) -> int:
        """How many rounds were timed."""
        return len(self.data)

    @property
    def ops(self) -> float:
        """Calls per second (1 / mean), as pytest-benchmark defines it."""
        return self.rounds / self.total if self.total else 0.0

    @property
    def stats(self) -> Stats:
        """Itself: pytest-benchmark's ``benchmark.stats.stats.median`` reads here."""
        return self

    def __getitem__(self, field: str) -> Any:
        """``stats["median"]``, as pytest-benchmark's ``Metadata`` allows."""
        if field not in self.as_dict():
            raise KeyError(field)
        return getattr(self, field)

    @property
    def outliers(self) -> str:
        """``"stddev_outliers;iqr_outliers"``, pytest-benchmark's format."""
        return f"{self.stddev_outliers};{self.iqr_outliers}"

    @classmethod
    def from_data(cls, data: Sequence[float], iterations: int) -> Stats:
        """Statistics of per-call round times (quartiles as pytest-benchmark's)."""
        if not data:
            raise ValueError("no rounds were timed")
        ordered = sorted(data)
        q1, q3 = _quartiles(ordered)
        iqr = q3 - q1
        mean = statistics.mean(data)
        stddev = statistics.stdev(data) if len(data) > 1 else 0.0
        low, high = q1 - 1.5 * iqr, q3 + 1.5 * iqr
        return cls(
            data=tuple(data),
            iterations=iterations,
            min=ordered[0],
            max=ordered[-1],
            mean=mean,
            stddev=stddev,
            median=statistics.median(ordered),
            q1=q1,
            q3=q3,
            iqr=iqr,
            ld15iqr=ordered[bisect_left(ordered, low)],
            hd15iqr=ordered[bisect_right(ordered, high) - 1],
            iqr_outliers=sum(1 for v in data if v < low or v > high),
            stddev_outliers=sum(
                1 for v in data if v < mean - stddev or v > mean + stddev
            ),
            total=sum(data),
        )

    def as_dict(self, max_data: int | None = None) -> dict[str, Any]:
        """The ``stats`` object of a pytest-benchmark JSON file.

        Past ``max_data`` rounds, ``data`` keeps a uniform sample of that many
        rounds (in round order, the same sample for the same rounds), so the
        rank test and the histogram still have rounds to work on, and
        ``data_sample`` says so: ``{"kept": max_data, "of": rounds}``. The
        other statistics cover every round.
        """
        out: dict[str, Any] = {
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "stddev": self.stddev,
            "rounds": self.rounds,
            "median": self.median,
            "iqr": self.iqr,
            "q1": self.q1,
            "q3": self.q3,
            "iqr_outliers": self.iqr_outliers,
            "stddev_outliers": self.stddev_outliers,
            "outliers": self.outliers,
            "ld15iqr": self.ld15iqr,
            "hd15iqr": self.hd15iqr,
            "ops": self.ops,
            "total": self.total,
            "iterations": self.iterations,
        }
        data = list(self.data)
        if max_data is not None and len(data) > max_data:
            import random

            kept = sorted(random.Random(len(data)).sample(range(len(data)), max_data))
            out["data_sample"] = {"kept": max_data, "of": len(data)}
            data = [data[i] for i in kept]
        out["data"] = data
        return out


def _quartiles(ordered: Sequence[float]) -> tuple[float, float]:
    # pytest-benchmark's stats.py, after Wikipedia's "Quartile" methods 2 and 3,
    # so the same data gives the same IQR in both tools.
    n = len(ordered)
    if n == 1:
        return ordered[0], ordered[0]
    if n % 2:
        k, r = n // 4, n % 4
        if r == 1:
            q1 = 0.25 * ordered[k - 1] + 0.75 * ordered[k]
            q3 = 0.75 * ordered[3 * k] + 0.25 * ordered[3 * k + 1]
        else:
            q1 = 0.75 * ordered[k] + 0.25 * ordered[k + 1]
            q3 = 0.25 * ordered[3 * k + 1] + 0.75 * ordered[3 * k + 2]
        return q1, q3
    return statistics.median(ordered[: n // 2]), statistics.median(ordered[n // 2 :])


def _order_index(n: int, confidence: float) -> int | None:
    """The 0-based k with [x[k], x[n-1-k]] covering the median at ``confidence``.

    Distribution-free (the binomial argument for order statistics): exact up
    to 300 rounds, the normal approximation past that; None when ``n`` rounds
    are too few for the asked confidence (5 rounds give at most 93.75%).
    """
    alpha = 1 - confidence
    if n > 300:
        z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
        k = math.floor((n - z * math.sqrt(n)) / 2) - 1
        return k if k >= 0 else None
    # Largest k with 2 * P(B <= k) <= alpha, B ~ Binomial(n, 1/2), in integers.
    budget = alpha / 2 * 2**n
    tail = 0
    k = -1
    while k + 1 < n // 2:
        tail += math.comb(n, k + 1)
        if tail > budget:
            break
        k += 1
    return k if k >= 0 else None


def median_ci(
    data: Sequence[float], confidence: float = 0.95
) -> tuple[float, float] | None:
    """A confidence interval of the median of ``data``, or None for too few rounds."""
    ordered = sorted(data)
    k = _order_index(len(ordered), confidence)
    if k is None:
        return None
    return ordered[k], ordered[len(ordered) - 1 - k]


def relative_margin(data: Sequence[float], confidence: float = 0.95) -> float | None:
    """The larger half of the median's confidence interval, over the median."""
    interval = median_ci(data, confidence)
    if interval is None:
        return None
    median = statistics.median(data)
    if median <= 0:
        return None
    return max(median - interval[0], interval[1] - median) / median
