"""The watching family's hooks: a test's call phase in one watch mode, the findings.

Registered by :mod:`.plugin` when a watcher, the audit, the project's own
``pytest_mps_watch_ops`` or pytest-xdist's controller needs them. It asks
every ``pytest_mps_watch_ops`` implementation for a callback and runs a test's
call phase inside one watch mode (:mod:`.mode`) when one returns a callback.
It gathers the findings and memory rows of every report (the xdist workers'
too) for the summary and the ``--mps-report`` JSON.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps.watch import settings

if TYPE_CHECKING:
    from pytest_mps.watch import OpCallback


def pytest_configure(config: pytest.Config) -> None:
    sink = config.stash[_sink_key] = _Rows(config)
    config.pluginmanager.register(sink, "pytest-mps-watch-rows")


def _callbacks_for(item: pytest.Item) -> list[OpCallback]:
    found = item.ihook.pytest_mps_watch_ops(item=item)
    return [callback for callback in found if callback is not None]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    callbacks = _callbacks_for(item)
    if not callbacks:
        return (yield)
    from pytest_mps.watch.mode import watching

    with watching(callbacks, every_op=settings.every_op(item.config)):
        return (yield)


# -- what the tests found, gathered where the summary is printed -----------------


class _Rows:
    """The findings and memory rows of every test report, from xdist workers too.

    Registered for each session; the watchers' modules are needed only when
    there is something to summarise.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: dict[str, list[tuple[str, Any]]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name in (settings.FINDINGS_PROPERTY, settings.MEMORY_PROPERTY):
                self.rows.setdefault(name, []).append((report.nodeid, value))

    def pytest_sessionfinish(self) -> None:
        from pytest_mps.report import add_report_section

        findings = self.rows.get(settings.FINDINGS_PROPERTY)
        if findings is not None:
            from pytest_mps.watch.findings import aggregate

            pairs = [(nodeid, row) for nodeid, rows in findings for row in rows]
            add_report_section(self.config, "watch", aggregate(pairs))
        memory = self.rows.get(settings.MEMORY_PROPERTY)
        if memory is not None:
            rows = [{"nodeid": nodeid, **value} for nodeid, value in memory]
            add_report_section(self.config, "memory", rows)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        findings = self.rows.get(settings.FINDINGS_PROPERTY)
        if findings:
            from pytest_mps.watch.findings import write_summary

            pairs = [(nodeid, row) for nodeid, rows in findings for row in rows]
            write_summary(terminalreporter, pairs)


_sink_key = pytest.StashKey[_Rows]()


def pytest_unconfigure(config: pytest.Config) -> None:
    sink = config.stash.get(_sink_key, None)
    if sink is not None:
        config.pluginmanager.unregister(sink)
        del config.stash[_sink_key]
