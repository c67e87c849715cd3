"""The machine's front door: the fingerprint of the session, in every result.

The header line is :mod:`pytest_mps.environment`'s; the ``--mps-report`` JSON
(and so the audit's report) and the benchmark JSON take :func:`fingerprint`;
the junit XML gets it here, as ``<properties>`` of the test suite, under
``pytest_mps.machine.<field>``. Only a run that asks for pytest-mps reads the
machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import ownership

if TYPE_CHECKING:
    from pytest_mps.machine.fingerprint import Fingerprint

_fingerprint_key = pytest.StashKey["Fingerprint"]()

#: The prefix of the junit properties.
PROPERTY_PREFIX = "pytest_mps.machine."


def fingerprint(config: pytest.Config) -> Fingerprint:
    """The session's machine fingerprint, read once."""
    found = config.stash.get(_fingerprint_key, None)
    if found is None:
        from pytest_mps.emulate.plugin import emulated_mac
        from pytest_mps.machine import fingerprint as reader

        found = reader.read(emulated_mac(config))
        config.stash[_fingerprint_key] = found
    return found


def junit_properties(found: Fingerprint) -> list[tuple[str, str]]:
    """``(pytest_mps.machine.os_build, 24F74)``, ... for each known field."""
    pairs = []
    for name, value in found.as_dict().items():
        if value is None or value == []:
            continue
        if isinstance(value, list):
            value = "; ".join(map(str, value))
        pairs.append((PROPERTY_PREFIX + name, str(value)))
    return pairs


def _junit_writer(config: pytest.Config) -> Any | None:
    """The junitxml plugin object, when ``--junitxml`` is on (not on workers).

    Found by what it offers, ``add_global_property`` (the method pytest's own
    ``record_testsuite_property`` fixture calls), since it is registered
    without a name.
    """
    for plugin in config.pluginmanager.get_plugins():
        if callable(getattr(plugin, "add_global_property", None)) and hasattr(
            plugin, "logfile"
        ):
            return plugin
    return None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not ownership.opted_in(config) or hasattr(config, "workerinput"):
        return
    writer = _junit_writer(config)
    if writer is None:
        return
    for name, value in junit_properties(fingerprint(config)):
        writer.add_global_property(name, value)
