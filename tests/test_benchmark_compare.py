"""Significance: Mann-Whitney U, the medians' intervals, and when a slowdown counts."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from pytest_mps.benchmark.compare import (
    _exact_cdf,
    is_different,
    mann_whitney,
    regressions,
)
from pytest_mps.benchmark.records import parse_fail_expr
from pytest_mps.benchmark.stats import median_ci


def brute_force_p(a: list[float], b: list[float]) -> float:
    """Two-sided p of U by enumerating every split of the pooled values."""
    pooled = a + b
    m = len(a)

    def u_of(first: tuple[float, ...], second: list[float]) -> int:
        return sum(x > y for x in first for y in second)

    observed = u_of(tuple(a), b)
    us = []
    for chosen in itertools.combinations(range(len(pooled)), m):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        us.append(u_of(tuple(pooled[i] for i in chosen), rest))
    low = sum(u <= observed for u in us) / len(us)
    high = sum(u >= observed for u in us) / len(us)
    return min(1.0, 2 * min(low, high))


@pytest.mark.parametrize("seed", range(6))
def test_exact_mann_whitney_matches_enumeration(seed: int) -> None:
    rng = random.Random(seed)
    a = [rng.random() + 0.3 * (seed % 3) for _ in range(rng.randint(2, 6))]
    b = [rng.random() for _ in range(rng.randint(2, 6))]
    u, p = mann_whitney(a, b)
    assert u == sum(x > y for x in a for y in b)
    assert p == pytest.approx(brute_force_p(a, b))


def test_the_normal_approximation_agrees_with_the_exact_distribution() -> None:
    rng = random.Random(7)
    a = [rng.gauss(1.0, 0.1) for _ in range(21)]
    b = [rng.gauss(1.08, 0.1) for _ in range(21)]
    u, approx = mann_whitney(a, b)  # past 20 a side: the normal approximation
    exact = 2 * min(_exact_cdf(21, 21, u), 1 - _exact_cdf(21, 21, u - 1))
    # The tails are where the approximation is coarsest.
    assert exact < 0.01 and approx < 0.01
    assert approx == pytest.approx(exact, rel=0.5)


def test_ties_are_allowed_and_identical_samples_do_not_differ() -> None:
    same = [1.0, 1.0, 2.0, 2.0, 3.0] * 10
    assert mann_whitney(same, list(same))[1] == pytest.approx(1.0)


def test_shifted_rounds_differ_by_mann_whitney() -> None:
    rng = random.Random(1)
    before = [rng.gauss(1.0, 0.05) for _ in range(200)]
    now = [rng.gauss(1.1, 0.05) for _ in range(200)]
    verdict = is_different(now, before, None, None)
    assert verdict.different and verdict.test.startswith("Mann-Whitney p=")
    same = [rng.gauss(1.0, 0.05) for _ in range(200)]
    assert not is_different(same, before, None, None).different


def test_too_few_rounds_for_the_test_fall_back_to_the_intervals() -> None:
    # 3 and 3 rounds: the smallest two-sided p is 0.1, never below 0.002.
    verdict = is_different([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], [1.9, 2.3], [0.9, 1.3])
    assert verdict == (True, "99% CIs apart")
    verdict = is_different([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], [1.9, 2.3], [1.0, 2.0])
    assert verdict == (False, "99% CIs overlap")


def test_without_rounds_or_intervals_the_threshold_alone_decides() -> None:
    assert is_different(None, None, None, None) == (True, "no test (too few rounds)")


def test_the_median_interval_covers_the_median() -> None:
    data = [float(i) for i in range(1, 101)]
    low, high = median_ci(data, 0.95) or (0.0, 0.0)
    assert low == 40.0 and high == 61.0  # the textbook order statistics for n=100
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) is None


def bench(name: str, data: list[float], **options: Any) -> dict[str, Any]:
    ordered = sorted(data)
    return {
        "name": name,
        "fullname": f"t.py::{name}",
        "options": options,
        "stats": {
            "median": ordered[len(ordered) // 2],
            "min": ordered[0],
            "data": data,
        },
        "extra_info": {"median_ci99": list(median_ci(data, 0.99) or [])},
    }


def test_a_slowdown_must_pass_the_threshold_and_be_significant() -> None:
    rng = random.Random(3)
    base = [rng.gauss(1.0, 0.3) for _ in range(8)]
    # 6% slower by the medians, but 8 noisy rounds against 8 cannot tell.
    noisy = [v * 1.06 for v in base[::-1]]
    rng.shuffle(noisy)
    clear = [rng.gauss(2.0, 0.01) for _ in range(50)]
    steady = [rng.gauss(1.0, 0.01) for _ in range(50)]
    gate = [parse_fail_expr("median:5%", "x")]
    found, changes = regressions(
        [bench("test_noisy", noisy), bench("test_clear", clear)],
        {"benchmarks": [bench("test_noisy", base), bench("test_clear", steady)]},
        gate,
    )
    assert [r.name for r in found] == ["test_clear"]
    assert changes["t.py::test_noisy"] == pytest.approx(0.06)
    assert found[0].test.startswith("Mann-Whitney p=")
    assert math.isclose(
        found[0].expr.limit(found[0].baseline), found[0].baseline * 1.05
    )
