"""Sync-aware timing: warmup until stable, calibration, rounds, statistics.

Pure Python, no pytest and no torch: the caller hands in a :class:`Probe` that
says how to drain the device queue and, where the backend has them, how to make
timing events and read memory. CPU (a no-op sync), CUDA, MPS and a test's fake
device queue all go through the one path below.

A round is::

    sync(); event0.record(); t0 = clock()
    fn() ... fn()                     # n calls
    t1 = clock(); event1.record(); sync(); t2 = clock()

``t2 - t0`` is the *complete* time (what the work took), ``t1 - t0`` the host
*dispatch* time (what an unsynced timer reads), and the events' elapsed time
the device's own view, kept to cross-check the wall clock.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from pytest_mps.benchmark.records import Settings
from pytest_mps.benchmark.stats import Stats, median_ci, relative_margin

clock = time.perf_counter

#: Dispatch/complete ratios at or above this mean the device waits on the host.
HOST_BOUND_RATIO = 0.9
#: Most calls one round may hold; a bound on calibration, not a target.
MAX_ITERATIONS = 10_000_000


class TimingEvent(Protocol):
    """A device timing event (``torch.cuda.Event``, ``torch.mps.Event``)."""

    def record(self) -> None:
        """Queue the event on the device's stream."""

    def elapsed_time(self, end: Any) -> float:
        """Milliseconds from this event to ``end``, both complete."""


def _nothing() -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Probe:
    """How to drive one device: drain its queue, and events and memory if any."""

    synchronize: Callable[[], None] = _nothing
    #: A start and an end event, reused by every round; None without events.
    new_events: Callable[[], tuple[TimingEvent, TimingEvent] | None] = _nothing
    reset_peak_memory: Callable[[], None] = _nothing
    #: Peak (or, where the backend keeps no peak, current) allocated bytes.
    memory: Callable[[], int | None] = _nothing
    #: False for CPU: the sync is a no-op and host/device verdicts mean nothing.
    asynchronous: bool = False


@dataclasses.dataclass(frozen=True)
class Result:
    """One measurement: synced wall time, host dispatch, device events, memory."""

    stats: Stats
    dispatch: Stats
    #: Median per-call time by device events, None where the backend has none.
    device_time: float | None
    #: Whether events and wall time agree within Settings.events_tolerance.
    events_agree: bool | None
    peak_memory: int | None
    sync_cost: float
    #: The very first call, synced (compilation, kernel loading); None if fixed.
    first_call: float | None
    warmup_rounds: int
    #: True: warmup ended stable; False: stopped at its time bound; None: fixed.
    warmup_stable: bool | None
    asynchronous: bool
    #: The 99% confidence interval of the median, for comparisons without rounds.
    median_ci99: tuple[float, float] | None = None
    #: The half-width of the median's 95% interval over the median.
    margin: float | None = None

    @property
    def dispatch_ratio(self) -> float:
        """Host dispatch time over complete time (medians)."""
        return self.dispatch.median / self.stats.median if self.stats.median else 1.0

    @property
    def verdict(self) -> str | None:
        """``host-bound`` or ``device-bound``; None on CPU, where it means nothing.

        Host-bound: the host only just keeps the device fed (dispatch takes
        almost the whole time), so a faster kernel would not help.
        """
        if not self.asynchronous:
            return None
        return (
            "host-bound" if self.dispatch_ratio >= HOST_BOUND_RATIO else "device-bound"
        )

    def extra_info(self) -> dict[str, Any]:
        """Our fields for the JSON file's ``extra_info``."""
        return {
            "dispatch_median": self.dispatch.median,
            "dispatch_ratio": self.dispatch_ratio,
            "verdict": self.verdict,
            "device_time_median": self.device_time,
            "events_agree": self.events_agree,
            "peak_memory": self.peak_memory,
            "sync_cost": self.sync_cost,
            "first_call": self.first_call,
            "warmup_rounds": self.warmup_rounds,
            "warmup_stable": self.warmup_stable,
            "median_ci99": list(self.median_ci99) if self.median_ci99 else None,
            "precision": self.margin,
        }


@dataclasses.dataclass(frozen=True)
class _Round:
    complete: float
    dispatch: float
    device_ms: float | None


