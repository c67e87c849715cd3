"""The ``mps_benchmark`` fixture's object, and how it drives each device."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_mps.benchmark.lock import measuring
from pytest_mps.benchmark.options import PROPERTY
from pytest_mps.benchmark.probe import hardware, make_probe, release_memory
from pytest_mps.benchmark.records import Settings
from pytest_mps.benchmark.stats import Stats
from pytest_mps.benchmark.timer import Probe, Result, measure, time_block
from pytest_mps.devices import emulated
from pytest_mps.machine.fingerprint import cpu_name

#: The most per-round times a result carries into reports and files.
MAX_DATA = 10_000


def _jsonable(value: Any) -> Any:
    """``value`` where JSON can hold it (lists, dicts too), else its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


class MpsBenchmark:
    """Times callables with the device queue drained; see ``mps_benchmark``."""

    def __init__(
        self,
        item: pytest.Item,
        settings: Settings,
        targets: Callable[
            [pytest.Item, tuple[Any, ...], dict[str, Any]], tuple[str, list[str]]
        ],
        group: str | None,
        compare_fail: tuple[str, ...],
        *,
        lock: Path | None = None,
        disabled: bool = False,
        gate: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self._item = item
        self._lock = lock
        #: Whether a measurement's entry fails the regression gate; with it a
        #: failing measurement is taken again (see :mod:`.confirm`).
        self._gate = gate
        self._attempts: dict[str | None, int] = {}
        #: The A/B gate's block medians, by measurement name (:mod:`.baton`).
        self._blocks: dict[str | None, list[float]] = {}
        #: True under --mps-benchmark-disable: functions run once, untimed.
        self.disabled = disabled
        self._settings = settings
        self._targets = targets
        self._probe: Probe | None = None
        self._results: dict[str | None, Result] = {}
        self._last: Result | None = None
        self._pending: list[tuple[str | None, Result, Settings]] = []
        self._waited: dict[str | None, float] = {}
        #: The device the measurements are labelled with (``cpu``, ``cuda:0``).
        self.device, self.synced_devices = targets(item, (), {})
        #: The group the results are shown and saved under.
        self.group = group
        self.compare_fail = compare_fail
        #: Saved into every measurement's JSON ``extra_info``.
        self.extra_info: dict[str, Any] = {}
        #: False: never the reference of its group's ratio column (pytest-benchmark's
        #: ``baseline=False``).
        self.baseline = True
        #: A cprofile column: each measured function is profiled once more, after
        #: timing, and its top functions by that column go into the JSON.
        self.cprofile: str | None = None
        #: The last profile (``pstats.Stats``), as pytest-benchmark's.
        self.cprofile_stats: Any = None
        self._profiles: dict[str | None, list[dict[str, Any]]] = {}

    # -- public API -----------------------------------------------------------------

    def __call__(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Time ``fn(*args, **kwargs)`` and return its result."""
        if None in self._results:
            raise RuntimeError(
                "mps_benchmark was already called in this test; give each "
                'measurement a name: mps_benchmark.measure("eager", f)'
            )
        return self._run(None, fn, args, kwargs, None, self._settings)

    def measure(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """Time ``fn(*args, **kwargs)`` as the measurement ``name``; return its result.

        A test may take several; each is reported and readable as ``self[name]``.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"measure: name must be a non-empty string, got {name!r}")
        if name in self._results:
            raise ValueError(f"measure: {name!r} was already measured in this test")
        return self._run(name, fn, args, kwargs, None, self._settings)

    def pedantic(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        setup: Callable[[], Any] | None = None,
        teardown: Callable[..., Any] | None = None,
        rounds: int = 1,
        warmup_rounds: int = 0,
        iterations: int = 1,
        name: str | None = None,
    ) -> Any:
        """Time exactly ``rounds`` x ``iterations`` calls after ``warmup_rounds``.

        ``setup`` runs before every call, off the clock, and may return
        ``(args, kwargs)`` for it; unlike pytest-benchmark it works with
        ``iterations > 1`` (each round's inputs are prepared up front).
        ``teardown(*args, **kwargs)`` runs after each round, off the clock.
        """
        for label, value, low in (
            ("rounds", rounds, 1),
            ("iterations", iterations, 1),
            ("warmup_rounds", warmup_rounds, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"pedantic: {label} must be an integer >= {low}, got {value!r}"
                )
        if name in self._results:
            raise ValueError(f"pedantic: {name!r} was already measured in this test")
        settings = self._settings._replace(
            warmup=warmup_rounds, rounds=rounds, iterations=iterations
        )
        return self._run(
            name, fn, tuple(args), dict(kwargs or {}), setup, settings, teardown
        )

    @property
    def result(self) -> Result:
        """The last measurement: stats, dispatch, events, memory, verdict."""
        if self._last is None:
            raise RuntimeError("mps_benchmark has not measured anything yet")
        return self._last

    @property
    def stats(self) -> Stats:
        """The last measurement's statistics (seconds per call)."""
        return self.result.stats

    @property
    def results(self) -> Mapping[str | None, Result]:
        """Every measurement of this test, by name (None for an unnamed one)."""
        return dict(self._results)

    def __getitem__(self, name: str | None) -> Result:
        return self._results[name]

    # -- internals --------------------------------------------------------------------

    def _run(
        self,
        name: str | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        setup: Callable[[], Any] | None,
        settings: Settings,
        teardown: Callable[..., Any] | None = None,
    ) -> Any:
        if not callable(fn):
            raise TypeError(f"mps_benchmark: {fn!r} is not callable")
        if self.disabled:
            return _run_once(fn, args, kwargs, setup, teardown)
        if self._probe is None:
            # Decided at the first measurement, when the test has made its tensors.
            self.device, self.synced_devices = self._targets(self._item, args, kwargs)
            self._probe = make_probe(self._item.config, self.synced_devices)
        from pytest_mps.benchmark import baton as ab_baton
        from pytest_mps.benchmark.confirm import ATTEMPTS

        turns = ab_baton.current()
        attempts = 0
        while True:
            # garbage collected here, outside the lock: measure() need not again
            release_memory(self.synced_devices)
            if turns is not None:
                turns.take()
            with measuring(self._lock) as waited:
                result, value = measure(
                    fn,
                    args,
                    kwargs,
                    setup=setup,
                    teardown=teardown,
                    probe=self._probe,
                    settings=settings,
                    collect=False,
                )
            attempts += 1
            self._waited[name] = self._waited.get(name, 0.0) + waited
            if self._gate is None or attempts == ATTEMPTS:
                break
            if not self._gate(self._entry(name, result, settings)):
                break
        self._attempts[name] = attempts
        if turns is not None:
            self._blocks[name] = self._measure_blocks(
                turns, result, fn, args, kwargs, setup, teardown, settings
            )
        self._results[name] = result
        self._last = result
        self._pending.append((name, result, settings))
        if self.cprofile is not None:
            self._profile(name, fn, args, kwargs, setup, teardown)
        return value

    def _measure_blocks(
        self,
        turns: Any,
        result: Result,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        setup: Callable[[], Any] | None,
        teardown: Callable[..., Any] | None,
        settings: Settings,
    ) -> list[float]:
        """Short blocks of rounds, each in a turn of the A/B gate (:mod:`.baton`).

        Each block times the main measurement's iterations for about
        :data:`.baton.BLOCK_TIME`; its median is paired with the other side's
        block of the same index, measured just before or after it.
        """
        from pytest_mps.benchmark import baton as ab_baton

        iterations = result.stats.iterations
        per_round = max(result.stats.median * iterations, 1e-9)
        rounds = max(3, min(1000, round(ab_baton.BLOCK_TIME / per_round)))
        medians = []
        for _ in range(ab_baton.BLOCKS):
            turns.take()
            with turns.pinned(), measuring(self._lock):
                medians.append(
                    time_block(
                        fn,
                        args,
                        kwargs,
                        iterations=iterations,
                        rounds=rounds,
                        setup=setup,
                        teardown=teardown,
                        probe=self._probe,
                        settings=settings,
                    )
                )
        return medians

    def _profile(
        self,
        name: str | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        setup: Callable[[], Any] | None,
        teardown: Callable[..., Any] | None,
    ) -> None:
        """One more call of ``fn`` under cProfile, off the clock."""
        import cProfile
        import functools
        import pstats

        profile = cProfile.Profile()
        _run_once(functools.partial(profile.runcall, fn), args, kwargs, setup, teardown)
        stats = pstats.Stats(profile)
        self.cprofile_stats = stats
        self._profiles[name] = cprofile_rows(stats, self.cprofile or "cumtime")

    def flush(self) -> None:
        """Put the measurements on ``item.user_properties`` for the call report.

        Called as the report is made, so ``extra_info`` set after a measurement
        is saved with it, as in pytest-benchmark.
        """
        for name, result, settings in self._pending:
            entry = self._entry(name, result, settings)
            self._item.user_properties.append((PROPERTY, json.dumps(entry)))
        self._pending.clear()

    def _entry(self, name: str | None, result: Result, settings: Settings) -> Any:
        item = self._item
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec is not None else {}
        param_id = callspec.id if callspec is not None else None
        original = getattr(item, "originalname", item.name)
        rest = [p for p in (param_id or "").split("-") if p and p != self.device]
        if "device" not in params:
            rest = (param_id or "").split("-") if param_id else []
        base = original + (f"[{'-'.join(rest)}]" if rest else "")
        suffix = f"::{name}" if name is not None else ""
        hw, capability = hardware(self.device)
        on_emulated = emulated(item.config) and "mps" in self.device.split("+")
        if on_emulated:
            hw = f"{cpu_name()} (MPS emulated by pytest-mps: CPU times)"
        extra = {k: _jsonable(v) for k, v in self.extra_info.items()}
        extra.update(result.extra_info())
        if name in self._blocks:
            extra["ab_blocks"] = self._blocks[name]
        if self._gate is not None:
            extra["gate_attempts"] = self._attempts.get(name, 1)
        extra.update(
            lock_wait=self._waited.get(name, 0.0),
            device=self.device,
            hardware=hw,
            capability=capability,
            base_name=base + suffix,
            label=name,
        )
        if on_emulated:
            extra["emulated"] = True
        profile = self._profiles.get(name)
        return {
            **({"cprofile": profile} if profile is not None else {}),
            "group": self.group,
            "name": item.name + suffix,
            "fullname": item.nodeid + suffix,
            "params": {k: _jsonable(v) for k, v in params.items()} or None,
            "param": param_id,
            "extra_info": extra,
            "options": {
                "min_time": settings.min_time,
                "max_time": settings.max_time,
                "min_rounds": settings.min_rounds,
                "warmup": settings.warmup,
                "timer": "perf_counter, device synced",
                "disable_gc": settings.disable_gc,
                "precision": settings.precision,
                "compare_fail": list(self.compare_fail) or None,
                "baseline": self.baseline,
            },
            # Past MAX_DATA rounds the report (and junitxml's properties) keep
            # a uniform sample of the rounds; the statistics cover them all.
            "stats": _finite(result.stats.as_dict(MAX_DATA)),
        }


def cprofile_rows(stats: Any, column: str, top: int = 25) -> list[dict[str, Any]]:
    """The ``top`` functions of a ``pstats.Stats`` by ``column``.

    The rows are pytest-benchmark's JSON ``cprofile`` rows.
    """
    rows = []
    for (path, line, func), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append(
            {
                "ncalls_recursion": f"{nc}/{cc}" if nc != cc else str(nc),
                "ncalls": nc,
                "tottime": tt,
                "tottime_per": tt / nc if nc else 0.0,
                "cumtime": ct,
                "cumtime_per": ct / nc if nc else 0.0,
                "function_name": f"{path}:{line}({func})",
            }
        )
    if column == "function_name":
        rows.sort(key=lambda r: str(r["function_name"]))
    elif column == "ncalls_recursion":
        rows.sort(key=lambda r: -int(r["ncalls"]))
    else:
        rows.sort(key=lambda r: -float(r[column]))
    return rows[:top]


def _run_once(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    setup: Callable[[], Any] | None,
    teardown: Callable[..., Any] | None,
) -> Any:
    """One untimed call, as a plain test runs it (--mps-benchmark-disable)."""
    if setup is not None:
        made = setup()
        if made is not None:
            args, kwargs = tuple(made[0]), dict(made[1])
    value = fn(*args, **kwargs)
    if teardown is not None:
        teardown(*args, **kwargs)
    return value


def _finite(stats: dict[str, Any]) -> dict[str, Any]:
    # JSON has no inf/nan; an empty round could only come from a broken clock.
    return {
        k: (0.0 if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in stats.items()
    }
