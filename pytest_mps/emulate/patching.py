"""Attributes replaced while the emulation is installed, and put back after."""

from __future__ import annotations

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
