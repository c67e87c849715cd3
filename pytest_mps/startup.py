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
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_mps import devices, environment, ownership, report, seeding
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
    # in this order in --help
    ownership.pytest_addoption(parser, pluginmanager)
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

# A wrapper round the conftest files' options; the watchers set the fallback
# variable before any conftest imports torch, and the emulation installs after
# that and before pytest's own implementation (trylast) imports the conftests.
pytest_load_initial_conftests = ownership.pytest_load_initial_conftests


@pytest.hookimpl(tryfirst=True, specname="pytest_load_initial_conftests")
def pytest_load_initial_conftests_watch(early_config: pytest.Config) -> None:
    watch.pytest_load_initial_conftests(early_config)


@pytest.hookimpl(specname="pytest_load_initial_conftests")
def pytest_load_initial_conftests_emulate(early_config: pytest.Config) -> None:
    emulate.pytest_load_initial_conftests(early_config)


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")
def pytest_configure_first(config: pytest.Config) -> None:
    # the emulated device before devices.py resolves the session's devices;
    # every bad boolean ini value of ours named before any family reads one
    emulate.pytest_configure(config)
    ownership.pytest_configure(config)


def pytest_configure(config: pytest.Config) -> None:
    parity.pytest_configure(config)
    isolation.pytest_configure(config)
    report.pytest_configure(config)
    seeding.pytest_configure(config)
    devices.pytest_configure(config)


@pytest.hookimpl(trylast=True, specname="pytest_configure")
def pytest_configure_last(config: pytest.Config) -> None:
    # after devices.py has resolved the devices (and after the watchers, the
    # audit, whose hooks read theirs)
    known_failures.pytest_configure(config)
    audit.pytest_configure(config)
    watch.pytest_configure(config)
    benchmark.pytest_configure(config)
    machine.pytest_configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    parity.pytest_unconfigure(config)
    known_failures.pytest_unconfigure(config)
    emulate.pytest_unconfigure(config)
    watch.pytest_unconfigure(config)


@pytest.hookimpl(trylast=True, specname="pytest_unconfigure")
def pytest_unconfigure_last(config: pytest.Config) -> None:
    report.pytest_unconfigure(config)


pytest_report_header = environment.pytest_report_header
pytest_terminal_summary = report.pytest_terminal_summary
pytest_mps_auto_device = devices.pytest_mps_auto_device


# -- collection ----------------------------------------------------------------------

pytest_collect_file = parity.pytest_collect_file
pytest_generate_tests = devices.pytest_generate_tests


@pytest.hookimpl(tryfirst=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_first(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # the benchmark hooks, registered here, then sort the items
    benchmark.pytest_collection_modifyitems(config, items)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    devices.pytest_collection_modifyitems(items)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_last(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # after every skip and xfail mark is on the items
    isolation.pytest_collection_modifyitems(config, items)
    watch.pytest_collection_modifyitems(config, items)


# -- running -------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_setup")
def pytest_runtest_setup_first(item: pytest.Item) -> None:
    devices.pytest_runtest_setup(item)


def pytest_runtest_setup(item: pytest.Item) -> None:
    audit.pytest_runtest_setup(item)
    watch.pytest_runtest_setup(item)


pytest_runtest_call = parity.pytest_runtest_call
pytest_runtest_makereport = seeding.pytest_runtest_makereport


@pytest.hookimpl(wrapper=True, specname="pytest_runtest_makereport")
def pytest_runtest_makereport_watch(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # registered after seeding's (names sort so): it wraps seeding's, as before
    return (yield from watch.pytest_runtest_makereport(item, call))
