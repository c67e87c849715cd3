"""Whose work an op is: the plugin's own, the test's checks, or the code under test.

The audit and the watchers report the code under test only. Two kinds of
work are told apart from it here, for every watcher alike:

- **The plugin's own work** (:func:`plugin_work`): parity's CPU reference and
  its float64 comparison, copies back to the host, our timers and memory
  probes. The watch modes let it run unwatched; :func:`user_code` hands a
  block inside it back to the watchers (the device side of a parity check
  runs the user's model).
- **The test's own checks** (:data:`TEST`): an op that runs under
  ``torch.testing``, ``numpy.testing`` or ``unittest``; and a read back to
  the host (:data:`ASSERT`: host syncs only) whose innermost user frame is
  inside an ``assert`` statement of a test file (pytest's rewritten asserts
  keep the statement's positions) or inside the arguments of an ``assert*``
  call there (``assert_close``, ``self.assertEqual``; a lambda passed to one
  is code under test). Float64, a missing kernel or mixed devices in an
  assert break it on MPS as anywhere: those are the code's. Only the
  innermost user frame counts: the code an assert calls (``assert
  model(x).shape == ...``, ``assert helper(x)``) is still the code under
  test; a generator expression in the assert is part of it.
- **The device side of a parity check** (:func:`user_code`) is always the
  code under test, even where the code is torch's own (``torch.frexp``,
  ``nn.Linear``) and the innermost user frame is the ``assert_device_parity``
  call.

:func:`whose` classifies a frame; test files are those pytest collects
(``python_files``, default ``test_*.py`` and ``*_test.py``) and ``conftest.py``.
Light on purpose: the watch front door imports it at start-up.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import types
from collections.abc import Iterator
from typing import Any

from pytest_mps.watch import test_files
from pytest_mps.watch.locations import is_library

#: The code under test.
CODE = "code"
#: The test's own checks: asserts, torch.testing, unittest's assert methods.
TEST = "test"
#: The plugin's own work.
PLUGIN = "plugin"
#: Inside a test's own assert: its reads are the test's (:data:`TEST`), the
#: rest the code's (:func:`side_for`).
ASSERT = "assert"

#: The finding kind that an assert's reads make.
HOST_SYNC = "host-sync"

#: Whether the plugin's own work runs now; read by every watch mode per op,
#: so a one-item list rather than a function call.
plugin_running = [False]
#: Whether the device side of a parity check runs now: the code under test.
code_running = [False]

# torch.testing's comparisons (assert_close, TestCase.assertEqual), not the
# rest of torch.testing._internal: op_db's OpInfos run the ops under test there
_TESTING_MODULES = (
    "torch.testing._comparison",
    "torch.testing._internal.common_utils",
    "numpy.testing",
    "unittest",
)
#: by file name, for the globs it was found with (settings.test_files)
_is_test_file: dict[tuple[tuple[str, ...], str], bool] = {}


@contextlib.contextmanager
def plugin_work() -> Iterator[None]:
    """Mark the block as the plugin's own work: no watcher sees its ops."""
    saved = plugin_running[0]
    plugin_running[0] = True
    try:
        yield
    finally:
        plugin_running[0] = saved


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Inside :func:`plugin_work`, run the block as the code under test, watched."""
    saved = plugin_running[0], code_running[0]
    plugin_running[0], code_running[0] = False, True
    try:
        yield
    finally:
        plugin_running[0], code_running[0] = saved


def in_plugin_work() -> bool:
    """True while the plugin's own work runs (see :func:`plugin_work`)."""
    return plugin_running[0]


def is_test_file(filename: str) -> bool:
    """True for a file pytest collects tests from, or a ``conftest.py``.

    The session's ``python_files`` globs are ``pytest_mps.watch.test_files``,
    which the watch family's front door sets.
    """
    key = (test_files[0], filename)
    found = _is_test_file.get(key)
    if found is None:
        name = os.path.basename(filename)
        found = name == "conftest.py" or any(fnmatch.fnmatch(name, p) for p in key[0])
        _is_test_file[key] = found
    return found


