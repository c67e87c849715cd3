"""Being a guest: what the project defines itself wins, and nothing changes unasked.

pytest loads an installed plugin into every suite of its environment. So:

- **Flags.** Where a project (its conftest.py, or another plugin) defines a flag
  of ours without the ``--mps-`` prefix (``--device``, ``--mps``), its option
  wins; ours stays reachable as ``--mps-device`` (``--mps-device=mps`` for
  ``--mps``).
- **Markers.** A marker name the project declares itself (ini ``markers``, or
  ``config.addinivalue_line`` in its conftest) is not registered by us, and we
  do not act on it.
- **Fixtures.** A fixture name the project defines itself (``device``,
  ``seed``, ...) is theirs: pytest already gives the test their fixture, and we
  parametrize nothing for it.
- **Opting in.** A run asks for pytest-mps with one of its options or ini
  settings (:func:`opted_in`), or per test with a fixture or marker of ours.

The pytest internals this needs (a test's fixture definitions here, the
argparse actions behind the parser in :mod:`.flags`) are each covered by a test
in ``tests/test_ownership.py`` that fails loudly if pytest moves them.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_mps import flags
from pytest_mps.flags import GROUP as GROUP
from pytest_mps.flags import SHORT_FLAGS

#: Every ini setting of ours; ``tests/test_ownership.py`` checks it is complete.
INI_NAMES = (
    "mps_devices",
    "mps_seed",
    "mps_report",
    "mps_virtual_gpu",
    "mps_probe_timeout",
    "mps_empty_cache",
    "mps_fallback",
    "mps_allow_fallback",
    "mps_mixed_devices",
    "mps_watch_every_op",
    "mps_expected_host_syncs",
    "mps_audit",
    "mps_audit_check",
    "mps_audit_macos",
    "mps_audit_ignore",
    "mps_benchmark_autosave",
    "mps_benchmark_compare_fail",
    "mps_benchmark_compare_machine",
    "mps_benchmark_devices",
    "mps_benchmark_storage",
    "mps_benchmark_min_time",
    "mps_benchmark_max_time",
    "mps_benchmark_warmup",
    "mps_benchmark_save_data",
    "mps_benchmark_disable_gc",
    "mps_benchmark_disable",
    "mps_benchmark_alias",
    "mps_benchmark_min_rounds",
    "mps_benchmark_precision",
    "mps_benchmark_lock",
    "mps_benchmark_columns",
    "mps_benchmark_sort",
    "mps_benchmark_group_by",
    "mps_benchmark_name",
    "mps_benchmark_time_unit",
    "mps_benchmark_histogram",
    "mps_benchmark_cprofile",
    "mps_benchmark_compare_rev",
    "mps_benchmark_compare_processes",
    "mps_emulate",
    "mps_emulate_macos",
    "mps_emulate_memory",
    "mps_isolate",
    "mps_isolate_start",
    "mps_timeout",
    "mps_known_failures",
    "mps_parity_bundle",
    "mps_parity_fresh",
)

#: The benchmark flags' own section of ``--help``: pytest checks each new
#: option's names against every option of its group, and one group of all 56
#: cost about 0.9 million more instructions at every start than two.
BENCHMARK_GROUP = "mps-benchmark"


class Yielded:
    """The names pytest-mps left to the project in this session."""

    def __init__(self, flags: list[str]) -> None:
        self.flags = flags
        self.markers: list[str] = []
        #: marker names the project declared before ours were registered
        self.project_markers: frozenset[str] | None = None

    def line(self) -> str | None:
        """``yielded to the project: --device (use --mps-device), marker mps``."""
        parts = [f"{flag} (use {SHORT_FLAGS[flag]})" for flag in self.flags]
        parts += [f"marker {name}" for name in self.markers]
        return f"yielded to the project's own {', '.join(parts)}" if parts else None


yielded_key: pytest.StashKey[Yielded] = pytest.StashKey()

# -- markers -------------------------------------------------------------------------


def _marker_name(line: str) -> str:
    return line.split(":", 1)[0].split("(", 1)[0].strip()


def _yielded(config: pytest.Config) -> Yielded:
    found = config.stash.get(yielded_key, None)
    if found is None:
        found = config.stash[yielded_key] = Yielded(flags=list(flags.yielded(config)))
    return found


def register_markers(config: pytest.Config, *lines: str) -> None:
    """Register our markers, leaving alone the names the project declared itself.

    The project's names are read once, before any of ours is added, so every
    module of ours can call this from its ``pytest_configure``.
    """
    yielded = _yielded(config)
    if yielded.project_markers is None:
        yielded.project_markers = frozenset(
            _marker_name(line) for line in config.getini("markers")
        )
    for line in lines:
        name = _marker_name(line)
        if name in yielded.project_markers:
            if name not in yielded.markers:
                yielded.markers.append(name)
            continue
        config.addinivalue_line("markers", line)


def marker_is_ours(config: pytest.Config, name: str) -> bool:
    """False when the project declared a marker of this name itself."""
    found = config.stash.get(yielded_key, None)
    return found is None or name not in found.markers


def closest_marker(item: pytest.Item, name: str) -> pytest.Mark | None:
    """``item.get_closest_marker(name)`` when the marker is ours, else None."""
    if not marker_is_ours(item.config, name):
        return None
    return item.get_closest_marker(name)


def iter_markers(item: pytest.Item, name: str) -> list[pytest.Mark]:
    """``item.iter_markers(name)`` when the marker is ours, else nothing."""
    if not marker_is_ours(item.config, name):
        return []
    return list(item.iter_markers(name))


def yielded_line(config: pytest.Config) -> str | None:
    """One header phrase naming what was yielded, or None."""
    found = config.stash.get(yielded_key, None)
    return found.line() if found is not None else None


# -- fixtures ------------------------------------------------------------------------


def fixture_is_ours(metafunc: pytest.Metafunc, name: str, function: Any) -> bool:
    """True when ``name`` resolves, for this test, to our fixture ``function``.

    Private pytest API (``Metafunc._arg2fixturedefs``, pytest 8 and 9): the
    closest definition, the last in the list, is the one the test gets. On a
    pytest without it, False: we parametrize nothing, and our fixture gives the
    session's first device.
    """
    definitions = getattr(metafunc, "_arg2fixturedefs", None)
    if not isinstance(definitions, dict):
        return False
    return _resolves_to(definitions.get(name), function)


def _resolves_to(definitions: Any, function: Any) -> bool:
    """True when the closest of ``definitions`` (the last) is ``function``."""
    if not definitions:
        return False
    # pytest >= 8.4 wraps a fixture function in a FixtureFunctionDefinition
    unwrapped = getattr(function, "__wrapped__", function)
    return getattr(definitions[-1], "func", None) is unwrapped


# -- opting in -----------------------------------------------------------------------


_INI_OFF: tuple[object, ...] = (None, "", [], False, "off")


def _our_options(parser: pytest.Parser) -> list[Any]:
    return [
        argument
        for name in (GROUP, BENCHMARK_GROUP)
        for argument in parser.getgroup(name).options
    ]


def opted_in(config: pytest.Config, prefix: str = "") -> bool:
    """True when the run set an option or ini setting of pytest-mps.

    With ``prefix`` (``"mps_benchmark"``), only those whose name starts with it.
    """
    parser = flags.parser_of(config)
    if parser is not None:
        for argument in _our_options(parser):
            if not argument.names() or not argument.dest.startswith(prefix):
                continue  # yielded to the project, or another family's
            value = config.getoption(argument.dest, None)
            # pytest < 9.1 gives an Argument a default only where one was passed
            if value not in (None, False, [], getattr(argument, "default", None)):
                return True
    for name in INI_NAMES:
        if not name.startswith(prefix):
            continue
        try:
            value = config.getini(name)
        except (ValueError, pytest.UsageError):
            continue  # a bad value: check_ini_values says so
        if value not in _INI_OFF:
            return True
    return False


def register_hooks(config: pytest.Config, name: str) -> bool:
    """Register a family's hook module ``name`` once; True when this call did.

    A family's front door (its ``plugin.py``) calls this once a run or a test
    asks for the family, so a run that does not pays nothing for its hooks at
    start-up. pluggy replays the historic hooks for it at once (its
    ``pytest_configure`` runs now); a hook already past in this session
    (collection, a report) is the caller's to run. ``-p no:<name>`` keeps it
    out.
    """
    manager = config.pluginmanager
    if manager.is_blocked(name) or manager.get_plugin(name) is not None:
        return False
    import importlib

    manager.register(importlib.import_module(name), name)
    return True


def register_hooks_at_collection(
    config: pytest.Config, name: str, items: list[pytest.Item]
) -> None:
    """Register ``name`` from a front door's collection hook, and run its own.

    pluggy does not run the new module's ``pytest_collection_modifyitems`` on
    ``items``: the hook call in progress keeps the implementations it began with.
    """
    if register_hooks(config, name):
        # by the manager, not the package's attribute: pytester's in-process
        # runs drop the modules a run imported, leaving a stale attribute
        hooks: Any = config.pluginmanager.get_plugin(name)
        hooks.pytest_collection_modifyitems(config, items)


def uses_fixture(item: pytest.Item, name: str, function: Any) -> bool:
    """True when ``item`` asks for ``name`` and it resolves to our ``function``.

    Private pytest API (``item._fixtureinfo``, pytest 8 and 9), as
    :func:`fixture_is_ours` reads.
    """
    if name not in getattr(item, "fixturenames", ()):
        return False
    info = getattr(item, "_fixtureinfo", None)
    definitions = getattr(info, "name2fixturedefs", None)
    if not isinstance(definitions, dict):
        return False  # a pytest that moved it: as if the test did not ask
    return _resolves_to(definitions.get(name), function)


def check_ini_values(config: pytest.Config) -> None:
    """A bad boolean ini value of ours is one usage line naming its key and file.

    pytest itself reads a boolean ini key with "invalid truth value 'maybe'"
    and neither the key nor the file; the string keys are checked where their
    families read them.
    """
    for name in INI_NAMES:
        try:
            config.getini(name)
        except (ValueError, pytest.UsageError) as exc:  # pytest 9 raises the latter
            if "unknown configuration value" in str(exc):
                continue  # its family is blocked (-p no:...)
            raise pytest.UsageError(
                f"ini option {name} in {config.inipath}: {exc}; use true or false"
            ) from None


# startup.py calls this first
def pytest_configure(config: pytest.Config) -> None:
    check_ini_values(config)
