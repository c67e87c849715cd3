"""The measurement core: statistics, calibration, warmup, setup, events, memory."""

from __future__ import annotations

import importlib.metadata
import random
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mps.benchmark import timer
from pytest_mps.benchmark.stats import Stats
from pytest_mps.benchmark.timer import (
    MAX_ITERATIONS,
    Probe,
    Settings,
    _Round,
    calibrate,
    measure,
    target_round_time,
)

pytest_benchmark_stats = pytest.importorskip("pytest_benchmark.stats")

FIELDS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3")
FIELDS += ("ld15iqr", "hd15iqr", "iqr_outliers", "stddev_outliers", "ops", "total")
# pytest-benchmark before 5.3 returned the first datum *past* Q3 + 1.5 IQR as
# hd15iqr (its stats.py says so where 5.3 fixed it); we follow the fix.
OLD_HD15IQR = tuple(
    int(p) for p in importlib.metadata.version("pytest-benchmark").split(".")[:2]
) < (5, 3)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(min_value=1e-9, max_value=10, allow_nan=False),
        min_size=1,
        max_size=60,
    )
)
def test_stats_equal_pytest_benchmarks_on_the_same_data(data: list[float]) -> None:
    ours = Stats.from_data(data, 1).as_dict()
    theirs = pytest_benchmark_stats.Stats()
    for value in data:
        theirs.update(value)
    for field in FIELDS:
        if field == "hd15iqr" and OLD_HD15IQR:
            continue
        assert ours[field] == pytest.approx(getattr(theirs, field), rel=1e-12), field
    assert ours["rounds"] == theirs.rounds
    assert ours["outliers"] == theirs.outliers


class _ScriptedRunner:
    """Rounds that last exactly n calls of a fixed cost: calibration without a clock."""

    def __init__(self, per_call: float) -> None:
        self.per_call = per_call

    def round(self, n: int) -> _Round:
        return _Round(complete=n * self.per_call, dispatch=0.0, device_ms=None)


@pytest.mark.parametrize("per_call", [1e-8, 3e-6, 1e-3, 0.5])
def test_calibration_makes_a_round_last_at_least_the_target(per_call: float) -> None:
    target = 0.002
    n, duration = calibrate(_ScriptedRunner(per_call), target, first=per_call)  # type: ignore[arg-type]
    assert duration == pytest.approx(n * per_call)
    if n < MAX_ITERATIONS:
        assert n * per_call >= target
        # ...with the 25% margin and no more than one call beyond it
        assert n * per_call <= 1.25 * target + per_call
    else:
        assert per_call * MAX_ITERATIONS < target


def test_min_time_sets_the_round_target() -> None:
    assert (
        target_round_time(Settings(min_time=0.5), cost=0.0, asynchronous=False) == 0.5
    )


def test_rounds_fill_max_time_but_never_fall_under_min_rounds() -> None:
    result, _ = measure(
        time.sleep, (0.01,), settings=Settings(max_time=0.02, warmup=False)
    )
    assert result.stats.rounds == 5
    assert result.stats.iterations == 1


