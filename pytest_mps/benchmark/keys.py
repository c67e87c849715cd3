"""The benchmark family's stash keys and parsed marker, shared without cycles.

Light on purpose: the front door (:mod:`.plugin`) imports it at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from pytest_mps.benchmark.records import BenchmarkOptions

if TYPE_CHECKING:
    from pytest_mps.benchmark.fixture import MpsBenchmark


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
#: The benchmark objects a test made (mps_benchmark, and benchmark under the alias).
fixture_key: pytest.StashKey[list[MpsBenchmark]] = pytest.StashKey()
#: The session's devices before --mps-benchmark-devices added to them.
original_devices_key = pytest.StashKey[list[str]]()
