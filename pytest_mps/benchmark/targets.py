"""Which devices a benchmark syncs, and making the fixtures' objects.

Shared by ``mps_benchmark`` (:mod:`.plugin`) and the ``benchmark`` alias
(:mod:`.alias`); imported once a test asks for either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from pytest_mps import devices as session_devices
from pytest_mps.benchmark.fixture import MpsBenchmark
from pytest_mps.benchmark.keys import (
    BenchmarkMark,
    fixture_key,
    mark_key,
    options_key,
    original_devices_key,
)
from pytest_mps.benchmark.lock import lock_path
from pytest_mps.benchmark.probe import release_memory


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


def new_benchmark(
    item: pytest.Item,
    make: Callable[..., MpsBenchmark] = MpsBenchmark,
    alias: dict[str, Any] | None = None,
) -> MpsBenchmark:
    """The object a benchmark fixture yields, its settings merged.

    Precedence: ``mps_benchmark`` marker > pytest-benchmark's ``benchmark``
    marker (``alias``, under --mps-benchmark-alias) > command line > ini.
    """
    options = item.config.stash[options_key]
    mark = item.stash.get(mark_key, None) or BenchmarkMark()
    settings = options.settings
    alias = alias or {}
    for key in ("min_time", "max_time", "min_rounds", "warmup", "disable_gc"):
        if key in alias:
            settings = settings._replace(**{key: alias[key]})
    if "precision" in alias:
        settings = settings._replace(precision=alias["precision"])
    if "timer" in alias:
        settings = settings._replace(timer=alias["timer"])
    settings = settings._replace(
        warmup=settings.warmup if mark.warmup is None else mark.warmup,
        rounds=mark.rounds,
        min_time=mark.min_time or settings.min_time,
        max_time=mark.max_time or settings.max_time,
    )
    bench = make(
        item,
        settings,
        sync_targets,
        mark.group or alias.get("group"),
        mark.compare_fail,
        lock=lock_path(options.lock),
        disabled=options.disable,
        gate=_gate(item.config),
    )
    if alias.get("baseline") is False:
        bench.baseline = False
    if options.cprofile is not None:
        bench.cprofile = options.cprofile
    elif alias.get("cprofile"):
        bench.cprofile = "cumtime"
    item.stash.setdefault(fixture_key, []).append(bench)
    return bench


_gate_key = pytest.StashKey[Any]()


def _gate(config: pytest.Config) -> Callable[[Any], bool] | None:
    """The session's gate for one measurement, when the run compares.

    Thresholds come from ``--mps-benchmark-compare-fail`` or a benchmark's own
    marker; without either, nothing regresses and nothing is measured again.
    """
    options = config.stash[options_key]
    if options.compare is None:
        return None
    gate = config.stash.get(_gate_key, None)
    if gate is None:
        from pytest_mps.benchmark.confirm import Gate

        gate = config.stash[_gate_key] = Gate(options)
    regressed: Callable[[Any], bool] = gate.regressed
    return regressed


def finish_benchmark(bench: MpsBenchmark) -> None:
    """Hand back what the test's measurements left on the devices.

    On the CPU there is nothing to hand back, and the next measurement collects
    garbage first anyway: no full collection here (0.15 s with torch imported).
    """
    if any(device != "cpu" for device in bench.synced_devices):
        release_memory(bench.synced_devices)