class FakeClock:
    """A clock that moves only as the test says (plus 1 ns a reading, so that
    the resolution probe sees it tick): timings a loaded machine cannot skew."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-9
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def test_warmup_runs_until_the_times_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClock()
    monkeypatch.setattr(timer, "clock", fake)
    delays = iter([0.008, 0.006, 0.004, 0.003, 0.002])

    def slow_start() -> None:
        fake.spend(next(delays, 0.001))

    result, _ = measure(slow_start, settings=Settings(max_time=0.5))
    assert result.warmup_stable is True
    # first call, then 6 ms, 4, 3, 2, 1, 1, 1, 1: stable only once at 1 ms
    assert result.warmup_rounds >= 6
    # The slow calls stayed in warmup: the timed rounds are the fast ones.
    assert result.stats.q3 < 0.0015
    assert result.first_call is not None and result.first_call >= 0.008


def test_warmup_that_never_settles_stops_at_max_time_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fake clock: every call takes 20% longer than the one before, so no two
    # windows of rounds ever agree, whatever the machine's load.
    now = [0.0]
    step = [1e-3]

    def slower_and_slower() -> None:
        step[0] *= 1.2
        now[0] += step[0]

    monkeypatch.setattr(timer, "clock", lambda: now[0])
    result, _ = measure(
        slower_and_slower, settings=Settings(max_time=0.5, iterations=1, rounds=5)
    )
    assert result.warmup_stable is False
    assert 0 < result.warmup_rounds < 1000


def test_fixed_warmup_rounds_and_iterations_call_exactly_that_often() -> None:
    calls: list[int] = []
    result, value = measure(
        lambda: calls.append(1) or len(calls),
        settings=Settings(warmup=2, rounds=3, iterations=4),
    )
    assert len(calls) == (2 + 3) * 4
    assert value == 20
    assert result.stats.rounds == 3 and result.stats.iterations == 4
    assert result.first_call is None


def test_setup_runs_before_every_call_off_the_clock_with_iterations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeClock()
    monkeypatch.setattr(timer, "clock", fake)
    made: list[int] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        fake.spend(0.003)  # expensive setup must not be timed
        made.append(len(made))
        return (made[-1],), {"scale": 2}

    seen: list[int] = []

    def fn(x: int, scale: int) -> int:
        fake.spend(1e-6)
        seen.append(x)
        return x * scale

    result, value = measure(
        fn, setup=setup, settings=Settings(warmup=0, rounds=2, iterations=3)
    )
    assert seen == list(range(6))  # fresh inputs for every call
    assert value == 10
    assert result.stats.max < 0.001


class ScaledEvent:
    """A timing event whose clock runs ``scale`` times too fast or slow."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: ScaledEvent) -> float:
        return (end.at - self.at) * 1000 * self.scale


@pytest.mark.parametrize(("scale", "agree"), [(1.0, True), (0.5, False)])
def test_device_events_are_cross_checked_and_wall_time_wins(
    scale: float, agree: bool
) -> None:
    probe = Probe(
        new_events=lambda: (ScaledEvent(scale), ScaledEvent(scale)), asynchronous=True
    )
    result, _ = measure(
        time.sleep, (0.002,), probe=probe, settings=Settings(rounds=5, warmup=False)
    )
    assert result.events_agree is agree
    assert result.device_time == pytest.approx(result.stats.median * scale, rel=0.1)
    assert result.stats.median >= 0.002


def test_peak_memory_is_the_largest_reading_at_round_ends() -> None:
    # Fixed rounds and iterations, no warmup: exactly one reading per round,
    # however long a round takes on a loaded machine.
    readings = iter([5, 70, 20, 10, 10])
    resets: list[int] = []
    probe = Probe(
        reset_peak_memory=lambda: resets.append(1), memory=lambda: next(readings)
    )
    result, _ = measure(
        lambda: None,
        probe=probe,
        settings=Settings(warmup=False, rounds=5, iterations=1),
    )
    assert result.peak_memory == 70
    assert resets == [1]
    assert next(readings, None) is None  # every reading was taken


def test_cpu_gives_no_verdict_and_no_events() -> None:
    result, _ = measure(lambda: random.random(), settings=Settings(max_time=0.01))
    assert result.verdict is None
    assert result.device_time is None and result.events_agree is None
    assert result.extra_info()["verdict"] is None


def test_teardown_runs_after_each_round_with_each_calls_arguments() -> None:
    made: list[int] = []
    torn: list[int] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        made.append(len(made))
        return (made[-1],), {}

    measure(
        lambda x: x,
        setup=setup,
        teardown=torn.append,
        settings=Settings(warmup=1, rounds=2, iterations=3),
    )
    assert torn == made == list(range(9))
