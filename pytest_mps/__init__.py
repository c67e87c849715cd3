"""pytest-mps: run PyTorch test suites on Apple GPUs (MPS), honestly.

Importing this package imports neither torch nor any of its own modules: the
helpers below are loaded on first use, so the plugin costs a suite that never
uses them nothing at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pytest

#: The modules whose asserts give the messages users read: pytest rewrites
#: them (registered before their first import; :mod:`.plugin` leaves them to
#: pytest's hook when it loads the others from their files).
REWRITTEN = ("pytest_mps.assertions", "pytest_mps.parity.check")
pytest.register_assert_rewrite(*REWRITTEN)

if TYPE_CHECKING:
    from pytest_mps.assertions import assert_on_device, assert_same_device
    from pytest_mps.compile_checks import assert_no_graph_breaks, assert_no_recompiles
    from pytest_mps.parity.check import assert_device_parity
    from pytest_mps.parity.replay import replay_bundle
    from pytest_mps.parity.twice import assert_reproducible
    from pytest_mps.training import (
        assert_accumulation_matches,
        assert_autocast_close,
        assert_resume_matches,
    )
    from pytest_mps.watch.host_sync import HostSyncError, forbid_host_sync

# Imported on first use. host_sync's dependencies are plugin modules, which
# pytest wants to import itself (importing them here first makes pytest warn
# that it cannot rewrite their asserts).
_LAZY = {
    "assert_on_device": "pytest_mps.assertions",
    "assert_same_device": "pytest_mps.assertions",
    "assert_device_parity": "pytest_mps.parity.check",
    "assert_no_graph_breaks": "pytest_mps.compile_checks",
    "assert_no_recompiles": "pytest_mps.compile_checks",
    "assert_reproducible": "pytest_mps.parity.twice",
    "replay_bundle": "pytest_mps.parity.replay",
    "assert_accumulation_matches": "pytest_mps.training",
    "assert_autocast_close": "pytest_mps.training",
    "assert_resume_matches": "pytest_mps.training",
    "HostSyncError": "pytest_mps.watch.host_sync",
    "forbid_host_sync": "pytest_mps.watch.host_sync",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_mps' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "HostSyncError",
    "assert_accumulation_matches",
    "assert_autocast_close",
    "assert_device_parity",
    "assert_no_graph_breaks",
    "assert_no_recompiles",
    "assert_on_device",
    "assert_reproducible",
    "assert_resume_matches",
    "assert_same_device",
    "forbid_host_sync",
    "replay_bundle",
]
__version__ = "0.1.0"
