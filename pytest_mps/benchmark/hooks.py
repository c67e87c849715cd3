"""Sync-aware benchmarks: the hooks, registered by :mod:`.plugin` once a run asks.

This module wires the family into pytest: the options read once, the extra
devices, the gate, the alias, the session's side (:mod:`.session`), the marker
parsed, the A/B run. Results travel on ``report.user_properties``, so the
controller of an xdist run sees every worker's.
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import devices as session_devices
from pytest_mps import ownership
from pytest_mps.benchmark.keys import (
    BenchmarkMark,
    fixture_key,
    mark_error_key,
    mark_key,
    options_key,
    original_devices_key,
    session_key,
)
from pytest_mps.benchmark.options import (
    mark_kwargs,
)
from pytest_mps.benchmark.reading import read_options
from pytest_mps.benchmark.records import BenchmarkOptions, parse_fail_expr

if TYPE_CHECKING:
    import torch

_MARK_ARGS = ("group", "warmup", "rounds", "min_time", "max_time", "compare_fail")
ALIAS_MODULE = "pytest_mps.benchmark.alias"


@functools.cache
def _torch_device(name: str) -> torch.device:
    import torch

    return torch.device(name)


@pytest.hookimpl(trylast=True)
def pytest_mps_synchronize(device: str) -> bool | None:
    if device == "cpu":
        return True
    from pytest_mps import accelerator

    accelerator.synchronize(_torch_device(device))
    return True


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    options = read_options(config)
    config.stash[options_key] = options
    # --mps-benchmark-devices adds devices to the session's list so the 'device'
    # fixture is parametrized over them; collection then keeps the extra ones
    # for benchmarks only. Runs after devices.py's configure (trylast).
    current: list[str] = config.stash[session_devices.devices_key]
    chosen = list(current)
    config.stash[original_devices_key] = list(chosen)
    if options.devices:
        for device in options.devices:
            session_devices.check_usable(device, "--mps-benchmark-devices")
        extended = chosen + [d for d in options.devices if d not in chosen]
        config.stash[session_devices.devices_key] = extended
    if not hasattr(config, "workerinput"):
        _check_gate(config, options)
    if options.alias:
        _register_alias(config)
    from pytest_mps.benchmark.session import BenchmarkSession

    plugin = BenchmarkSession(config, options)
    config.stash[session_key] = plugin
    config.pluginmanager.register(plugin, "mps-benchmark-session")


def _check_gate(config: pytest.Config, options: BenchmarkOptions) -> None:
    """Compare-fail without a usable baseline is a usage error (exit 4).

    What can be known before the tests run is checked here; the machine's own
    folder is known once the benchmarks have run (the session checks it).
    """
    if options.compare_rev is not None:
        if config.getoption("numprocesses", None):
            raise pytest.UsageError(
                "--mps-benchmark-compare-rev runs its processes one at a time: "
                "leave out -n (or pass -n 0)"
            )
        from pytest_mps.benchmark import ab

        if not hasattr(config, "workerinput"):
            setting = (
                "--mps-benchmark-compare-rev"
                if config.getoption("mps_benchmark_compare_rev")
                else f"ini option mps_benchmark_compare_rev in {config.inipath}"
            )
            try:
                ab.check_repository(Path(config.invocation_params.dir), setting)
            except ab.ABError as exc:
                raise pytest.UsageError(str(exc)) from None
        return  # compare-fail's median:X% is the A/B's floor
    if not options.compare_fail:
        return
    flag = config.getoption("mps_benchmark_compare_fail")
    if options.compare is None:
        if flag:
            raise pytest.UsageError(
                "--mps-benchmark-compare-fail needs a baseline: add "
                "--mps-benchmark-compare [RUN]"
            )
        return  # the ini's thresholds apply only when comparing
    from pytest_mps.benchmark import baseline

    try:
        baseline.check_any_baseline(options.storage, options.compare or None)
    except baseline.BaselineError as exc:
        raise pytest.UsageError(
            f"--mps-benchmark-compare-fail needs a baseline: {exc}"
        ) from None


_ab_key = pytest.StashKey[Any]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """Under --mps-benchmark-compare-rev: the A/B processes instead of the tests."""
    config = session.config
    options = config.stash.get(options_key, None)
    if options is None or options.compare_rev is None:
        return None
    if hasattr(config, "workerinput") or session.config.option.collectonly:
        return None
    from pytest_mps.benchmark import ab

    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    try:
        report = ab.run(
            options.compare_rev,
            options.compare_processes,
            ab.floor_of(options.compare_fail),
            config.invocation_params.args,
            Path(config.invocation_params.dir),
            progress,
        )
    except ab.ABError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_ab_key] = report
    if options.json is not None:
        from pytest_mps.benchmark.storage import write_atomic

        write_atomic(options.json, report.as_dict())
    if report.failed:
        session.testsfailed += 1
    if reporter is not None:
        # pytest's last line counts them ("1 slower, 2 same in 40.2s"), not
        # "no tests ran"
        from pytest_mps.benchmark.session import Regressed

        for outcome in report.outcomes:
            reporter.stats.setdefault(outcome.verdict, []).append(
                Regressed(outcome.name, outcome.verdict)
            )
    return True


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash.get(_ab_key, None)
    if report is None:
        return
    terminalreporter.write_sep("-", "pytest-mps A/B comparison")
    for line in report.lines():
        terminalreporter.write_line(line)


def _register_alias(config: pytest.Config) -> None:
    """Give tests pytest-benchmark's ``benchmark`` fixture, timed by us."""
    import importlib

    if not config.pluginmanager.hasplugin("benchmark"):
        ownership.register_markers(config, importlib.import_module(ALIAS_MODULE).MARKER)
    if config.pluginmanager.get_plugin(ALIAS_MODULE) is None:
        # Registered after every installed plugin, so pytest hands tests our
        # fixture rather than pytest-benchmark's (the last parsed wins).
        config.pluginmanager.register(
            importlib.import_module(ALIAS_MODULE), ALIAS_MODULE
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    options = config.stash.get(options_key, None)
    workers = config.getoption("numprocesses", None)
    if (
        options is None
        or not isinstance(workers, int)
        or not ownership.opted_in(config)
    ):
        return []
    from pytest_mps.benchmark.lock import header_line

    line = header_line(options.lock, workers)
    return [f"pytest-mps {line}"] if line else []


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.stash.get(session_key, None)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)
        del config.stash[session_key]
    alias = config.pluginmanager.get_plugin(ALIAS_MODULE)
    if alias is not None:
        config.pluginmanager.unregister(alias)


