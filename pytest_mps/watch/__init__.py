"""Watching what a test does on the device, op by op.

The family, lowest first: :mod:`.locations` (the user's line) and
:mod:`.device_mix` (does a call mix devices) import nothing of pytest-mps;
:mod:`.mode` is the one ``TorchDispatchMode`` per test and :mod:`.front` its
cheap way in; :mod:`.findings` keeps what the watchers found; the watchers are
:mod:`.fallback`, :mod:`.host_sync`, :mod:`.mixed_devices` and :mod:`.memory`;
:mod:`.plugin` runs a test's call phase inside the mode when one asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type alias: building it at run time costs every start-up
    from collections.abc import Callable, Mapping
    from typing import Any

    #: ``callback(func, args, kwargs) -> None``, called before each watched op.
    OpCallback = Callable[[Any, tuple[Any, ...], Mapping[str, Any]], None]

#: The session's ``python_files`` globs, which :mod:`.plugin` sets: the files
#: that hold the tests' own checks (:func:`.attribution.is_test_file`).
DEFAULT_TEST_FILES = ("test_*.py", "*_test.py")
test_files: list[tuple[str, ...]] = [DEFAULT_TEST_FILES]
