"""A small process that says which test was running when pytest itself died.

A test that Metal aborts in the pytest process (not isolated) ends the session
on the spot: nothing in the process can run after SIGABRT or SIGSEGV but
faulthandler's C handler, which writes the Python stack and nothing else. So
when a session asks for pytest-mps's CI settings (a time limit, isolation or a
known-failure manifest), faulthandler writes to a pipe read by this sidecar,
and the pytest process writes each test's node id to a second pipe as the test
starts. When a stack arrives, the sidecar prints, on the session's stderr::

    pytest-mps: the pytest process died while running tests/test_x.py::test_mm[mps]
    Fatal Python error: Aborted
    ...

and then the stack. When both pipes close without a stack, the session ended
normally, and the sidecar exits without a word. It imports nothing but the
standard library.
"""

from __future__ import annotations

import faulthandler
import os
import select
import subprocess
import sys
from typing import IO


class Sidecar:
    """The pytest process's end: the pipes, and the sidecar process."""

    def __init__(self) -> None:
        dumps_read, dumps_write = os.pipe()
        tests_read, self._tests = os.pipe()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-S",  # no site: nothing but the standard library, at once
                os.path.abspath(__file__),  # as a script: no pytest_mps, no pytest
                str(dumps_read),
                str(tests_read),
            ],
            pass_fds=(dumps_read, tests_read),
            stdin=subprocess.DEVNULL,
        )
        os.close(dumps_read)
        os.close(tests_read)
        self.dumps: IO[str] = os.fdopen(dumps_write, "w")
        self.was_enabled = False

    def enable(self) -> None:
        """Point faulthandler at the sidecar (after pytest's faulthandler set up)."""
        self.was_enabled = faulthandler.is_enabled()
        faulthandler.enable(file=self.dumps, all_threads=True)

    def running(self, nodeid: str) -> None:
        """The test ``nodeid`` starts now."""
        try:
            os.write(self._tests, (nodeid.replace("\n", " ") + "\n").encode())
        except OSError:
            pass  # the sidecar is gone: the session itself goes on

    def close(self) -> None:
        """The session ended: faulthandler back to stderr, the sidecar told."""
        faulthandler.disable()
        if self.was_enabled and sys.__stderr__ is not None:
            # the process's own stderr: sys.stderr may be a capture's file now
            faulthandler.enable(file=sys.__stderr__, all_threads=True)
        self.dumps.close()
        os.close(self._tests)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main(dumps: int, tests: int) -> None:
    """The sidecar: remember the running test; print it before a stack."""
    running = ""
    pending = b""
    said = False
    open_fds = [dumps, tests]
    while open_fds:
        readable, _, _ = select.select(open_fds, [], [])
        for fd in readable:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                continue
            if fd == tests:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if lines:
                    running = lines[-1].decode("utf-8", "replace")
                continue
            if not said:
                where = f"while running {running}" if running else "before any test ran"
                os.write(2, f"pytest-mps: the pytest process died {where}\n".encode())
                said = True
            os.write(2, chunk)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
