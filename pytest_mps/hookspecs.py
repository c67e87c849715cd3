"""Hooks that pytest-mps adds; a conftest or plugin implements them to change a choice."""

from __future__ import annotations

import pytest


@pytest.hookspec(firstresult=True)
def pytest_mps_auto_device(config: pytest.Config) -> str | None:
    """Return the device that ``--device auto`` stands for (``"mps"``, ``"cuda:0"``, ...)."""
