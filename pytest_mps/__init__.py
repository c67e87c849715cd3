"""pytest-mps: run PyTorch test suites on Apple GPUs (MPS), honestly.

Importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pytest

pytest.register_assert_rewrite("pytest_mps.assertions")

from pytest_mps.assertions import assert_on_device, assert_same_device  # noqa: E402

if TYPE_CHECKING:
    from pytest_mps.host_sync import HostSyncError, forbid_host_sync

# Imported on first use: host_sync's dependencies are plugin modules, which
# pytest wants to import itself (importing them here first makes pytest warn
# that it cannot rewrite their asserts).
_LAZY = {"HostSyncError": "host_sync", "forbid_host_sync": "host_sync"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_mps' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pytest_mps.{module}"), name)


__all__ = [
    "HostSyncError",
    "assert_on_device",
    "assert_same_device",
    "forbid_host_sync",
]
__version__ = "0.1.0"
