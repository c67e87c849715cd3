"""The end of the session, bounded: a hang after the last test ends the process.

The per-test limit (``--mps-timeout``) ends at a test's teardown; what comes
after the last one, other plugins' ``pytest_unconfigure``, ``atexit``
handlers, non-daemon threads, C++ destructors, a Metal command queue that
never signals, can hold the process for hours with every result already
written (mono/SkiaSharp#4598; JustVugg/colibri#947). With a limit set, once
the session finishes (pytest-mps's ``pytest_sessionfinish`` runs last, after
the junit file is written and before the terminal summary) a watchdog
starts: if the process is still alive after the limit (at least
:data:`FLOOR` seconds), it prints why, dumps
every thread's stack and ends the process with the session's own exit
status. faulthandler's timer, which needs no GIL, ends it 10 s later if the
watchdog's Python thread cannot run.

Only the outermost session of a process arms it (a session run inside a test,
as pytester's in-process runs, leaves its process to the outer one), and
never the isolation's fork server or an isolated test's child.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import pytest

#: The sessions configured in this process and not yet unconfigured.
_live: set[int] = set()
#: Seconds faulthandler waits past the limit if the watchdog cannot run.
BACKSTOP = 10.0
#: The least time the session's end gets, whatever the per-test limit: the
#: terminal summary and other plugins' reports (pytest-cov's) come after
#: the watchdog starts, and a short per-test limit is no bound for them.
FLOOR = 20.0


def configured(config: pytest.Config) -> None:
    """Count ``config`` as a live session of this process."""
    _live.add(id(config))


def unconfigured(config: pytest.Config) -> None:
    """``config``'s session is over."""
    _live.discard(id(config))


def session_finished(config: pytest.Config, status: int) -> None:
    """Arm the watchdog where ``config`` is this process's only live session.

    Called last at ``pytest_sessionfinish``: after the junit file is written,
    before the terminal summary (a wrapper of that hook), so every other
    plugin's ``pytest_unconfigure`` comes after.
    """
    from pytest_mps.isolation import settings

    limit = settings.session_limit(config)
    if limit is None or _live - {id(config)} or _in_isolation():
        return
    arm(max(limit.seconds, FLOOR), limit.where, status)


def _in_isolation() -> bool:
    server = sys.modules.get("pytest_mps.isolation.server")
    child = sys.modules.get("pytest_mps.isolation.child")
    return bool(
        (server is not None and server.serving[0])
        or (child is not None and child.in_child[0])
    )


def arm(limit: float, where: str, status: int) -> None:
    """End the process ``limit`` seconds from now, with ``status``, if it lives."""
    started = time.monotonic()

    def watch() -> None:
        time.sleep(limit)
        waited = time.monotonic() - started
        sys.stderr.write(
            f"\npytest-mps isolation: the process did not end within {waited:.0f} s "
            f"of the session's end ({where}): a hang after the last test (a "
            "plugin's pytest_unconfigure, an atexit handler, a non-daemon thread, "
            "a device queue that never signals); the results were written. Each "
            f"thread's stack follows; the process ends with the session's exit "
            f"status {status}.\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(status)

    threading.Thread(target=watch, name="pytest-mps shutdown", daemon=True).start()
    faulthandler.dump_traceback_later(limit + BACKSTOP, exit=True)