class _Runner:
    """Runs rounds of ``n`` calls of ``fn`` against one probe."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        setup: Callable[[], Any] | None,
        probe: Probe,
        teardown: Callable[..., Any] | None = None,
    ) -> None:
        self.fn, self.args, self.kwargs, self.setup = fn, args, kwargs, setup
        self.teardown = teardown
        self.probe = probe
        self.events = probe.new_events()
        self.value: Any = None
        self.peak: int | None = None

    def _prepared(self, n: int) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        # setup runs once per call, before the clock starts: with iterations > 1
        # every call gets fresh inputs (what pytest-benchmark#60 asks for).
        assert self.setup is not None
        calls = []
        for _ in range(n):
            made = self.setup()
            if made is None:
                calls.append((self.args, self.kwargs))
            elif self.args or self.kwargs:
                raise TypeError(
                    "setup returned arguments, and args or kwargs were given "
                    "too: pass them one way (pytest-benchmark refuses this too)"
                )
            else:
                args, kwargs = made
                calls.append((tuple(args), dict(kwargs)))
        return calls

    def round(self, n: int) -> _Round:
        prepared = self._prepared(n) if self.setup is not None else None
        fn, probe = self.fn, self.probe
        probe.synchronize()
        events = self.events
        if events is not None:
            events[0].record()
        value: Any = None
        t0 = clock()
        if prepared is None:
            args, kwargs = self.args, self.kwargs
            for _ in range(n):
                value = fn(*args, **kwargs)
        else:
            for args, kwargs in prepared:
                value = fn(*args, **kwargs)
        t1 = clock()
        if events is not None:
            events[1].record()
        probe.synchronize()
        t2 = clock()
        self.value = value
        if self.teardown is not None:
            # Off the clock, with each call's own arguments.
            for args, kwargs in prepared or [(self.args, self.kwargs)]:
                self.teardown(*args, **kwargs)
        device_ms = None
        if events is not None:
            device_ms = float(events[0].elapsed_time(events[1]))
        memory = probe.memory()
        if memory is not None:
            self.peak = memory if self.peak is None else max(self.peak, memory)
        return _Round(t2 - t0, t1 - t0, device_ms)


def sync_cost(probe: Probe, samples: int = 11) -> float:
    """Median seconds one sync of the idle device costs."""
    probe.synchronize()
    times = []
    for _ in range(samples):
        t0 = clock()
        probe.synchronize()
        times.append(clock() - t0)
    return statistics.median(times)


def timer_resolution() -> float:
    """The smallest step the clock shows, measured (not the advertised value)."""
    steps = []
    for _ in range(5):
        t0 = clock()
        t1 = clock()
        while t1 == t0:
            t1 = clock()
        steps.append(t1 - t0)
    return max(min(steps), time.get_clock_info("perf_counter").resolution)


def target_round_time(settings: Settings, cost: float, asynchronous: bool) -> float:
    """How long a round must last: past min_time, timer resolution and sync cost.

    On a device a round pays more than the idle sync measured here: the first
    launch's latency and the sync's wake-up, about ten times as much on an
    H100 (benchmarks/timing_accuracy.py). A thousand syncs keep that near 1%.
    """
    syncs = 1000 if asynchronous else 100
    return max(settings.min_time, 100 * timer_resolution(), syncs * cost)


def calibrate(runner: _Runner, target: float, first: float) -> tuple[int, float]:
    """Calls per round so that a round lasts at least ``target`` seconds.

    Returns the count and the last round's duration.
    """
    n = 1
    duration = first
    for _ in range(20):
        if duration >= target or n >= MAX_ITERATIONS:
            break
        if duration <= 0:
            n *= 10
        else:
            n = max(n + 1, math.ceil(n * target / duration * 1.25))
        n = min(n, MAX_ITERATIONS)
        # The shorter of two rounds: an interrupt can only make a round longer,
        # and one long round must not end the calibration early.
        duration = min(runner.round(n).complete, runner.round(n).complete)
    return n, duration


def warm_up(
    runner: _Runner, n: int, settings: Settings, window: int = 2
) -> tuple[list[float], bool | None]:
    """Warmup rounds of ``n`` calls: per-call times and whether they settled.

    ``warmup=True`` runs until the medians of the last two windows of rounds
    agree within ``stable_tolerance``, bounded by ``max_time``; an int runs
    exactly that many rounds; False or 0 runs none.
    """
    if settings.warmup is False or settings.warmup is None:
        return [], None
    if settings.warmup is not True:
        return [runner.round(n).complete / n for _ in range(int(settings.warmup))], None
    times: list[float] = []
    started = clock()
    while True:
        times.append(runner.round(n).complete / n)
        if len(times) >= 2 * window:
            before = statistics.median(times[-2 * window : -window])
            after = statistics.median(times[-window:])
            if abs(before - after) <= settings.stable_tolerance * max(before, after):
                return times, True
        if clock() - started >= settings.max_time or len(times) >= 1000:
            return times, False


def _timed_rounds(
    runner: _Runner, n: int, rounds: int, settings: Settings
) -> list[_Round]:
    """``rounds`` rounds, or fewer once the median is as precise as asked.

    With a precision, the 95% confidence interval of the median is checked
    after each round from ``min_rounds`` on (pytest-benchmark 5.3's
    --benchmark-precision checks the mean's; the median is what we report).
    """
    if settings.precision is None or settings.rounds is not None:
        return [runner.round(n) for _ in range(rounds)]
    timed: list[_Round] = []
    checked = 0
    while len(timed) < rounds:
        timed.append(runner.round(n))
        # Check again once the count grew by an eighth: each check sorts all
        # the rounds, which must not cost more than timing them.
        if len(timed) >= settings.min_rounds and len(timed) >= checked * 9 // 8:
            checked = len(timed)
            margin = relative_margin([r.complete for r in timed])
            if margin is not None and margin <= settings.precision:
                break
    return timed


def measure(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    setup: Callable[[], Any] | None = None,
    teardown: Callable[..., Any] | None = None,
    probe: Probe | None = None,
    settings: Settings | None = None,
    collect: bool = True,
) -> tuple[Result, Any]:
    """Time ``fn(*args, **kwargs)``; return the result and fn's last value.

    ``setup`` runs before each call and may return its ``(args, kwargs)``;
    ``teardown(*args, **kwargs)`` after each round, per call; both off the clock.
    ``collect=False`` skips the ``gc.collect()`` before timing, for a caller that
    has just collected (a full collection takes 0.15 s in a process that
    imported torch).
    """
    probe = probe or Probe()
    settings = settings or Settings()
    if settings.timer is not None:
        # A clock of the user's (pytest-benchmark's timer=): every reading of
        # this module takes it for the measurement. Benchmarks run one at a
        # time (the fixture's lock, one test per worker), so swapping is safe.
        global clock
        before, clock = clock, settings.timer
        try:
            return measure(
                fn,
                args,
                kwargs,
                setup=setup,
                teardown=teardown,
                probe=probe,
                settings=settings._replace(timer=None),
                collect=collect,
            )
        finally:
            clock = before
    runner = _Runner(fn, args, dict(kwargs or {}), setup, probe, teardown)
    if collect:
        gc.collect()
    probe.reset_peak_memory()
    cost = sync_cost(probe)
    first: float | None = None
    n = settings.iterations
    if n is None:
        first = runner.round(1).complete
        target = target_round_time(settings, cost, probe.asynchronous)
        n, duration = calibrate(runner, target, first)
        warm, stable = warm_up(runner, n, settings)
        per_call = statistics.median(warm[-2:]) if warm else duration / n
        if warm and per_call > 0:
            # Recalibrate from the warm per-call time: the first calls are the
            # slow ones (kernel loading, autotuning, allocator growth).
            # Only ever upwards, with a margin: a round stays past the target.
            n = min(MAX_ITERATIONS, max(n, math.ceil(target / per_call * 1.25)))
    else:
        # Fixed iterations (pedantic): exactly the calls asked for, no more.
        warm, stable = warm_up(runner, n, settings)
        per_call = statistics.median(warm[-2:]) if warm else 0.0
    if settings.rounds is not None:
        rounds = settings.rounds
    else:
        estimate = per_call * n
        rounds = settings.min_rounds
        if estimate > 0:
            rounds = max(rounds, math.ceil(settings.max_time / estimate))
    gc_was_on = gc.isenabled()
    if settings.disable_gc:
        gc.disable()
    try:
        timed = _timed_rounds(runner, n, rounds, settings)
    finally:
        if gc_was_on:
            gc.enable()
    wall = Stats.from_data([r.complete / n for r in timed], n)
    dispatch = Stats.from_data([r.dispatch / n for r in timed], n)
    device_time = events_agree = None
    device = [r.device_ms / 1000 / n for r in timed if r.device_ms is not None]
    if device:
        device_time = statistics.median(device)
        gap = abs(device_time - wall.median)
        events_agree = gap <= settings.events_tolerance * wall.median
    result = Result(
        stats=wall,
        dispatch=dispatch,
        device_time=device_time,
        events_agree=events_agree,
        peak_memory=runner.peak,
        sync_cost=cost,
        first_call=first,
        warmup_rounds=len(warm),
        warmup_stable=stable,
        asynchronous=probe.asynchronous,
        median_ci99=median_ci(wall.data, 0.99),
        margin=relative_margin(wall.data),
    )
    return result, runner.value


def time_block(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    iterations: int,
    rounds: int,
    setup: Callable[[], Any] | None = None,
    teardown: Callable[..., Any] | None = None,
    probe: Probe | None = None,
    settings: Settings | None = None,
) -> float:
    """The median seconds per call of ``rounds`` rounds, timed at once.

    No warmup, no calibration, no ``gc.collect()`` (which takes tens of
    milliseconds in a process holding torch): for the A/B gate's short
    blocks, each timed right after a full :func:`measure` of the function.
    """
    runner = _Runner(fn, args, dict(kwargs), setup, probe or Probe(), teardown)
    fixed = (settings or Settings())._replace(rounds=rounds)
    timed = _timed_rounds(runner, iterations, rounds, fixed)
    return statistics.median(r.complete / iterations for r in timed)
