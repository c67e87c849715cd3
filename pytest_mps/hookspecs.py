"""Hooks that pytest-mps adds; implement one in a conftest to change a choice."""

from __future__ import annotations

import pytest


@pytest.hookspec(firstresult=True)
def pytest_mps_auto_device(config: pytest.Config) -> str | None:
    """Return the device id that ``--device auto`` stands for (``"cuda:0"``)."""
