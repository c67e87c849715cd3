"""Sync-aware benchmarks: the front door (options, marker, fixture).

A run that asks for benchmarks (an ``mps_benchmark`` option or ini setting,
xdist's controller, a test that takes our ``mps_benchmark`` fixture or marker)
registers :mod:`.hooks`, which wires the rest into pytest; any other run pays
only for this module and the flags at start-up.

The measuring is in :mod:`.timer`, option values in :mod:`.options` and their
flags in :mod:`.flags`, the fixture's object in :mod:`.fixture` (made by
:mod:`.targets`), the cross-process lock in :mod:`.lock`, files in
:mod:`.storage`, baselines in :mod:`.baseline` and :mod:`.compare`, tables in
:mod:`.report`, plots in :mod:`.plot`, pytest-benchmark's ``benchmark`` alias
in :mod:`.alias`, and the session's side in :mod:`.session`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import pytest

from pytest_mps import ownership
from pytest_mps.benchmark.flags import add_options

if TYPE_CHECKING:
    from pytest_mps.benchmark.fixture import MpsBenchmark

MARKER = (
    "mps_benchmark(group=None, warmup=None, rounds=None, min_time=None, "
    "max_time=None, compare_fail=None): options of this test's mps_benchmark "
    "(warmup: True/False/rounds; times in seconds; compare_fail: 'median:10%')."
)
HOOKS = "pytest_mps.benchmark.hooks"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


# startup.py calls this last: the hooks' configure runs after devices.py's
def pytest_configure(config: pytest.Config) -> None:
    ownership.register_markers(config, MARKER)
    # xdist's controller collects nothing but reads every worker's results
    if ownership.opted_in(config, "mps_benchmark") or (
        config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput")
    ):
        ownership.register_hooks(config, HOOKS)


def _asks(item: pytest.Item) -> bool:
    return ownership.uses_fixture(item, "mps_benchmark", mps_benchmark) or (
        ownership.closest_marker(item, "mps_benchmark") is not None
    )


# startup.py calls this first
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    if any(_asks(item) for item in items):
        ownership.register_hooks_at_collection(config, HOOKS, items)


@pytest.fixture
def mps_benchmark(request: pytest.FixtureRequest) -> Generator[MpsBenchmark]:
    """Time a callable honestly on CPU, CUDA or MPS: the device queue is drained.

    ``mps_benchmark(fn, *args)`` returns ``fn``'s result; ``.measure(name, fn)``
    takes several named measurements; ``.pedantic(...)`` fixes rounds and
    iterations; ``.stats`` holds the last one's min, median, iqr, ... in seconds.
    """
    from pytest_mps.benchmark.targets import finish_benchmark, new_benchmark

    bench = new_benchmark(request.node)
    yield bench
    finish_benchmark(bench)
