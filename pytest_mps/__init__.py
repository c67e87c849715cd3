"""pytest-mps: run PyTorch test suites on Apple GPUs (MPS), honestly.

Importing this package does not import torch.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("pytest_mps.assertions")

from pytest_mps.assertions import assert_on_device, assert_same_device  # noqa: E402

__all__ = ["assert_on_device", "assert_same_device"]
__version__ = "0.1.0"
