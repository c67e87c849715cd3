"""The isolation family's front door: options, markers, and asking for the hooks.

Light on purpose (pytest loads it at start-up): :mod:`.hooks`, which runs
tests in child processes and bounds them with a time limit, is registered only
when a run asks (``--mps-isolate``, ``--mps-timeout``, their ini keys, a
known-failures manifest) or a test does (``mps_isolate``, ``mps_timeout``).
"""

from __future__ import annotations

import pytest

from pytest_mps import ownership
from pytest_mps.isolation import settings, shutdown
from pytest_mps.options import argparse_type

HOOKS = "pytest_mps.isolation.hooks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(ownership.GROUP)
    group.addoption(
        "--mps-isolate",
        dest="mps_isolate",
        action="store_true",
        default=None,
        help=settings.ISOLATE_HELP,
    )
    group.addoption(
        "--mps-isolate-start",
        dest="mps_isolate_start",
        type=argparse_type(settings.parse_start, "--mps-isolate-start"),
        metavar="{forkserver,fork,spawn}",
        default=None,
        help=settings.START_HELP,
    )
    group.addoption(
        "--mps-timeout",
        dest="mps_timeout",
        type=argparse_type(settings.parse_timeout, "--mps-timeout"),
        metavar="SECONDS",
        default=None,
        help=settings.TIMEOUT_HELP,
    )
    parser.addini("mps_isolate", settings.ISOLATE_HELP, type="bool", default=False)
    parser.addini("mps_isolate_start", settings.START_HELP, default=None)
    parser.addini("mps_timeout", settings.TIMEOUT_HELP, default=None)


def _asked(config: pytest.Config) -> bool:
    return bool(
        settings.session_limit(config) is not None
        or settings.isolate_all(config)
        or config.getoption("mps_known_failures", None)
        or config.getini("mps_known_failures")
    )


def pytest_configure(config: pytest.Config) -> None:
    shutdown.configured(config)
    ownership.register_markers(config, *settings.MARKERS)
    # bad ini values are one-line usage errors now, not at the first test
    settings.start_method(config)
    if _asked(config):
        ownership.register_hooks(config, HOOKS)


# startup.py calls this last
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    marked = any(
        ownership.closest_marker(item, name) is not None
        for item in items
        for name in ("mps_isolate", "mps_timeout")
    )
    if marked:
        ownership.register_hooks_at_collection(config, HOOKS, items)


# startup.py calls this (even once pytest-mps is off: the count stays right)
def pytest_unconfigure(config: pytest.Config) -> None:
    shutdown.unconfigured(config)
