"""``--mps-emulate``'s hooks, registered by :mod:`.plugin` once the emulation is on.

The header, what each test made on the device, the shorter tracebacks of
refusals, and the closing count of the tests that used the device.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_mps.emulate import plugin


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    emulation = config.stash.get(plugin.emulation_key, None)
    if emulation is None:
        return None
    macos = emulation.runtime.macos
    target = "newest" if macos[0] >= 99 else f"{macos[0]}.{macos[1]}"
    fallback = (
        "PYTORCH_ENABLE_MPS_FALLBACK=1: ops without an MPS kernel fall back"
        if emulation.policy.fallback
        else "PYTORCH_ENABLE_MPS_FALLBACK unset: ops without an MPS kernel raise"
    )
    memory = (
        "memory: no limit (--mps-emulate-memory sets one)"
        if emulation.budget is None
        else emulation.budget.describe()
    )
    from pytest_mps.emulate import host

    return [
        f"pytest-mps emulate: MPS emulated on the CPU (macOS {target}, op table "
        f"of torch {emulation.policy.table.torch_version}); {fallback}",
        f"pytest-mps emulate: {memory}",
        f"pytest-mps emulate: {_guards(config)}",
        f"pytest-mps emulate: {host.describe(macos)}",
    ]


def _guards(config: pytest.Config) -> str:
    """What fails a test here, and what is only reported."""
    from pytest_mps.watch import settings

    fail = [
        "ops without an MPS kernel"
        if settings.fallback_mode(config) in ("off", "error")
        else "",
        "float64 and other dtypes MPS lacks",
        "arguments MPS kernels refuse",
        "host reads of device tensors (.numpy())",
    ]
    report = []
    mixed = settings.mixed_mode(config)
    if mixed == "error":
        fail.append("mixed devices (--mps-mixed-devices=error)")
    elif mixed == "warn":
        report.append("mixed devices (--mps-mixed-devices=warn)")
    if settings.fallback_mode(config) == "warn":
        report.append("CPU fallbacks (--mps-fallback=warn)")
    line = "fails tests on " + ", ".join(f for f in fail if f)
    if report:
        line += "; reports " + ", ".join(report)
    return line


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if plugin.emulation_key in item.config.stash:
        from pytest_mps.emulate import tags, unreproduced

        item.stash[plugin.made_key] = tags.made[0]
        unreproduced.forget()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if plugin.emulation_key not in item.config.stash:
        return report
    from pytest_mps.emulate import messages, tags

    refused_here = False
    if report.failed and call.excinfo is not None:
        from pytest_mps.emulate.failures import without_library_frames

        shorter = without_library_frames(item.config, call.excinfo)
        if shorter is not None:
            report.longrepr = shorter
            refused_here = True

    start = item.stash.get(plugin.made_key, None)
    if start is not None:
        setattr(report, plugin.USED, tags.made[0] > start)
    # a refusal is not a value a seed or Metal's numerics decide
    if report.failed and call.when == "call" and not refused_here:
        from pytest_mps.emulate.failures import name_unreproduced

        name_unreproduced(report)
    excinfo = call.excinfo
    if (
        report.failed
        and excinfo is not None
        and isinstance(excinfo.value, messages.NotEmulatedError)
    ):
        from pytest_mps.emulate.failures import one_line

        report.longrepr = one_line(excinfo)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    used = getattr(report, plugin.USED, None)
    seen = _seen[0]
    if used is None or seen is None:
        return
    ran, made = seen
    if used:
        made.add(report.nodeid)
    if report.when == "call" and not report.skipped:
        ran.add(report.nodeid)


#: While an emulated session runs: the node ids of the tests whose call ran
#: (not skipped), and of those that made a device tensor in any phase.
_seen: list[tuple[set[str], set[str]] | None] = [None]


def pytest_sessionstart(session: pytest.Session) -> None:
    if plugin.emulation_key in session.config.stash:
        _seen[0] = (set(), set())


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    seen = _seen[0]
    if seen is None or plugin.emulation_key not in config.stash:
        return
    ran = len(seen[0])
    used = len(seen[0] & seen[1])
    line = (
        f"pytest-mps emulate: {used} of {ran} tests that ran made tensors on "
        "the emulated device"
    )
    if ran and not used:
        terminalreporter.write_line(
            line + ": nothing ran on the emulated Mac (do the tests pick mps?)",
            yellow=True,
            bold=True,
        )
    else:
        terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    _seen[0] = None
