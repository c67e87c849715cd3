"""The pytest process's side of an isolated test: start the child, wait, read.

The child starts from the fork server (:mod:`.server`) or, with
``--mps-isolate-start=fork``, by forking this process. Past the test's time
limit the child is sent SIGUSR1 (faulthandler dumps its Python stack, even
inside a C call), given a second to write it, then killed with SIGKILL.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import tempfile
import time

import pytest

from pytest_mps.isolation import child, outcome, settings
from pytest_mps.isolation.server import Client, ServerGone

#: The server of this session, started at collection's end when a test needs it.
server_key = pytest.StashKey[Client]()

#: How long a child has to dump its stack before SIGKILL, in seconds.
DUMP_GRACE = 1.0


def server(config: pytest.Config) -> Client:
    """The session's fork server, started now if it is not yet."""
    found = config.stash.get(server_key, None)
    if found is None:
        found = config.stash[server_key] = Client(config)
    return found


def stop_server(config: pytest.Config) -> None:
    found = config.stash.get(server_key, None)
    if found is not None:
        del config.stash[server_key]
        found.close()


class _Forked:
    """A child forked from this process: waited on by polling ``waitpid``."""

    def __init__(self, item: pytest.Item, paths: child.Paths) -> None:
        self.pid = os.fork()
        if self.pid == 0:
            child.run_then_exit(item, paths)
        self._pidfd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError:  # a kernel before 5.3
                self._pidfd = None

    def wait(self, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pidfd is not None:
            # Linux: the pidfd is readable once the child has exited
            select.select([self._pidfd], [], [], timeout)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self._pidfd)
                self._pidfd = None
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return None
        pause = 0.001
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.02)


class _Served:
    """A child forked by the server: its status comes over the server's pipe.

    With ``spawn`` the server is the child: a new one per test, run inline.
    """

    def __init__(self, item: pytest.Item, folder: str, spawn: bool = False) -> None:
        self.spawned = None
        if spawn:
            _, _, inside = item.nodeid.partition("::")
            only = f"{item.path}::{inside}" if inside else str(item.path)
            self.spawned = Client(item.config, inline=True, only=only)
        self.client = self.spawned or server(item.config)
        self.pid = self.client.start(item.nodeid, folder)

    def wait(self, timeout: float | None) -> int | None:
        return self.client.wait(timeout)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _dump_then_kill(process: _Forked | _Served, paths: child.Paths) -> int:
    """SIGUSR1 for a stack dump, a moment to write it, SIGKILL; the status."""
    _kill(process.pid, child.DUMP_SIGNAL)
    deadline = time.monotonic() + DUMP_GRACE
    size = -1
    while time.monotonic() < deadline:
        status = process.wait(0.05)
        if status is not None:
            return status
        now = os.path.getsize(paths.stack) if os.path.exists(paths.stack) else 0
        if now and now == size:
            break  # the dump is written and no longer growing
        size = now
    _kill(process.pid, signal.SIGKILL)
    status = process.wait(None)
    assert status is not None
    return status


def run(item: pytest.Item) -> list[pytest.TestReport]:
    """Run ``item`` in a child; its reports, or a failure saying how it ended."""
    config = item.config
    start = settings.start_method(config)
    limit = settings.limit_of(item)
    folder = tempfile.mkdtemp(prefix="pytest-mps-isolated-")
    paths = child.Paths.in_folder(folder)
    process: _Forked | _Served | None = None
    try:
        if start == "fork":
            child.warm()
        try:
            process = (
                _Forked(item, paths)
                if start == "fork"
                else _Served(item, folder, spawn=start == "spawn")
            )
        except ServerGone as exc:
            found = config.stash.get(server_key, None)
            if found is None or not found.broken:
                stop_server(config)  # the next test starts a new one
            return [_server_failure(item, str(exc))]
        try:
            status = process.wait(None if limit is None else limit.seconds)
        except KeyboardInterrupt:
            _kill(process.pid, signal.SIGKILL)
            process.wait(None)
            raise
        except ServerGone as exc:
            stop_server(config)
            done = child.read_reports(config, paths.results)
            what = f"the isolation server died while the test ran: {exc}"
            return [
                *done,
                outcome.death_report(
                    item, done, what, paths.record, paths.stack, "crash:server"
                ),
            ]
        timed_out = status is None
        if status is None:
            assert limit is not None
            status = _dump_then_kill(process, paths)
        done = child.read_reports(config, paths.results)
        if timed_out:
            what = outcome.timeout_what(limit, start)  # type: ignore[arg-type]
            return [
                *done,
                outcome.death_report(
                    item, done, what, paths.record, paths.stack, "timeout", True
                ),
            ]
        if done and done[-1].when == "teardown":
            _explain_cuda_refusal(done, start)
            return done  # every phase ran: how the child then exited is no news
        what = outcome.crash_what(status, start)
        return [
            *done,
            outcome.death_report(
                item, done, what, paths.record, paths.stack, outcome.crash_kind(status)
            ),
        ]
    finally:
        if isinstance(process, _Served) and process.spawned is not None:
            process.spawned.close()
        shutil.rmtree(folder, ignore_errors=True)


_CUDA_REFUSED = "Cannot re-initialize CUDA in forked subprocess"


def _explain_cuda_refusal(reports: list[pytest.TestReport], start: str) -> None:
    """Say why a child refused CUDA, on the report that shows the refusal."""
    for report in reports:
        if report.failed and _CUDA_REFUSED in str(report.longrepr):
            why = (
                "the pytest process had asked the CUDA driver (torch.cuda."
                "is_available(), device_count()) or started CUDA before forking: "
                "--mps-isolate-start=forkserver forks from a process that has not"
                if start == "fork"
                else "the fork server's collection started CUDA, or asked the "
                "CUDA driver with PYTORCH_NVML_BASED_CUDA_CHECK=0: make CUDA start "
                "inside the tests, or use --mps-isolate-start=spawn"
            )
            report.sections.append(("pytest-mps isolation", f"{_CUDA_REFUSED}: {why}"))


def _server_failure(item: pytest.Item, text: str) -> pytest.TestReport:
    def fail() -> None:
        pytest.fail(
            f"the test could not start in the isolation server: {text}", pytrace=False
        )

    call = pytest.CallInfo.from_call(fail, when="setup")
    report: pytest.TestReport = item.ihook.pytest_runtest_makereport(
        item=item, call=call
    )
    return report
