"""Known failures pinned in a manifest: xfail as listed, fail the run on any change.

``--mps-known-failures=PATH`` reads the manifest (:mod:`.manifest`); the path may
hold ``{device}`` (the session's device type: mps under ``--mps-emulate``) and
``{macos}`` (the macOS major version, the emulated one under ``--mps-emulate``,
``none`` off a Mac), so a project keeps one file per device and macOS release.
A listed test that fails with the listed type (and message substring) on the
listed device is reported as an xfail; one that passes, is skipped, or fails
another way fails with a one-line reason. ``--mps-known-failures-write`` writes
the file from the run, on the controller under pytest-xdist: the exception type
of each failure travels on its report's ``user_properties``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_mps import ownership

PATH_HELP = (
    "a manifest of known failures (node id | exception type | device | message "
    "substring): a listed test failing that way is an xfail; one that passes, is "
    "skipped or fails another way fails the run. {device} and {macos} in the "
    "path pick a file per device type and macOS major version"
)
WRITE_HELP = (
    "write (or refresh) the --mps-known-failures file from this run's failures, "
    "sorted; lines of tests this run did not run are kept"
)
#: The failure's exception type and device, on a failed report.
PROPERTY = "pytest_mps.failure"
_state_key = pytest.StashKey["State"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(ownership.GROUP)
    group.addoption(
        "--mps-known-failures",
        dest="mps_known_failures",
        metavar="PATH",
        default=None,
        help=PATH_HELP,
    )
    group.addoption(
        "--mps-known-failures-write",
        dest="mps_known_failures_write",
        action="store_true",
        default=None,
        help=WRITE_HELP,
    )
    parser.addini("mps_known_failures", PATH_HELP, default=None)


def _macos_major(config: pytest.Config) -> str:
    from pytest_mps.backend import macos_version
    from pytest_mps.devices import emulated

    if emulated(config):
        from pytest_mps.audit.settings import NEWEST_MACOS
        from pytest_mps.emulate.plugin import _macos

        macos = _macos(config)
        return "newest" if macos == NEWEST_MACOS else str(macos[0])
    version = macos_version()
    return version.split(".")[0] if version else "none"


def session_device(config: pytest.Config) -> str:
    """The session's first device type (``mps``, ``cuda``, ``cpu``)."""
    from pytest_mps.devices import devices_key

    devices = config.stash.get(devices_key, None) or ["cpu"]
    return str(devices[0]).split(":")[0]


def manifest_path(config: pytest.Config) -> tuple[str, str] | None:
    """``(path, where it was set)`` with its placeholders filled in, or None."""
    value = config.getoption("mps_known_failures", None)
    where = f"--mps-known-failures={value}"
    if value is None:
        value = config.getini("mps_known_failures")
        where = f"mps_known_failures in {config.inipath}"
        if not value:
            return None
    try:
        path = str(value).format(
            device=session_device(config), macos=_macos_major(config)
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise pytest.UsageError(
            f"{where}: the path's placeholders are {{device}} and {{macos}}, not {exc}"
        ) from None
    return str(config.invocation_params.dir / path), where


class State:
    """The manifest of this session and what the run found against it.

    Registered as a plugin for the session (its hooks run on the xdist
    controller too, where the summary is printed and the file written).
    """

    def __init__(self, config: pytest.Config, path: str, where: str) -> None:
        import os

        from pytest_mps.known_failures import manifest

        self.config = config
        self.path = path
        relative = os.path.relpath(path, config.invocation_params.dir)
        #: the path as the messages show it
        self.shown = path if relative.startswith("..") else relative
        self.writing = bool(config.getoption("mps_known_failures_write", None))
        self.entries: dict[tuple[str, str], manifest.Entry] = {}
        if os.path.exists(path):
            try:
                listed = manifest.read(path)
            except (manifest.ManifestError, OSError) as exc:
                raise pytest.UsageError(f"{where}: {exc}") from None
            self.entries = {(e.nodeid, e.device): e for e in listed}
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
        for (nodeid, device), exception in self.failed.items():
            old = self.entries.get((nodeid, device))
            message = old.message if old and old.exception == exception else ""
            new.append(manifest.Entry(nodeid, exception, device, message))
        manifest.write(self.path, kept + new)
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


@pytest.hookimpl(trylast=True)  # after devices.py has resolved the devices
def pytest_configure(config: pytest.Config) -> None:
    found = manifest_path(config)
    writing = bool(config.getoption("mps_known_failures_write", None))
    if found is None:
        if writing:
            raise pytest.UsageError(
                "--mps-known-failures-write: give the file with "
                "--mps-known-failures=PATH (or the mps_known_failures ini key)"
            )
        return
    state = config.stash[_state_key] = State(config, *found)
    config.pluginmanager.register(state, "pytest-mps-known-failures")


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(_state_key, None)
    if state is None:
        return None
    writing = "; writing it at the end (--mps-known-failures-write)"
    return (
        f"pytest-mps known failures: {len(state.entries)} listed in {state.shown}"
        f"{writing if state.writing else ''}"
    )


def _device(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("device") is not None:
        return str(callspec.params["device"]).split(":")[0]
    return session_device(item.config)


def _fail(report: pytest.TestReport, text: str) -> None:
    report.outcome = "failed"
    report.longrepr = text
    report.sections.append((CHANGED, text))
    if hasattr(report, "wasxfail"):
        del report.wasxfail


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    state = item.config.stash.get(_state_key, None)
    if state is None:
        return report
    from pytest_mps.known_failures.manifest import exception_name

    device = _device(item)
    entry = state.entry(item.nodeid, device)
    if call.excinfo is not None and report.failed:
        name = exception_name(call.excinfo.value)
        text = str(call.excinfo.value)
        report.user_properties.append((PROPERTY, {"type": name, "device": device}))
        if entry is None:
            return report
        if entry.matches(name, text):
            report.outcome = "skipped"
            report.wasxfail = f"known failure: {entry.describe()} (line {entry.line})"
            return report
        first = text.strip().splitlines()[0][:200] if text.strip() else ""
        report.sections.append(
            (
                CHANGED,
                f"{item.nodeid} is listed ({state.shown}:{entry.line}) as failing with "
                f"{entry.describe()} but failed with {name}: {first}",
            )
        )
        return report
    if entry is None:
        return report
    listed = f"listed as a known failure ({entry.describe()}, {state.shown}:"
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


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_state_key, None)
    if state is not None:
        config.pluginmanager.unregister(state)
        del config.stash[_state_key]
