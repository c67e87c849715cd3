"""What a child that died, or was killed at its time limit, is reported as.

The failure is made by pytest's own ``pytest_runtest_makereport`` from a
``pytest.fail(..., pytrace=False)``, so it reads as one message (the short
summary shows its first line), and markers such as ``xfail`` apply to it as to
any failure.
"""

from __future__ import annotations

import os
import re
import signal
import sysconfig

import pytest

from pytest_mps.isolation import record
from pytest_mps.isolation.settings import Limit

PHASES = ("setup", "call", "teardown")
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def describe_status(status: int) -> str:
    """``"SIGABRT (signal 6)"`` or ``"exit code 3"`` for a ``waitpid`` status."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{name} (signal {-code}, exit status {128 - code} in a shell)"
    return f"exit code {code}"


def _is_library(path: str) -> bool:
    if path.startswith(_STDLIB):
        return True  # ctypes, threading: the user's line is the caller's
    try:
        from pytest_mps.watch.locations import is_library
    except ImportError:  # no torch: only pytest's and our own frames are library
        return "/_pytest/" in path or "/pluggy/" in path or "/pytest_mps/" in path
    return is_library(path)


def user_frames(stack_text: str, root: str) -> list[str]:
    """``path:line in function`` of the user's frames in a faulthandler dump.

    faulthandler writes the innermost frame first; the first thread it lists is
    the one that crashed or was current.
    """
    frames: list[str] = []
    for line in stack_text.splitlines():
        if frames and not line.strip():
            break  # the end of the first thread's stack
        match = _FRAME.match(line)
        if match is None or match["path"].startswith("<"):
            continue
        if frames and f"{os.sep}_pytest{os.sep}" in match["path"]:
            break  # below the test: pytest's and the runner's frames
        if _is_library(match["path"]):
            continue
        path = os.path.relpath(match["path"], root)
        if path.startswith(".."):
            path = match["path"]
        frames.append(f"{path}:{match['line']} in {match['name']}")
    return frames


def trim_stack(stack_text: str) -> str:
    """The dump without the frames that only start the child, nor the module list.

    A thread's frames end at the first frame of pytest-mps's isolation (the
    child's runner); what is below it is the same for every test.
    """
    kept: list[str] = []
    skipping = False
    for line in stack_text.splitlines():
        if line.startswith("Extension modules:"):
            continue
        if not line.startswith("  "):
            skipping = False  # a thread's header, or the blank line after it
        elif f"{os.sep}pytest_mps{os.sep}isolation{os.sep}" in line:
            skipping = True
        if not skipping:
            kept.append(line)
    return "\n".join(kept).strip()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def failure_text(
    what: str,
    last_op: tuple[str, str] | None,
    stack_text: str,
    root: str,
    in_flight: bool,
) -> str:
    """The message: what happened, the device op, the user's line, the stack."""
    lines = [what]
    if last_op is not None:
        op, where = last_op
        if where:
            path, _, line = where.rpartition(":")
            relative = os.path.relpath(path, root)
            where = f"{path if relative.startswith('..') else relative}:{line}"
        kind = (
            "device op in flight (or the last it started)"
            if in_flight
            else ("last device op it started")
        )
        lines.append(f"{kind}: {op} at {where or 'an unknown line'}")
    else:
        lines.append("it started no device op")
    frames = user_frames(stack_text, root)
    if frames:
        when = "at the limit" if in_flight else "when it died"
        lines.append(f"its code {when}: {frames[0]}")
        lines.extend(f"  called from {frame}" for frame in frames[1:4])
    return "\n".join(lines)


def failure_report(
    item: pytest.Item, when: str, text: str, stack_text: str, kind: str
) -> pytest.TestReport:
    """A failure of ``item`` in phase ``when``, made by pytest's own makereport.

    ``kind`` (``crash:SIGABRT``, ``timeout``) is what a known-failure manifest
    calls the failure's type.
    """

    def fail() -> None:
        exc = pytest.fail.Exception(text, pytrace=False)
        exc.mps_failure_type = kind  # type: ignore[attr-defined]
        raise exc

    call = pytest.CallInfo.from_call(fail, when=when)  # type: ignore[arg-type]
    report: pytest.TestReport = item.ihook.pytest_runtest_makereport(
        item=item, call=call
    )
    shown = trim_stack(stack_text)
    if shown:
        report.sections.append((f"pytest-mps stack ({when})", shown))
    return report


def death_report(
    item: pytest.Item,
    done: list[pytest.TestReport],
    what: str,
    paths_record: str,
    paths_stack: str,
    kind: str,
    in_flight: bool = False,
) -> pytest.TestReport:
    """A failure report for the phase the child did not finish."""
    finished = {report.when for report in done}
    when = next((phase for phase in PHASES if phase not in finished), "teardown")
    stack_text = _read(paths_stack)
    last_op = record.read_file(paths_record)
    root = str(item.config.rootpath)
    text = failure_text(what, last_op, stack_text, root, in_flight)
    return failure_report(item, when, text, stack_text, kind)


def crash_kind(status: int) -> str:
    """``crash:SIGABRT``, or ``crash:exit-3`` for a child that exited early."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"crash:{signal.Signals(-code).name}"
        except ValueError:
            return f"crash:signal-{-code}"
    return f"crash:exit-{code}"


def crash_what(status: int, start: str) -> str:
    """First line for a child that died on its own."""
    return f"{describe_status(status)}: the test's child process ({start}) died"


def timeout_what(limit: Limit, start: str) -> str:
    """First line for a child killed at its limit."""
    return (
        f"Timeout: the test ran past its limit of {limit.describe()}; its child "
        f"process ({start}) was killed and the session goes on"
    )
