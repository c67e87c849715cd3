"""Where an op or a warning came from: the user's line, outside torch and pytest.

The lowest piece of the watching family: every watcher names the user's line
with :func:`user_location`, and reports make it relative with
:func:`relative_location`. Imports nothing of pytest-mps.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from functools import lru_cache

import pytest


@lru_cache(maxsize=1)
def _library() -> tuple[tuple[str, ...], frozenset[str]]:
    """Directories and stdlib files whose frames are never the user's code."""
    import functools
    import warnings

    import pluggy
    import torch

    dirs = [
        os.path.dirname(os.path.abspath(mod.__file__ or "")) + os.sep
        for mod in (torch, pluggy, pytest, sys.modules["pytest_mps"])
    ]
    # pytest's implementation lives next to the `pytest` package, in `_pytest`
    dirs.append(os.path.join(os.path.dirname(dirs[2][:-1]), "_pytest") + os.sep)
    files = frozenset(
        os.path.abspath(mod.__file__ or "") for mod in (contextlib, functools, warnings)
    )
    return tuple(dirs), files


_libraries: dict[str, bool] = {}


def is_library(filename: str) -> bool:
    """True for a file of torch, pytest, pluggy, pytest-mps or contextlib & co."""
    found = _libraries.get(filename)
    if found is None:
        dirs, files = _library()
        path = os.path.abspath(filename)
        found = _libraries[filename] = path.startswith(dirs) or path in files
    return found


def user_frame(start: types.FrameType | None = None) -> types.FrameType | None:
    """The innermost frame outside torch, pytest-mps, pytest and the stdlib."""
    frame: types.FrameType | None = start or sys._getframe(1)
    while frame is not None:
        if not is_library(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def called_by_pytest(start: types.FrameType | None) -> bool:
    """True when the innermost caller outside torch and pytest-mps is pytest's.

    pytest formats the values of a failing assertion (``repr(tensor)``) while
    the test's watch mode still runs; that read is pytest's, not the test's.
    """
    dirs, _ = _library()
    torch_dir, _, pytest_dir, ours, pytest_impl = dirs
    frame = start
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith((torch_dir, ours)):
            return path.startswith((pytest_dir, pytest_impl))
        frame = frame.f_back
    return False


def in_functions(
    frame: types.FrameType | None, functions: tuple[tuple[str, str], ...]
) -> bool:
    """True when ``frame`` runs one of ``functions``: (path suffix, name) pairs.

    The name matches the code's name or qualified name (``Trainer.evaluate``).
    """
    if frame is None or not functions:
        return False
    code = frame.f_code
    path = code.co_filename.replace("\\", "/")
    names = (code.co_name, getattr(code, "co_qualname", code.co_name))
    return any(
        name in names and (path == suffix or path.endswith("/" + suffix.lstrip("/")))
        for suffix, name in functions
    )


def user_location(start: types.FrameType | None = None) -> str:
    """``"path:line"`` of the user's code that runs now ("unknown" if none)."""
    frame = user_frame(start if start is not None else sys._getframe(1))
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def relative_location(location: str, root: os.PathLike[str] | str) -> str:
    """``location`` with its path made relative to ``root`` when inside it."""
    path, sep, line = location.rpartition(":")
    if not sep:
        return location
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return location
    return f"{location if rel.startswith('..') else rel + ':' + line}"
