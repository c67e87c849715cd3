"""The benchmark family's records: settings, thresholds, table layout, options.

Apart from :mod:`.options` because creating a NamedTuple class costs 0.1-0.4 ms
at import, and a run that asks for no benchmark imports only the options'
parsers (at start-up, through :mod:`.flags`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from pytest_mps.benchmark.options import (
    COMPARE_PROCESSES,
    DEFAULT_COLUMNS,
    STATS,
)

_FAIL_EXPR = re.compile(r"^(min|max|mean|median):(\d+(?:\.\d*)?|\.\d+)(%?)$")


class Settings(NamedTuple):
    """What a measurement may spend; the fixture fills it from marker and options."""

    warmup: bool | int = True
    rounds: int | None = None
    iterations: int | None = None
    min_time: float = 5e-6
    max_time: float = 1.0
    min_rounds: int = 5
    #: Stop once the 95% confidence interval of the median is within this
    #: fraction of it (bounded by min_rounds and max_time); None: fixed rounds.
    precision: float | None = None
    #: Garbage collection off while timing (pytest-benchmark's --benchmark-disable-gc).
    disable_gc: bool = False
    #: Consecutive warmup windows whose medians differ by less than this are stable.
    stable_tolerance: float = 0.05
    #: Device events and wall time further apart than this disagree.
    events_tolerance: float = 0.10
    #: The clock, in seconds; None: time.perf_counter (pytest-benchmark's timer=).
    timer: Callable[[], float] | None = None


class FailExpr(NamedTuple):
    """``median:10%`` (relative) or ``min:0.001`` (absolute seconds)."""

    stat: str
    amount: float
    percent: bool

    def __str__(self) -> str:
        return f"{self.stat}:{self.amount:g}{'%' if self.percent else ''}"

    def limit(self, baseline: float) -> float:
        """The slowest value that still passes, in seconds."""
        extra = baseline * self.amount / 100 if self.percent else self.amount
        return baseline + extra


def parse_fail_expr(text: str, where: str) -> FailExpr:
    """Parse one compare-fail expression; ValueError naming ``where`` otherwise."""
    match = _FAIL_EXPR.match(text.strip())
    if match is None:
        raise ValueError(
            f"{where}: {text!r} is not a threshold; use STAT:N% or STAT:SECONDS "
            f"with STAT one of {', '.join(STATS)} (e.g. median:10%)"
        )
    return FailExpr(match.group(1), float(match.group(2)), bool(match.group(3)))


class Table(NamedTuple):
    """How the results table is laid out."""

    columns: tuple[str, ...] = DEFAULT_COLUMNS
    #: True when the columns were chosen: then none is added or dropped.
    chosen: bool = False
    sort: str = "name"
    group_by: tuple[str, ...] = ("group",)
    name: str = "normal"
    time_unit: str = "auto"


class BenchmarkOptions(NamedTuple):
    """The session's benchmark options, validated once."""

    only: bool
    skip: bool
    json: Path | None
    save: str | None
    autosave: bool
    save_data: bool
    compare: str | None
    compare_fail: tuple[FailExpr, ...]
    devices: tuple[str, ...]
    storage: Path
    settings: Settings
    #: "auto" (a lock per user in the temp folder), "off", or a lock file.
    lock: str = "auto"
    alias: bool = False
    disable: bool = False
    table: Table = Table()
    histogram: Path | None = None
    #: Profile each benchmarked function once more, top functions by this column.
    cprofile: str | None = None
    #: A git revision to measure beside this tree in alternating processes.
    compare_rev: str | None = None
    compare_processes: int = COMPARE_PROCESSES
    #: "warn" or "refuse" when the baseline's machine fingerprint differs.
    compare_machine: str = "warn"
