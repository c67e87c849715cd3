"""The pytest11 entry point: wires the concern modules together, holds no logic.

It registers one module, :mod:`.startup`, whose hooks call the families'
front doors; each front door registers its heavier parts when a run or a test
asks for them (see docs/contributing.md, "How it is built").

The module is registered here rather than listed in ``pytest_plugins``:
pytest resolves every ``pytest_plugins`` entry by scanning the entry points of
every installed distribution first (``PytestPluginManager.import_plugin`` with
``consider_entry_points=True``), about 3 ms per entry in a venv of 60
packages.

While it loads them, and from ``pytest_configure`` to the session's end,
:class:`FromFiles` finds the package's own modules from their files. pytest
rewrites the asserts of every module of a distribution that declares a
``pytest11`` entry point (``Config._mark_plugins_for_rewrite``), which for an
installed (not editable) pytest-mps meant each module was looked up twice, its
whole source read and hashed to validate the rewritten bytecode, and that
bytecode loaded: that was half of all it added to a pytest start, measured
with ``benchmarks/startup.py --instructions`` on a regular install; and where
bytecode cannot be cached, every module was parsed and rewritten again at
every run. Their asserts are internal checks no user reads;
the modules whose asserts users read are still rewritten.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_file_location
from types import ModuleType
from typing import Any

import pytest

from pytest_mps import REWRITTEN

#: The one module registered at start-up; it calls the families' front doors.
STARTUP = "pytest_mps.startup"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    # Called once, when pytest registers this module; registering a module
    # replays the historic hooks (pytest_addhooks, pytest_addoption, ...) for
    # it, as pytest_plugins would. Unlike there, pytest does not rewrite the
    # asserts of what it imports: they hold none a user reads (the assertion
    # helpers register for rewriting in __init__).
    remove = FromFiles.install()
    try:
        # a fault of ours here leaves pytest-mps off for the session, or is one
        # error line naming it (guard.py)
        guard: Any = importlib.import_module("pytest_mps.guard")
        with guard.Door(pluginmanager, "pytest_addhooks"):
            pluginmanager.add_hookspecs(importlib.import_module("pytest_mps.hookspecs"))
            if pluginmanager.is_blocked(STARTUP) or pluginmanager.get_plugin(STARTUP):
                return
            startup = own_surface(importlib.import_module(STARTUP))
            pluginmanager.register(startup, STARTUP)
    finally:
        remove()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # The families import their engines when a run or a test asks for them
    # (40 more modules under --mps-emulate): from their files too, until the
    # session's end. Where bytecode cannot be cached (PYTHONDONTWRITEBYTECODE=1,
    # as many container images set, or a read-only site-packages) pytest would
    # parse and rewrite each of them again at every run.
    config.add_cleanup(FromFiles.install())


class FromFiles:
    """A meta path finder for ``pytest_mps.*`` modules, straight from their files.

    Installed first on ``sys.meta_path`` while :func:`pytest_addhooks`
    imports the start-up modules (and what they import of the package), and
    again from ``pytest_configure`` to the session's end, so neither pytest's
    assertion-rewriting hook nor a second path search sees them; bytecode is
    cached as for any import. The modules in
    ``pytest_mps.REWRITTEN``, and any name without a file here, are left to
    the usual finders.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    @classmethod
    def install(cls) -> Callable[[], None]:
        """Put a finder for this package first on ``sys.meta_path``; return its undo."""
        finder = cls(os.path.dirname(__file__))
        sys.meta_path.insert(0, finder)

        def remove() -> None:
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)

        return remove

    def find_spec(
        self,
        name: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        """The spec of ``name`` from its file here, or None to leave it alone."""
        if not name.startswith("pytest_mps.") or name in REWRITTEN:
            return None
        base = os.path.join(self.root, *name.split(".")[1:])
        if os.path.isfile(base + ".py"):
            return spec_from_file_location(name, base + ".py")
        init = os.path.join(base, "__init__.py")
        if os.path.isfile(init):
            return spec_from_file_location(
                name, init, submodule_search_locations=[base]
            )
        return None


def own_surface(module: ModuleType) -> ModuleType:
    """Narrow what ``dir(module)`` lists to what the module defines itself.

    pluggy looks for hooks, and pytest for fixtures, in every name ``dir()``
    lists; a plugin module's imports (modules, classes, typing names) are most
    of them, and scanning them was a fifth of what pytest-mps added to each
    pytest start. A module-level ``__dir__`` (PEP 562) lists the ``pytest_``
    names and whatever the module defined itself (its fixtures, hooks and
    helpers), so both scans skip the imports; attribute access is unchanged.
    The names in the module's ``FIXTURES`` stay too: fixtures it imports.
    """
    fixtures = getattr(module, "FIXTURES", ())
    own = [
        name
        for name, value in vars(module).items()
        if name.startswith("pytest_")
        or name in fixtures
        or (
            not isinstance(value, ModuleType)
            and not name.startswith("__")
            and getattr(value, "__module__", None) == module.__name__
        )
    ]
    module.__dir__ = lambda: own  # type: ignore[method-assign]
    return module
