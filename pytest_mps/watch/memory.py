"""``@pytest.mark.mps_memory(max_mb=..., leak_mb=...)`` and the ``mps_memory`` fixture.

Reports what a test's body allocated on its device at its peak and what it
left allocated, and fails the test over budget. The peak comes from the best
source the installed torch offers, and the report names it:
``torch.accelerator.memory_stats`` where it keeps a peak (CUDA; MPS from torch
2.15, pytorch#186748), ``torch.cuda.max_memory_allocated`` on an older CUDA
torch; on an older MPS torch, which keeps no peak, ``current_allocated_memory``
sampled before each aten op (the test's watch mode). On MPS the report also
shows the three limits and what moves each (:func:`pytest_mps.machine.
fingerprint.limits_explained`). CPU: not measured, and said so, rather than
printing zeros (nanochat#838).
"""

from __future__ import annotations

import gc
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from pytest_mps import accelerator, ownership
from pytest_mps.devices import devices_key
from pytest_mps.watch import settings
from pytest_mps.watch.attribution import plugin_work

if TYPE_CHECKING:
    from pytest_mps.watch import OpCallback

MIB = 1024 * 1024


class MemoryMark(NamedTuple):
    """The parsed ``mps_memory`` marker."""

    max_mb: float | None = None
    leak_mb: float | None = None


class MemoryUsage:
    """What the test body allocated on ``device``, filled in when its call ends.

    ``device`` (``"cuda:0"``), ``measured`` (False on the CPU), ``peak_mb`` and
    ``left_mb`` (MiB above the start; None until measured); in bytes,
    ``start``, ``peak`` and ``end``, and ``extra`` (the driver's and the
    allocator's own counters).
    """

    def __init__(self, device: str, measured: bool) -> None:
        self.device = device
        self.measured = measured
        self.start = 0
        self.peak: int | None = None
        self.end: int | None = None
        self.extra: dict[str, int] = {}
        #: where the peak comes from: an allocator's counter, or sampling
        self.source: str | None = None
        #: on MPS, the three limits and what moves each
        self.limits: str | None = None
        #: True where the peak is sampled before each op (MPS before torch 2.15)
        self.sampled = False

    @property
    def peak_mb(self) -> float | None:
        """Peak allocation above the start, in MiB."""
        return None if self.peak is None else (self.peak - self.start) / MIB

    @property
    def left_mb(self) -> float | None:
        """Allocated at the end minus at the start, in MiB."""
        return None if self.end is None else (self.end - self.start) / MIB

    def __repr__(self) -> str:
        if self.measured and self.end is None:
            return f"MemoryUsage({self.device}: measured when the test's call ends)"
        return f"MemoryUsage({self.summary()})"

    def summary(self) -> str:
        """``cuda:0: peak +1.0 MiB, left allocated +0.0 MiB``."""
        if not self.measured:
            return (
                f"{self.device}: memory not measured (PyTorch keeps no allocator "
                "statistics for the CPU)"
            )
        peak = "n/a" if self.peak_mb is None else f"+{self.peak_mb:.1f} MiB"
        left = "n/a" if self.left_mb is None else f"{self.left_mb:+.1f} MiB"
        text = f"{self.device}: peak {peak}, left allocated {left}"
        for name, value in self.extra.items():
            text += f", {name} {value / MIB:.1f} MiB"
        return text

    def details(self) -> list[str]:
        """Where the peak comes from, and on MPS the limits."""
        lines = [f"peak from {self.source}"] if self.source else []
        if self.limits:
            lines.append(self.limits)
        return lines


#: The source of an MPS peak where torch keeps none.
SAMPLED = (
    "sampling torch.mps.current_allocated_memory() before each op (this torch "
    "keeps no MPS peak; torch.accelerator's statistics from 2.15)"
)

mark_key = pytest.StashKey[MemoryMark | None]()
usage_key = pytest.StashKey[MemoryUsage]()


def _number(mark: pytest.Mark, name: str, nodeid: str) -> float | None:
    value = mark.kwargs.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(
            f"@pytest.mark.mps_memory on {nodeid}: {name}={value!r} is not a "
            "number of MiB >= 0"
        )
    return float(value)


def memory_mark(item: pytest.Item) -> MemoryMark | None:
    """The test's parsed ``mps_memory`` marker (cached), or None."""
    if mark_key in item.stash:
        return item.stash[mark_key]
    mark = ownership.closest_marker(item, "mps_memory")
    parsed = None
    if mark is not None:
        extra = set(mark.kwargs) - {"max_mb", "leak_mb"}
        if mark.args or extra:
            raise ValueError(
                f"@pytest.mark.mps_memory on {item.nodeid}: takes only max_mb= and "
                f"leak_mb=, got {', '.join(map(repr, mark.args)) or ''}"
                f"{', '.join(sorted(extra))}"
            )
        parsed = MemoryMark(
            _number(mark, "max_mb", item.nodeid), _number(mark, "leak_mb", item.nodeid)
        )
    item.stash[mark_key] = parsed
    return parsed


