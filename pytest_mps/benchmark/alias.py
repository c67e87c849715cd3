"""pytest-benchmark's ``benchmark`` fixture and marker, timed by pytest-mps.

Registered only under ``--mps-benchmark-alias`` (ini ``mps_benchmark_alias``),
after every installed plugin: pytest gives a test the fixture definition it
parsed last among plugins, so ours then replaces pytest-benchmark's, and a
``benchmark`` fixture of the project's own conftest.py still beats both.
Without the option nothing here is loaded, and a suite with pytest-benchmark
installed keeps its fixture.

A test written for pytest-benchmark runs unchanged: ``benchmark(fn, *args,
**kwargs)``, ``benchmark.pedantic(target, args, kwargs, setup, teardown,
rounds, warmup_rounds, iterations)``, ``benchmark.extra_info``,
``benchmark.group``, ``benchmark.name`` / ``fullname`` / ``param`` /
``params``, ``benchmark.stats.stats.<field>`` and ``benchmark.stats["field"]``,
and ``@pytest.mark.benchmark(group=, min_time=, max_time=, min_rounds=,
warmup=, warmup_iterations=, disable_gc=, timer=, baseline=, ...)``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Generator
from typing import Any

import pytest

from pytest_mps.benchmark.fixture import MpsBenchmark
from pytest_mps.benchmark.options import mark_kwargs

MARKER = (
    "benchmark(group=None, min_time=None, max_time=None, min_rounds=None, "
    "warmup=None, ...): pytest-benchmark's marker, read by pytest-mps's "
    "'benchmark' fixture (--mps-benchmark-alias)."
)
#: The marker's arguments that pytest-benchmark documents; calibration_precision,
#: warmup_iterations and confidence are accepted and have no use here
#: (calibration and warmup are our own). ``timer`` replaces perf_counter as the
#: clock (the device is still synced around each round); ``max_time=0`` means
#: min_rounds only; ``cprofile=True`` profiles the function once more.
MARK_ARGS = (
    "group",
    "min_time",
    "max_time",
    "min_rounds",
    "warmup",
    "warmup_iterations",
    "disable_gc",
    "timer",
    "calibration_precision",
    "baseline",
    "precision",
    "confidence",
    "cprofile",
)


class BenchmarkAlias(MpsBenchmark):
    """The ``benchmark`` object: ``mps_benchmark`` with pytest-benchmark's names."""

    def __init__(self, item: pytest.Item, *args: Any, **kwargs: Any) -> None:
        super().__init__(item, *args, **kwargs)
        callspec = getattr(item, "callspec", None)
        #: The test's name, node id, parameter id and parameters, as pytest-benchmark's.
        self.name = item.name
        self.fullname = item.nodeid
        self.param = callspec.id if callspec is not None else None
        self.params = dict(callspec.params) if callspec is not None else None

    def pedantic(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Any = None,
        *,
        setup: Callable[[], Any] | None = None,
        teardown: Callable[..., Any] | None = None,
        rounds: int = 1,
        warmup_rounds: int = 0,
        iterations: int = 1,
        name: str | None = None,
    ) -> Any:
        """pytest-benchmark's ``pedantic``, to the letter of its contract.

        ``setup`` with ``iterations > 1`` is a ValueError, and with
        ``iterations > 1`` the function is called once more after the timed
        rounds (then ``teardown``), for the result it returns: what
        pytest-benchmark does. ``mps_benchmark.pedantic`` allows the first
        and skips the second.
        """
        if (
            isinstance(iterations, int)
            and not isinstance(iterations, bool)
            and iterations > 1
            and setup is not None
        ):
            raise ValueError(
                "Can't use more than 1 `iterations` with a `setup` function."
            )
        value = super().pedantic(
            fn,
            args,
            kwargs,
            setup=setup,
            teardown=teardown,
            rounds=rounds,
            warmup_rounds=warmup_rounds,
            iterations=iterations,
            name=name,
        )
        if iterations > 1 and not self.disabled:
            value = fn(*args, **dict(kwargs or {}))
            if teardown is not None:
                teardown(*args, **dict(kwargs or {}))
        return value

    # pytest-benchmark's clock and minimum round time, which its users' tests
    # set directly (its own test_calibration.py does)
    @property
    def _timer(self) -> Callable[[], float]:
        import time

        return self._settings.timer or time.perf_counter

    @_timer.setter
    def _timer(self, value: Callable[[], float]) -> None:
        self._settings = self._settings._replace(timer=value)

    @property
    def _min_time(self) -> float:
        return self._settings.min_time

    @_min_time.setter
    def _min_time(self, value: float) -> None:
        self._settings = self._settings._replace(min_time=float(value))

    @property
    def enabled(self) -> bool:
        """False under --mps-benchmark-disable."""
        return not self.disabled

    def weave(self, target: Any, **kwargs: Any) -> None:
        """Not available: pytest-benchmark's weave patches code through aspectlib."""
        raise NotImplementedError(
            "benchmark.weave is pytest-benchmark's (through aspectlib) and is not "
            "provided by --mps-benchmark-alias; call benchmark(fn, ...) on the "
            "function instead"
        )


