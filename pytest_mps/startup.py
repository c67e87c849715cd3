"""Every hook pytest-mps has at start-up: one per hook and order, calling the families.

:mod:`.plugin` registers this module alone. The families' front doors
(:mod:`.ownership`, :mod:`.devices`, :mod:`.environment`, :mod:`.seeding`,
:mod:`.report` and each capability's ``plugin.py``) keep their options,
markers, fixtures and hook functions under the hooks' names, but pytest does
not register them: it registers this module, whose hooks call theirs in the
order pluggy used to (the last registered first), and which lends a family's
function to pytest as it is where only that family implements the hook.

Why: pluggy's cost is per hook implementation, not per module (it reads each
one's signature, checks it and sorts it in). Fifty implementations over
fourteen registered modules became these twenty-two and :mod:`.plugin`'s
two, which took what pytest-mps added to a pytest start from 44.9 to 37.4
million instructions (``benchmarks/startup.py --instructions``, wheel
install). A family's heavier hooks are still registered only when a run or a
test asks for them (``ownership.register_hooks``).

Each hook here runs its families through a :class:`.guard.Door`: a fault of
ours turns pytest-mps off for a run that did not ask for it (one line on
stderr), or is one error line naming pytest-mps for a run that did; once off,
every hook here does nothing.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_mps import devices, environment, flags, guard, ownership, report, seeding
from pytest_mps.audit import plugin as audit
from pytest_mps.benchmark import plugin as benchmark
from pytest_mps.benchmark.plugin import mps_benchmark as mps_benchmark
from pytest_mps.devices import device as device
from pytest_mps.devices import device_parity as device_parity
from pytest_mps.devices import mps_device as mps_device
from pytest_mps.emulate import plugin as emulate
from pytest_mps.environment import mps_environment as mps_environment
from pytest_mps.isolation import plugin as isolation
from pytest_mps.known_failures import plugin as known_failures
from pytest_mps.machine import plugin as machine
from pytest_mps.options import recording_ini_names, unknown_ini_keys
from pytest_mps.parity import plugin as parity
from pytest_mps.seeding import seed as seed
from pytest_mps.watch import plugin as watch
from pytest_mps.watch.plugin import mps_memory as mps_memory

#: The fixtures imported above: pytest finds them here, as in the modules that
#: define them (:func:`.plugin.own_surface` keeps these names).
FIXTURES = (
    "device",
    "device_parity",
    "mps_device",
    "mps_environment",
    "seed",
    "mps_benchmark",
    "mps_memory",
)


def pytest_addoption(parser: pytest.Parser, pluginmanager: Any) -> None:
    if guard.is_off(pluginmanager):
        return
    with guard.Door(pluginmanager, "pytest_addoption"), recording_ini_names(parser):
        # in this order in --help
        flags.pytest_addoption(parser, pluginmanager)
        devices.pytest_addoption(parser)
        seeding.pytest_addoption(parser)
        report.pytest_addoption(parser)
        machine.pytest_addoption(parser)
        benchmark.pytest_addoption(parser)
        watch.pytest_addoption(parser)
        audit.pytest_addoption(parser, pluginmanager)
        emulate.pytest_addoption(parser)
        isolation.pytest_addoption(parser)
        known_failures.pytest_addoption(parser)
        parity.pytest_addoption(parser)


# -- start and end ------------------------------------------------------------------


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config,
) -> Generator[None, None, None]:
    # A wrapper round the conftest files' options: a project's own --device
    # added there wins over ours (ownership.py).
    before = None
    if not guard.is_off(early_config.pluginmanager):
        with guard.door(early_config, "pytest_load_initial_conftests"):
            before = flags.before_conftests(early_config)
    try:
        return (yield)
    finally:
        if before is not None and not guard.is_off(early_config.pluginmanager):
            with guard.door(early_config, "pytest_load_initial_conftests"):
                flags.after_conftests(early_config, before)


@pytest.hookimpl(tryfirst=True, specname="pytest_load_initial_conftests")
def pytest_load_initial_conftests_watch(early_config: pytest.Config) -> None:
    # the watchers set the fallback variable before any conftest imports torch
    if guard.is_off(early_config.pluginmanager):
        return
    with guard.door(early_config, "pytest_load_initial_conftests"):
        watch.pytest_load_initial_conftests(early_config)


@pytest.hookimpl(specname="pytest_load_initial_conftests")
def pytest_load_initial_conftests_emulate(early_config: pytest.Config) -> None:
    # the emulation installs after that and before pytest's own implementation
    # (trylast) imports the conftests
    if guard.is_off(early_config.pluginmanager):
        return
    with guard.door(early_config, "pytest_load_initial_conftests"):
        emulate.pytest_load_initial_conftests(early_config)


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")
def pytest_configure_first(config: pytest.Config) -> None:
    # the emulated device before devices.py resolves the session's devices;
    # every bad boolean ini value of ours named before any family reads one
    _each(
        config, "pytest_configure", emulate.pytest_configure, ownership.pytest_configure
    )


def pytest_configure(config: pytest.Config) -> None:
    _each(
        config,
        "pytest_configure",
        parity.pytest_configure,
        isolation.pytest_configure,
        report.pytest_configure,
        seeding.pytest_configure,
        devices.pytest_configure,
        _warn_unknown_ini_keys,
    )


def _warn_unknown_ini_keys(config: pytest.Config) -> None:
    for line in unknown_ini_keys(config):
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(f"pytest-mps: {line}"), stacklevel=2
        )


@pytest.hookimpl(trylast=True, specname="pytest_configure")
def pytest_configure_last(config: pytest.Config) -> None:
    # after devices.py has resolved the devices (and after the watchers, the
    # audit, whose hooks read theirs)
    _each(
        config,
        "pytest_configure",
        known_failures.pytest_configure,
        audit.pytest_configure,
        watch.pytest_configure,
        benchmark.pytest_configure,
        machine.pytest_configure,
    )


def _each(config: pytest.Config, hook: str, *functions: Any) -> None:
    """Call each family's ``function(config)`` through the guard's door.

    The functions are looked up at each hook call (``devices.pytest_configure``
    is read then), so what a family holds under the name is what runs.
    """
    if guard.is_off(config.pluginmanager):
        return
    with guard.door(config, hook):
        for function in functions:
            function(config)


def _undo(config: pytest.Config, *undo: Any) -> None:
    """Run each family's ``pytest_unconfigure``, even once pytest-mps is off.

    What a family changed before a fault turned pytest-mps off is put back;
    a second fault is not reported again (:func:`.guard.fault`).
    """
    for family in undo:
        with guard.door(config, "pytest_unconfigure"):
            family.pytest_unconfigure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _undo(config, parity, known_failures, emulate, watch, isolation)


@pytest.hookimpl(trylast=True, specname="pytest_unconfigure")
def pytest_unconfigure_last(config: pytest.Config) -> None:
    _undo(config, report)
    guard.say_pending(config.pluginmanager)  # no terminal summary came


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if guard.is_off(config.pluginmanager):
        return None
    with guard.door(config, "pytest_report_header"):
        return environment.pytest_report_header(config)
    return None


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    guard.say_pending(config.pluginmanager, terminalreporter)
    if guard.is_off(config.pluginmanager):
        return
    with guard.door(config, "pytest_terminal_summary"):
        report.pytest_terminal_summary(terminalreporter, config)


pytest_mps_auto_device = devices.pytest_mps_auto_device


# -- collection ----------------------------------------------------------------------


def pytest_collect_file(
    file_path: Path, parent: pytest.Collector
) -> pytest.Collector | None:
    config = parent.config
    if guard.is_off(config.pluginmanager):
        return None
    with guard.door(config, "pytest_collect_file"):
        return parity.pytest_collect_file(file_path, parent)
    return None


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # trylast: the project's own parametrization of 'device' comes first
    if guard.is_off(metafunc.config.pluginmanager):
        return
    with guard.door(metafunc.config, "pytest_generate_tests"):
        devices.pytest_generate_tests(metafunc)


@pytest.hookimpl(tryfirst=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_first(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # the benchmark hooks, registered here, then sort the items
    if guard.is_off(config.pluginmanager):
        return
    with guard.door(config, "pytest_collection_modifyitems"):
        benchmark.pytest_collection_modifyitems(config, items)


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    if guard.is_off(config.pluginmanager):
        return
    with guard.door(config, "pytest_collection_modifyitems"):
        devices.pytest_collection_modifyitems(items)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_last(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # after every skip and xfail mark is on the items
    if guard.is_off(config.pluginmanager):
        return
    with guard.door(config, "pytest_collection_modifyitems"):
        isolation.pytest_collection_modifyitems(config, items)
        watch.pytest_collection_modifyitems(config, items)


# -- running -------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_setup")
def pytest_runtest_setup_first(item: pytest.Item) -> None:
    if guard.is_off(item.config.pluginmanager):
        return
    with guard.door(item.config, "pytest_runtest_setup", in_test=True):
        devices.pytest_runtest_setup(item)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if guard.is_off(item.config.pluginmanager):
        return
    with guard.door(item.config, "pytest_runtest_setup", in_test=True):
        audit.pytest_runtest_setup(item)
        watch.pytest_runtest_setup(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if guard.is_off(item.config.pluginmanager):
        return (yield)
    return (yield from parity.pytest_runtest_call(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if guard.is_off(item.config.pluginmanager):
        return report
    with guard.door(item.config, "pytest_runtest_makereport"):
        seeding.note_report(item, report)
        watch.note_report(call, report)
    return report
