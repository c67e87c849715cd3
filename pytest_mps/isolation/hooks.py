"""Where each test runs: the isolation family's hooks.

Registered by :mod:`.plugin` once a run or a test asks for isolation, a time
limit or a known-failures manifest; the child, server and watchdog modules are
imported only when a test needs them.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import TYPE_CHECKING

import pytest

from pytest_mps.isolation import record, settings

if TYPE_CHECKING:
    from pytest_mps.isolation.sidecar import Sidecar
    from pytest_mps.isolation.watchdog import Watchdog


#: The sidecar of each session that has one (pytester nests sessions).
_sidecar_key: pytest.StashKey[Sidecar] = pytest.StashKey()
_sidecars: list[Sidecar] = []


def pytest_configure(config: pytest.Config) -> None:
    asked = (
        settings.session_limit(config) is not None
        or settings.isolate_all(config)
        or _manifest(config)
    )
    if asked and not _serving():
        # a test that kills this process is named (see .sidecar)
        from pytest_mps.isolation.sidecar import Sidecar

        sidecar = config.stash[_sidecar_key] = Sidecar()
        _sidecars.append(sidecar)


def pytest_report_header(config: pytest.Config) -> str | None:
    limit = settings.session_limit(config)
    parts = []
    if settings.isolate_all(config):
        parts.append(f"every test in a child process ({settings.start_method(config)})")
    if limit is not None:
        parts.append(f"a limit of {limit.describe()} per test")
    if not parts:
        return None
    return f"pytest-mps isolation: {'; '.join(parts)}"


def _manifest(config: pytest.Config) -> bool:
    return bool(
        config.getoption("mps_known_failures", None)
        or config.getini("mps_known_failures")
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # after pytest's faulthandler plugin pointed it at stderr (its configure)
    sidecar = session.config.stash.get(_sidecar_key, None)
    if sidecar is not None:
        sidecar.enable()


def pytest_runtest_logstart(nodeid: str) -> None:
    if _sidecars:
        _sidecars[-1].running(nodeid)


def _serving() -> bool:
    from pytest_mps.isolation import server

    return server.serving[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # the fork server collects while this process runs the tests before the
    # first isolated one
    if config.getoption("collectonly", False):
        return
    if not any(settings.is_isolated(item) for item in items):
        return
    if settings.start_method(config) == "forkserver" and not _serving():
        from pytest_mps.isolation import parent

        parent.server(config)


#: The main-process watchdog of the running test, if it has a limit.
_watchdog_key: pytest.StashKey[Watchdog] = pytest.StashKey()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    try:
        settings.limit_of(item)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    watchdog = item.stash.get(_watchdog_key, None)
    if watchdog is not None:
        watchdog.when = "call"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    watchdog = item.stash.get(_watchdog_key, None)
    if watchdog is not None:
        watchdog.when = "teardown"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    # the limit of a test run here (an isolated test's is kept by its parent)
    limit = None
    isolated = settings.is_isolated(item)
    if not isolated and not _child_running() and _limit_is_valid(item):
        limit = settings.limit_of(item)
    if limit is None:
        return (yield)
    from pytest_mps.isolation.watchdog import Watchdog

    watchdog = item.stash[_watchdog_key] = Watchdog(item, limit)
    try:
        return (yield)
    finally:
        watchdog.stop()
        del item.stash[_watchdog_key]


def _child_running() -> bool:
    child = sys.modules.get("pytest_mps.isolation.child")
    return child is not None and child.in_child[0]


def _limit_is_valid(item: pytest.Item) -> bool:
    try:
        settings.limit_of(item)
    except ValueError:
        return False  # pytest_runtest_setup fails the test, naming the marker
    return True


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_protocol")
def pytest_runtest_protocol_isolated(
    item: pytest.Item, nextitem: pytest.Item | None
) -> bool | None:
    if not settings.is_isolated(item) or not _limit_is_valid(item):
        return None
    from pytest_mps.isolation import child, parent

    if child.in_child[0]:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in parent.run(item):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    _teardown_parent_fixtures(item, nextitem)
    return True


def _teardown_parent_fixtures(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # Fixtures this process holds for the tests before (a module's, the
    # session's) are torn down where the next test no longer needs them, as
    # pytest's runner does after each test. Private pytest API
    # (Session._setupstate, pytest 8 and 9), covered by
    # test_isolated_test_between_modules_tears_down_the_parents_fixtures.
    setupstate = getattr(item.session, "_setupstate", None)
    if setupstate is not None:
        setupstate.teardown_exact(nextitem)


@pytest.hookimpl(wrapper=True, trylast=True, specname="pytest_runtest_call")
def pytest_runtest_call_recorded(item: pytest.Item) -> Generator[None, None, None]:
    # The isolated child's (or the watchdog's) record of the last torch call.
    # Only where torch is loaded already: a test that never imported it runs
    # no device op, and importing it here would spend seconds of its limit.
    into = record.current[0]
    if into is None or "torch" not in sys.modules:
        return (yield)
    with record.recording(into):
        return (yield)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from pytest_mps.isolation import shutdown

    shutdown.session_finished(session.config, int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    sidecar = config.stash.get(_sidecar_key, None)
    if sidecar is not None:
        del config.stash[_sidecar_key]
        _sidecars.remove(sidecar)
        sidecar.close()
    parent = sys.modules.get("pytest_mps.isolation.parent")
    if parent is not None:
        parent.stop_server(config)