@functools.cache
def alias_class() -> type[BenchmarkAlias]:
    """BenchmarkAlias, also a pytest-benchmark ``BenchmarkFixture`` when installed.

    pytest-benchmark's own hooks stay loaded beside the alias and check that
    the ``benchmark`` of a test is their class (its ``pytest_runtest_makereport``
    raises TypeError otherwise); our methods come first in the MRO, and its
    ``__init__`` never runs.
    """
    try:
        theirs = importlib.import_module("pytest_benchmark.fixture").BenchmarkFixture
    except (ImportError, AttributeError):
        return BenchmarkAlias
    return type("BenchmarkAlias", (BenchmarkAlias, theirs), {})


def parse_mark(mark: pytest.Mark, nodeid: str) -> dict[str, Any]:
    """The marker's settings that apply here; ValueError naming the test."""
    where = f"@pytest.mark.benchmark on {nodeid}"
    kw = mark_kwargs(mark.args, mark.kwargs, where, MARK_ARGS)
    found: dict[str, Any] = {}
    for key in ("min_time", "max_time", "precision"):
        value = kw.get(key)
        if value is None:
            continue
        # max_time=0: min_rounds only, as pytest-benchmark reads it
        low_ok = key == "max_time" and value == 0
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (value <= 0 and not low_ok)
        ):
            raise ValueError(f"{where}: {key} must be a positive number, got {value!r}")
        found[key] = float(value)
    if kw.get("cprofile") is not None:
        found["cprofile"] = bool(kw["cprofile"])
    timer = kw.get("timer")
    if timer is not None:
        if not callable(timer):
            raise ValueError(f"{where}: timer must be a clock function, got {timer!r}")
        found["timer"] = timer
    rounds = kw.get("min_rounds")
    if rounds is not None:
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(
                f"{where}: min_rounds must be an integer >= 1, got {rounds!r}"
            )
        found["min_rounds"] = rounds
    if kw.get("warmup") is not None:
        found["warmup"] = bool(kw["warmup"])
    if kw.get("disable_gc") is not None:
        found["disable_gc"] = bool(kw["disable_gc"])
    group = kw.get("group")
    if group is not None and not isinstance(group, str):
        raise ValueError(f"{where}: group must be a string, got {group!r}")
    found["group"] = group
    found["baseline"] = bool(kw.get("baseline", True))
    return found


@pytest.fixture
def benchmark(request: pytest.FixtureRequest) -> Generator[BenchmarkAlias]:
    """pytest-benchmark's ``benchmark``, timed by pytest-mps (--mps-benchmark-alias).

    ``benchmark(fn, *args, **kwargs)`` returns ``fn``'s result, with the device
    queue drained around every round; ``.pedantic(...)``, ``.extra_info``,
    ``.group`` and ``.stats.stats.median`` work as in pytest-benchmark.
    """
    from pytest_mps.benchmark.targets import finish_benchmark, new_benchmark

    item = request.node
    mark = item.get_closest_marker("benchmark")
    error = None
    try:
        found = parse_mark(mark, item.nodeid) if mark is not None else {}
    except ValueError as exc:
        error = str(exc)
    if error is not None:
        pytest.fail(error, pytrace=False)
    make: Callable[..., MpsBenchmark] = alias_class()
    bench = new_benchmark(item, make, found)
    assert isinstance(bench, BenchmarkAlias)
    yield bench
    finish_benchmark(bench)
