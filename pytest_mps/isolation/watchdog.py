"""The time limit of a test that runs in the main process.

A thread waits out the limit beside the test. Past it, the thread reads the
main thread's Python stack (``sys._current_frames``: the hung call's line, even
inside a C call that let go of the GIL, as torch's ops and synchronisations do)
and the last device op the test started, logs the test's failure, and ends the
session as pytest would: ``pytest_sessionfinish`` writes the junit file and the
terminal summary, then the process exits with status 1. Nothing can be run
after a call that never returns, so the session cannot go on: isolation
(``--mps-isolate``) can.

A C call that never returns *and* holds the GIL stops every Python thread;
faulthandler's C watchdog, armed 10 s past the limit, then dumps every thread's
stack and exits, with no reports written.

Under pytest-xdist the worker exits after logging the failure; the controller
reports the worker's crash and replaces it, and the session goes on.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import traceback
import types

import pytest

from pytest_mps.isolation import outcome, record
from pytest_mps.isolation.settings import Limit

#: How long past the limit faulthandler's own watchdog ends the process.
BACKSTOP = 10.0


def _stack_text(frame: types.FrameType | None) -> str:
    """The frames as faulthandler writes them (innermost first)."""
    lines = ["Main thread (most recent call first):"]
    for summary in reversed(traceback.extract_stack(frame)):
        lines.append(
            f'  File "{summary.filename}", line {summary.lineno} in {summary.name}'
        )
    return "\n".join(lines)


class Watchdog:
    """One test's limit in the main process: start before setup, stop after teardown."""

    def __init__(self, item: pytest.Item, limit: Limit) -> None:
        self.item = item
        self.limit = limit
        self.when = "setup"
        self._done = threading.Event()
        self._main = threading.get_ident()
        self._own_record = record.current[0] is None
        if self._own_record:
            record.current[0] = record.OpRecord()
        self._thread = threading.Thread(
            target=self._wait, name="pytest-mps-watchdog", daemon=True
        )
        faulthandler.dump_traceback_later(limit.seconds + BACKSTOP, exit=True)
        self._thread.start()

    def stop(self) -> None:
        """The test ended in time."""
        self._done.set()
        faulthandler.cancel_dump_traceback_later()
        if self._own_record:
            record.current[0] = None

    def _wait(self) -> None:
        if self._done.wait(self.limit.seconds):
            return
        try:
            self._expire()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def _expire(self) -> None:
        item, config = self.item, self.item.config
        stack_text = _stack_text(sys._current_frames().get(self._main))
        current = record.current[0]
        ends = (
            "this pytest-xdist worker exits (xdist reports its crash too, and "
            "starts another)"
            if hasattr(config, "workerinput")
            else "the session stops here, with its reports written"
        )
        what = (
            f"Timeout: the test ran past its limit of {self.limit.describe()} in "
            f"the main process; {ends} (under --mps-isolate it would have gone on)"
        )
        text = outcome.failure_text(
            what,
            None if current is None else current.read(),
            stack_text,
            str(config.rootpath),
            in_flight=True,
        )
        report = outcome.failure_report(item, self.when, text, stack_text, "timeout")
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        if hasattr(config, "workerinput"):
            return  # an xdist worker: the controller reports the crash, goes on
        session = item.session
        session.shouldfail = f"{item.nodeid} ran past its limit"
        config.hook.pytest_sessionfinish(
            session=session, exitstatus=pytest.ExitCode.TESTS_FAILED
        )
        config.hook.pytest_unconfigure(config=config)
