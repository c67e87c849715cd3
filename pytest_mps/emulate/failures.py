"""How an emulated test's failure reads: the user's line and PyTorch's message.

A refusal the emulation raises inside a torch function keeps only the user's
frames (:func:`without_library_frames`); a ``NotEmulatedError`` is one line
at the user's frame that called (:func:`one_line`); any other failure gets
a line naming what it touched that is not emulated, if anything
(:func:`name_unreproduced`).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

#: pytest_mps/emulate/: an error raised in a file here is the emulation's
_EMULATE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def without_library_frames(
    config: pytest.Config, excinfo: pytest.ExceptionInfo[BaseException]
) -> Any | None:
    """An error the emulation raised, shown with the user's frames only; or None.

    A refusal raised inside a torch function (``F.cross_entropy``) otherwise
    shows ``torch/overrides.py`` with its docstring, about 90 lines, before
    PyTorch's message. For an error raised in the emulation's code, the
    failure keeps the frames outside torch, pytest and pytest-mps, and the
    message, which is PyTorch's, as on a Mac. pytest's own filter cannot be
    given the shorter traceback (it cuts at the test function, which walks the
    frames again), so the failure is formatted here, in the style pytest's
    default would use; ``--tb`` other than auto and long, and ``--full-trace``,
    are left as they are.
    """
    from pytest_mps.watch.locations import is_library

    if config.getoption("fulltrace", False) or config.getoption(
        "tbstyle", "auto"
    ) not in ("auto", "long"):
        return None
    entries = list(excinfo.traceback)
    if not any(
        os.path.abspath(str(entry.path)).startswith(_EMULATE_DIR) for entry in entries
    ):
        return None
    kept = excinfo.traceback.filter(lambda entry: not is_library(str(entry.path)))
    if not kept:
        return None
    excinfo.traceback = kept
    return excinfo.getrepr(
        funcargs=True,
        showlocals=bool(config.getoption("showlocals", False)),
        style="long",
        tbfilter=False,
        truncate_locals=config.get_verbosity() <= 1,
    )


def one_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """``path:line: NotEmulatedError: ...`` at the user's frame that called."""
    from pytest_mps.watch.locations import is_library

    where = ""
    for entry in reversed(excinfo.traceback):
        if not is_library(str(entry.path)):
            where = f"{entry.path}:{entry.lineno + 1}: "
            break
    return f"{where}{type(excinfo.value).__name__}: {excinfo.value}"


def name_unreproduced(report: pytest.TestReport) -> None:
    """Add one line naming what a failed test touched that is not emulated.

    unittest's "Unexpected success" (a test PyTorch marks as failing on a
    Mac, passing here) reads ``Unexpected success: not emulated by
    pytest-mps ...``; a traceback gets the line as a section of its own,
    which the terminal and the JUnit XML's failure text both show.
    """
    from pytest_mps.emulate import unreproduced

    found = unreproduced.line()
    if found is None:
        return
    title, text = found
    longrepr = report.longrepr
    # a traceback's repr (pytest's ExceptionRepr) keeps sections of its own
    addsection = getattr(longrepr, "addsection", None)
    if isinstance(longrepr, str) and title == "not emulated":
        joint = ": " if longrepr in ("Unexpected success", "") else "; "
        report.longrepr = f"{longrepr}{joint}{text}" if longrepr else text
    elif callable(addsection):
        addsection(f"pytest-mps emulate: {title}", text)
    else:
        report.sections.append((f"pytest-mps emulate: {title}", text))
