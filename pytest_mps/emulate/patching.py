"""Attributes replaced while the emulation is installed, and put back after."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

_MISSING = object()


class Patches:
    """Replaces attributes of classes and modules; :meth:`undo` restores them.

    What was on the owner itself comes back; an attribute the owner only
    inherited is deleted again, so it is inherited again.
    """

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def patch(self, owner: Any, name: str, value: Any) -> None:
        """Set ``owner.name`` to ``value``, keeping what was there for :meth:`undo`."""
        self.saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def undo(self) -> None:
        """Put every replaced attribute back, the last replaced first."""
        for owner, name, value in reversed(self.saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self.saved.clear()


class _Loader(importlib.abc.Loader):
    """Loads a module with its own loader, then hands it to ``loaded``."""

    def __init__(
        self, loader: importlib.abc.Loader, loaded: Callable[[Any], None]
    ) -> None:
        self.loader = loader
        self.loaded = loaded

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.loaded(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Catches the first import of one module."""

    def __init__(self, name: str, loaded: Callable[[Any], None]) -> None:
        self.name = name
        self.loaded = loaded

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.loaded)
                return spec
        return None


class OnImport(Patches):
    """Patches a module now, or when it is first imported (an import hook).

    For modules too slow to import up front (``torch._dynamo`` takes seconds,
    ``torch.utils.cpp_extension`` a quarter of one). Subclasses patch in
    :meth:`imported`; :meth:`undo` also stops watching imports.
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.finder: _Finder | None = None
        module = sys.modules.get(name)
        if module is not None:
            self.imported(module)
        else:
            self.finder = _Finder(name, self.imported)
            sys.meta_path.insert(0, self.finder)

    def imported(self, module: Any) -> None:
        """Patch ``module`` (just imported, or imported before)."""
        raise NotImplementedError

    def undo(self) -> None:
        """Put what was patched back and stop watching imports."""
        if self.finder is not None and self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        self.finder = None
        super().undo()
