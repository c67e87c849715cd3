"""A session's manifest of known failures, registered as a plugin while it runs.

:mod:`.plugin` registers it when ``--mps-known-failures`` (or its ini key) names
a manifest; a run without one loads none of this.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

#: The failure's exception type and device, on a failed report.
PROPERTY = "pytest_mps.failure"


class State:
    """The manifest of this session and what the run found against it.

    Registered as a plugin for the session (its hooks run on the xdist
    controller too, where the summary is printed and the file written).
    """

    def __init__(
        self, config: pytest.Config, path: str, where: str, device: str
    ) -> None:
        import os

        from pytest_mps.known_failures import manifest

        self.config = config
        self.path = path
        #: the session's first device type, for tests not parametrized on one
        self.device = device
        relative = os.path.relpath(path, config.invocation_params.dir)
        #: the path as the messages show it
        self.shown = path if relative.startswith("..") else relative
        self.writing = bool(config.getoption("mps_known_failures_write", None))
        self.entries: dict[tuple[str, str], manifest.Entry] = {}
        #: the file as read: its format (kept when it is refreshed)
        self.read = manifest.Manifest([])
        if os.path.exists(path):
            try:
                self.read = manifest.read(path)
            except (manifest.ManifestError, OSError) as exc:
                raise pytest.UsageError(f"{where}: {exc}") from None
            self.entries = {(e.nodeid, e.device): e for e in self.read.entries}
        elif not self.writing:
            raise pytest.UsageError(
                f"{where}: {path} does not exist; write it from a run with "
                "--mps-known-failures-write"
            )
        #: (nodeid, device) -> exception type, of this run's failures
        self.failed: dict[tuple[str, str], str] = {}
        self.ran: set[str] = set()
        self.xfailed = 0
        self.changes: list[str] = []
        self.written: int | None = None

    def entry(self, nodeid: str, device: str) -> Any:
        """The entry for this test on this device, or None."""
        return self.entries.get((nodeid, device)) or self.entries.get((nodeid, "*"))

    def pytest_report_header(self) -> str:
        """The manifest's path and size."""
        writing = "; writing it at the end (--mps-known-failures-write)"
        return (
            f"pytest-mps known failures: {len(self.entries)} listed in {self.shown}"
            f" ({self.read.describe()}){writing if self.writing else ''}"
        )

    def _device(self, item: pytest.Item) -> str:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("device") is not None:
            return str(callspec.params["device"]).split(":")[0]
        return self.device

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """An xfail where the failure is as listed; a failure where it changed."""
        report = yield
        from pytest_mps.known_failures.manifest import exception_name

        device = self._device(item)
        entry = self.entry(item.nodeid, device)
        if call.excinfo is not None and report.failed:
            name = exception_name(call.excinfo.value)
            text = str(call.excinfo.value)
            report.user_properties.append((PROPERTY, {"type": name, "device": device}))
            if entry is None:
                return report
            if entry.matches(name, text):
                report.outcome = "skipped"
                listed = f"{entry.describe()} (line {entry.line})"
                report.wasxfail = f"known failure: {listed}"
                return report
            first = text.strip().splitlines()[0][:200] if text.strip() else ""
            report.sections.append(
                (
                    CHANGED,
                    f"{item.nodeid} is listed ({self.shown}:{entry.line}) as "
                    f"failing with {entry.describe()} but failed with {name}: {first}",
                )
            )
            return report
        if entry is None:
            return report
        listed = f"listed as a known failure ({entry.describe()}, {self.shown}:"
        listed += f"{entry.line})"
        if report.skipped and not hasattr(report, "wasxfail"):
            _fail(report, f"{item.nodeid} is {listed} but was skipped: update the file")
        elif call.when == "call" and report.passed:
            _fail(
                report,
                f"{item.nodeid} is {listed} but passed now: remove its line "
                "(or refresh with --mps-known-failures-write)",
            )
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Note the test's failure type, or what changed."""
        self.ran.add(report.nodeid)
        failure = None
        for name, value in report.user_properties:
            if name == PROPERTY and isinstance(value, dict):
                failure = value
        if failure is not None:
            key = (report.nodeid, str(failure["device"]))
            self.failed.setdefault(key, str(failure["type"]))
            if hasattr(report, "wasxfail"):
                self.xfailed += 1
                return
        changed = _changed_line(report)
        if changed:
            self.changes.append(changed)

    def pytest_sessionfinish(self) -> None:
        """Write the file, with --mps-known-failures-write (never on a worker)."""
        if not self.writing or hasattr(self.config, "workerinput"):
            return
        from pytest_mps.known_failures import manifest

        kept = [e for e in self.entries.values() if e.nodeid not in self.ran]
        new = []
        tabs = self.read.style == manifest.TABS
        for (nodeid, device), exception in self.failed.items():
            if tabs:  # one device per file, as its name says
                listed_for = manifest.file_device(self.path)[0]
                if listed_for not in ("*", device):
                    continue  # a failure on another device is not this file's
                device = listed_for
            old = self.entries.get((nodeid, device))
            message = old.message if old and old.exception == exception else ""
            new.append(manifest.Entry(nodeid, exception, device, message))
        manifest.write(self.path, kept + new, self.read.style)
        self.written = len(kept) + len(new)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One line per change, and the counts."""
        write = terminalreporter.write_line
        if self.changes:
            terminalreporter.section("pytest-mps known failures", sep="-", red=True)
            for line in self.changes:
                write(line)
        tail = ""
        if self.written is not None:
            tail = f"; wrote {self.written} lines to {self.shown}"
        write(
            f"pytest-mps known failures: {self.xfailed} failed as listed in "
            f"{self.shown}, {len(self.changes)} changed{tail}"
        )


CHANGED = "pytest-mps known failure changed"


def _changed_line(report: pytest.TestReport) -> str:
    for title, text in report.sections:
        if title == CHANGED:
            return text
    return ""


def _fail(report: pytest.TestReport, text: str) -> None:
    report.outcome = "failed"
    report.longrepr = text
    report.sections.append((CHANGED, text))
    if hasattr(report, "wasxfail"):
        del report.wasxfail
