"""Hooks that pytest-mps adds; implement one in a conftest to change a choice."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.hookspec(firstresult=True)
def pytest_mps_auto_device(config: pytest.Config) -> str | None:
    """Return the device id that ``--device auto`` stands for (``"cuda:0"``)."""


@pytest.hookspec
def pytest_mps_watch_ops(item: pytest.Item) -> Callable[..., None] | None:
    """Return ``callback(func, args, kwargs)`` to see each aten op ``item`` runs."""


@pytest.hookspec(firstresult=True)
def pytest_mps_synchronize(device: str) -> bool | None:
    """Block until the work queued on ``device`` (``cpu``, ``mps``, ``cuda:0``) is done.

    Return True once it is. The default drains the accelerator's queue
    (``torch.accelerator.synchronize``, ``torch.mps.synchronize``) and does
    nothing for ``cpu``; a conftest can drain its own queue instead.
    """