def _wanted(item: pytest.Item) -> bool:
    try:
        return memory_mark(item) is not None or "mps_memory" in getattr(
            item, "fixturenames", ()
        )
    except ValueError:
        return True


def _device(item: pytest.Item) -> Any:
    import torch

    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("device") is not None:
        return torch.device(str(callspec.params["device"]))
    devices = item.config.stash.get(devices_key, None) or ["cpu"]
    return torch.device(devices[0])


def _allocated(device: Any) -> int:
    stats = accelerator.memory_stats(device) or {}
    return int(stats.get("allocated", 0))


class _MpsPeak:
    """Samples MPS allocated memory before each op: MPS has no peak counter."""

    def __init__(self, usage: MemoryUsage, device: Any) -> None:
        self.usage = usage
        self.device = device

    def __call__(self, func: Any, args: Any, kwargs: Mapping[str, Any]) -> None:
        """Raise the recorded peak to the allocation now."""
        now = _allocated(self.device)
        if self.usage.peak is None or now > self.usage.peak:
            self.usage.peak = now


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # before fixtures are set up, so the mps_memory fixture finds the usage
    if not _wanted(item):
        return
    try:
        memory_mark(item)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    device = _device(item)
    measured = accelerator.memory_stats(device) is not None
    usage = MemoryUsage(str(device), measured)
    # MPS starts with torch; CUDA's counters are empty until it starts, so
    # the source is named when the call ends
    usage.sampled = device.type == "mps" and accelerator.peak_source(device) is None
    if device.type == "mps":
        from pytest_mps.machine.fingerprint import limits_explained
        from pytest_mps.machine.hooks import fingerprint

        usage.limits = limits_explained(fingerprint(item.config))
    item.stash[usage_key] = usage


def pytest_mps_watch_ops(item: pytest.Item) -> OpCallback | None:
    usage = item.stash.get(usage_key, None)
    if usage is None or not usage.sampled:
        return None
    return _MpsPeak(usage, _device(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    usage = item.stash.get(usage_key, None)
    if usage is None or not usage.measured:
        return (yield)
    device = _device(item)
    # the probes are the plugin's own work: never a finding of the test's
    with plugin_work():
        gc.collect()
        accelerator.synchronize(device)
        usage.start = _allocated(device)
        has_peak = accelerator.reset_peak_memory(device)
    if not has_peak:
        usage.peak = usage.start
    try:
        result = yield
    finally:
        with plugin_work():
            gc.collect()
            accelerator.synchronize(device)
            stats = accelerator.memory_stats(device) or {}
        usage.end = int(stats.get("allocated", 0))
        if has_peak:
            usage.peak = int(stats.get("peak_allocated", usage.end))
        else:
            usage.peak = max(usage.peak or 0, usage.end)
        usage.extra = {
            k: v for k, v in stats.items() if k in ("driver_allocated", "reserved")
        }
        usage.source = SAMPLED if usage.sampled else accelerator.peak_source(device)
    _check_budget(item, usage)
    return result


def _check_budget(item: pytest.Item, usage: MemoryUsage) -> None:
    mark = memory_mark(item)
    if mark is None:
        return
    over = []
    if mark.max_mb is not None and (usage.peak_mb or 0.0) > mark.max_mb:
        over.append(f"peak {usage.peak_mb:.1f} MiB > max_mb={mark.max_mb:g}")
    if mark.leak_mb is not None and (usage.left_mb or 0.0) > mark.leak_mb:
        over.append(
            f"left allocated {usage.left_mb:.1f} MiB > leak_mb={mark.leak_mb:g}"
        )
    if over:
        pytest.fail(
            f"over the memory budget on {usage.device}: {'; '.join(over)}",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    usage = item.stash.get(usage_key, None)
    if usage is None or call.when != "call":
        return report
    report.sections.append(
        ("pytest-mps memory", "\n".join([usage.summary(), *usage.details()]))
    )
    report.user_properties.append(
        (
            settings.MEMORY_PROPERTY,
            {
                "device": usage.device,
                "measured": usage.measured,
                "peak_mb": usage.peak_mb,
                "left_mb": usage.left_mb,
                "source": usage.source,
                "limits": usage.limits,
            },
        )
    )
    return report
