"""Sync-aware benchmarks: options, the ``mps_benchmark`` marker and fixture.

The measuring is in :mod:`.timer`, options in :mod:`.options`, the fixture's
object in :mod:`.fixture`, files in :mod:`.storage`, tables in :mod:`.report`
and the session's side in :mod:`.session`; this module wires them into pytest. Results
travel on ``report.user_properties``, so the controller of an xdist run sees
every worker's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from pytest_mps import devices as session_devices
from pytest_mps import ownership
from pytest_mps.benchmark.options import (
    BenchmarkOptions,
    add_options,
    parse_fail_expr,
    read_options,
)

if TYPE_CHECKING:
    import torch

    from pytest_mps.benchmark.fixture import MpsBenchmark

MARKER = (
    "mps_benchmark(group=None, warmup=None, rounds=None, min_time=None, "
    "max_time=None, compare_fail=None): options of this test's mps_benchmark "
    "(warmup: True/False/rounds; times in seconds; compare_fail: 'median:10%')."
)
_MARK_ARGS = ("group", "warmup", "rounds", "min_time", "max_time", "compare_fail")


class BenchmarkMark(NamedTuple):
    """A parsed ``@pytest.mark.mps_benchmark``."""

    group: str | None = None
    warmup: bool | int | None = None
    rounds: int | None = None
    min_time: float | None = None
    max_time: float | None = None
    compare_fail: tuple[str, ...] = ()


options_key = pytest.StashKey[BenchmarkOptions]()
mark_key = pytest.StashKey[BenchmarkMark]()
mark_error_key = pytest.StashKey[str]()
session_key = pytest.StashKey[Any]()
fixture_key: pytest.StashKey[MpsBenchmark] = pytest.StashKey()
#: The session's devices before --mps-benchmark-devices added to them.
original_devices_key = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


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
    ownership.register_markers(config, MARKER)
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
    from pytest_mps.benchmark.session import BenchmarkSession

    plugin = BenchmarkSession(config, options)
    config.stash[session_key] = plugin
    config.pluginmanager.register(plugin, "mps-benchmark-session")


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.stash.get(session_key, None)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)
        del config.stash[session_key]


# -- the marker ---------------------------------------------------------------------


def parse_mark(mark: pytest.Mark, nodeid: str) -> BenchmarkMark:
    """Validate ``@pytest.mark.mps_benchmark``; ValueError naming the test."""
    where = f"@pytest.mark.mps_benchmark on {nodeid}"
    if mark.args:
        raise ValueError(f"{where}: takes keyword arguments only, got {mark.args!r}")
    unknown = sorted(set(mark.kwargs) - set(_MARK_ARGS))
    if unknown:
        raise ValueError(
            f"{where}: unexpected argument(s) {unknown}; "
            f"allowed: {', '.join(_MARK_ARGS)}"
        )
    kw = mark.kwargs
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
    return "mps_benchmark" in getattr(item, "fixturenames", ())


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
    bench = item.stash.get(fixture_key, None)
    if bench is not None and call.when == "call":
        bench.flush()
    return (yield)


# -- the fixture --------------------------------------------------------------------


def _argument_devices(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """Accelerators of the tensors passed to the measured call (one level deep)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    found: list[str] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, dict):
            inner = list(value.values())
        elif isinstance(value, (list, tuple)):
            inner = list(value)
        else:
            inner = [value]
        for leaf in inner:
            if isinstance(leaf, torch.Tensor) and leaf.device.type not in (
                "cpu",
                "meta",
            ):
                name = session_devices.parse_device(str(leaf.device), "")
                if name not in found:
                    found.append(name)
    return found


def sync_targets(
    item: pytest.Item, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, list[str]]:
    """The device a test's measurements are labelled with, and those to sync.

    A test that takes ``device`` is timed on it. Otherwise the label is the
    session's accelerators and those of the tensors passed to the measured call
    (``cpu`` when there are none); each is synced, and CUDA as well once anything
    in the process has started it, so a closure over CUDA tensors on a
    ``--device cpu`` session is still timed honestly.
    """
    callspec = getattr(item, "callspec", None)
    device = callspec.params.get("device") if callspec is not None else None
    if isinstance(device, str):
        return device, [device]
    chosen = [d for d in item.config.stash[original_devices_key] if d != "cpu"]
    chosen += [d for d in _argument_devices(args, kwargs) if d not in chosen]
    label = "+".join(chosen) or "cpu"
    synced = list(chosen) or ["cpu"]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        current = f"cuda:{torch.cuda.current_device()}"
        if current not in synced:
            synced.append(current)
    return label, synced


@pytest.fixture
def mps_benchmark(request: pytest.FixtureRequest) -> Generator[MpsBenchmark]:
    """Time a callable honestly on CPU, CUDA or MPS: the device queue is drained.

    ``mps_benchmark(fn, *args)`` returns ``fn``'s result; ``.measure(name, fn)``
    takes several named measurements; ``.pedantic(...)`` fixes rounds and
    iterations; ``.stats`` holds the last one's min, median, iqr, ... in seconds.
    """
    from pytest_mps.benchmark.fixture import MpsBenchmark, release_memory

    item = request.node
    options = item.config.stash[options_key]
    mark = item.stash.get(mark_key, None) or BenchmarkMark()
    settings = options.settings
    settings = settings._replace(
        warmup=settings.warmup if mark.warmup is None else mark.warmup,
        rounds=mark.rounds,
        min_time=mark.min_time or settings.min_time,
        max_time=mark.max_time or settings.max_time,
    )
    bench = MpsBenchmark(item, settings, sync_targets, mark.group, mark.compare_fail)
    item.stash[fixture_key] = bench
    yield bench
    release_memory(bench.synced_devices)
