"""The pytest11 entry point: wires the concern modules together, holds no logic.

Only light hook modules load at start-up; each family's front door registers
its heavier parts when a run or a test asks for them (see docs/contributing.md,
"How it is built").

The modules are registered here rather than listed in ``pytest_plugins``:
pytest resolves every ``pytest_plugins`` entry by scanning the entry points of
every installed distribution first (``PytestPluginManager.import_plugin`` with
``consider_entry_points=True``), about 3 ms per entry in a venv of 60
packages, which was most of what the plugin added to each pytest start.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

MODULES = (
    "pytest_mps.ownership",
    "pytest_mps.devices",
    "pytest_mps.environment",
    "pytest_mps.seeding",
    "pytest_mps.report",
    "pytest_mps.machine.plugin",
    "pytest_mps.benchmark.plugin",
    "pytest_mps.watch.plugin",
    "pytest_mps.audit.plugin",
    "pytest_mps.emulate.plugin",
    "pytest_mps.isolation.plugin",
    "pytest_mps.known_failures.plugin",
    "pytest_mps.parity.plugin",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    # Called once, when pytest registers this module; registering a module
    # replays the historic hooks (pytest_addhooks, pytest_addoption, ...) for
    # it, in this order, as pytest_plugins would. A module blocked with
    # ``-p no:pytest_mps.<name>`` stays out, as it would there. Unlike there,
    # pytest does not rewrite these modules' asserts: they hold none a user
    # reads (the assertion helpers register for rewriting in __init__).
    for name in MODULES:
        if pluginmanager.is_blocked(name) or pluginmanager.get_plugin(name) is not None:
            continue
        pluginmanager.register(own_surface(importlib.import_module(name)), name)


def own_surface(module: ModuleType) -> ModuleType:
    """Narrow what ``dir(module)`` lists to what the module defines itself.

    pluggy looks for hooks, and pytest for fixtures, in every name ``dir()``
    lists; a plugin module's imports (modules, classes, typing names) are most
    of them, and scanning them was a fifth of what pytest-mps added to each
    pytest start. A module-level ``__dir__`` (PEP 562) lists the ``pytest_``
    names and whatever the module defined itself (its fixtures, hooks and
    helpers), so both scans skip the imports; attribute access is unchanged.
    """
    own = [
        name
        for name, value in vars(module).items()
        if name.startswith("pytest_")
        or (
            not isinstance(value, ModuleType)
            and not name.startswith("__")
            and getattr(value, "__module__", None) == module.__name__
        )
    ]
    module.__dir__ = lambda: own  # type: ignore[method-assign]
    return module