def whose(start: types.FrameType | None) -> tuple[str, types.FrameType | None]:
    """Whose work runs at ``start``, and the user's frame (None where none).

    ``start`` is any frame of the running op (the watch mode's or deeper).
    :data:`ASSERT` is a side to resolve per finding with :func:`side_for`.
    """
    if plugin_running[0]:
        return PLUGIN, None
    frame = start
    testing = False
    while frame is not None and is_library(frame.f_code.co_filename):
        testing = testing or _in_testing_module(frame)
        frame = frame.f_back
    if code_running[0]:
        return CODE, frame
    if frame is None:
        return (TEST if testing else CODE), None
    if testing or _in_testing_module(frame):
        return TEST, frame
    # only the innermost user frame: a helper called from an assert may be
    # running the code under test (assert run(snippet) == expected)
    if is_test_file(frame.f_code.co_filename) and _in_check(frame):
        return ASSERT, frame
    return CODE, frame


def side_for(side: str, kind: str) -> str:
    """The side a ``kind`` finding made on ``side`` counts on: code or test."""
    if side == ASSERT:
        return TEST if kind == HOST_SYNC else CODE
    return side


def _in_testing_module(frame: types.FrameType) -> bool:
    name = frame.f_globals.get("__name__", "")
    return isinstance(name, str) and (
        name == "torch.testing" or name.startswith(_TESTING_MODULES)
    )


# -- is a frame inside an assert? ------------------------------------------------

#: (code, last instruction) -> inside an assert or an assert* call's arguments
_checks: dict[tuple[types.CodeType, int], bool] = {}
#: filename -> spans: (start, end, lambdas inside that do not count)
_spans: dict[str, list[tuple[Any, Any, list[tuple[Any, Any]]]]] = {}


def _in_check(frame: types.FrameType) -> bool:
    code = frame.f_code
    key = (code, frame.f_lasti)
    found = _checks.get(key)
    if found is None:
        found = _checks[key] = _position_in_check(frame)
    return found


def _position(frame: types.FrameType) -> tuple[int, int | None]:
    """(line, column) of the frame's current instruction; column None if unknown."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None and frame.f_lasti >= 0:
        for index, (line, _, col, _) in enumerate(positions()):
            if index == frame.f_lasti // 2:
                if line is not None:
                    return line, col
                break
    return frame.f_lineno, None


def _position_in_check(frame: types.FrameType) -> bool:
    spans = _file_spans(frame.f_code.co_filename, frame.f_globals)
    if not spans:
        return False
    line, col = _position(frame)

    def inside(start: Any, end: Any) -> bool:
        if col is None:
            return bool(start[0] <= line <= end[0])
        return bool(start <= (line, col) < end)

    return any(
        inside(start, end) and not any(inside(a, b) for a, b in lambdas)
        for start, end, lambdas in spans
    )


def _file_spans(
    filename: str, module_globals: dict[str, Any]
) -> list[tuple[Any, Any, list[tuple[Any, Any]]]]:
    found = _spans.get(filename)
    if found is not None:
        return found
    import ast
    import linecache

    source = "".join(linecache.getlines(filename, module_globals))
    found = []
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assert):
            found.append((_start(node), _end(node), []))
        elif isinstance(node, ast.Call) and _assert_name(node.func):
            # a lambda handed to an assert* helper runs later, as code under
            # test (assert_device_parity(lambda x: ..., x))
            lambdas = [
                (_start(n), _end(n))
                for arg in (*node.args, *(k.value for k in node.keywords))
                for n in ast.walk(arg)
                if isinstance(n, ast.Lambda)
            ]
            found.append((_start(node), _end(node), lambdas))
    _spans[filename] = found
    return found


def _assert_name(func: Any) -> bool:
    import ast

    if isinstance(func, ast.Attribute):
        return func.attr.startswith("assert")
    return isinstance(func, ast.Name) and func.id.startswith("assert")


def _start(node: Any) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _end(node: Any) -> tuple[int, int]:
    return node.end_lineno or node.lineno, node.end_col_offset or 1 << 30