# -- the marker ---------------------------------------------------------------------


def parse_mark(mark: pytest.Mark, nodeid: str) -> BenchmarkMark:
    """Validate ``@pytest.mark.mps_benchmark``; ValueError naming the test."""
    where = f"@pytest.mark.mps_benchmark on {nodeid}"
    kw = mark_kwargs(mark.args, mark.kwargs, where, _MARK_ARGS)
    group = kw.get("group")
    if group is not None and not isinstance(group, str):
        raise ValueError(f"{where}: group must be a string, got {group!r}")
    warmup = kw.get("warmup")
    if warmup is not None and not (
        isinstance(warmup, bool) or (isinstance(warmup, int) and warmup >= 0)
    ):
        raise ValueError(
            f"{where}: warmup must be True, False or a number of rounds >= 0, "
            f"got {warmup!r}"
        )
    rounds = kw.get("rounds")
    if rounds is not None and (
        isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1
    ):
        raise ValueError(f"{where}: rounds must be an integer >= 1, got {rounds!r}")
    times: dict[str, float | None] = {}
    for key in ("min_time", "max_time"):
        value = kw.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < value < float("inf")
        ):
            raise ValueError(
                f"{where}: {key} must be a positive number of seconds, got {value!r}"
            )
        times[key] = None if value is None else float(value)
    fail = kw.get("compare_fail")
    texts: tuple[str, ...] = ()
    if fail is not None:
        texts = (fail,) if isinstance(fail, str) else tuple(fail)
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(f"{where}: compare_fail must be strings, got {text!r}")
            parse_fail_expr(text, f"{where}: compare_fail")
    return BenchmarkMark(
        group, warmup, rounds, times["min_time"], times["max_time"], texts
    )


def _is_benchmark(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    if "mps_benchmark" in names:
        return True
    return "benchmark" in names and item.config.stash[options_key].alias


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    options = config.stash[options_key]
    original = config.stash[original_devices_key]
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        mark = ownership.closest_marker(item, "mps_benchmark")
        if mark is not None:
            try:
                item.stash[mark_key] = parse_mark(mark, item.nodeid)
            except ValueError as exc:
                item.stash[mark_error_key] = str(exc)
        callspec = getattr(item, "callspec", None)
        device = callspec.params.get("device") if callspec is not None else None
        if options.devices and isinstance(device, str):
            wanted = options.devices if _is_benchmark(item) else original
            if device not in wanted:
                dropped.append(item)
                continue
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    error = item.stash.get(mark_error_key, None)
    if error is not None:
        pytest.fail(error, pytrace=False)
    options = item.config.stash[options_key]
    if options.only and not _is_benchmark(item):
        pytest.skip("not a benchmark (--mps-benchmark-only)")
    if options.skip and _is_benchmark(item):
        pytest.skip("benchmarks are skipped (--mps-benchmark-skip)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    if call.when == "call":
        for bench in item.stash.get(fixture_key, []):
            bench.flush()
    return (yield)
