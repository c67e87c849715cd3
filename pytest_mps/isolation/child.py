"""One test run in a child process: its reports written where the parent reads them.

The child runs the test's setup, call and teardown through pytest's own hooks,
as pytest's runner does (``CallInfo.from_call`` and
``pytest_runtest_makereport``), with nothing logged here: the parent logs the
reports, so the terminal, junit and pytest-xdist see them once, from the
process that owns them. Each report is appended to the results file as it is
made, so a child that dies in teardown still hands over its call report.

Before the test starts, the child points faulthandler at a file of its own, for
a fatal signal (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) and for SIGUSR1, which
the parent sends at the time limit: the Python stack is dumped from C even
while the test is stuck inside a C call.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import pytest

from pytest_mps import backend
from pytest_mps.isolation import record

#: The signal the parent sends for a stack dump before killing a child.
DUMP_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class Paths:
    """The files one isolated test's child writes and its parent reads."""

    results: str
    record: str
    stack: str

    @classmethod
    def in_folder(cls, folder: str) -> Paths:
        """The three files, in ``folder``."""
        return cls(
            os.path.join(folder, "reports.jsonl"),
            os.path.join(folder, "last-op"),
            os.path.join(folder, "stack.txt"),
        )


def run(item: pytest.Item, paths: Paths) -> None:
    """Run ``item`` here, writing each report to ``paths.results``."""
    stack = open(paths.stack, "w", encoding="utf-8")  # noqa: SIM115 (kept to the end)
    faulthandler.enable(file=stack, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=stack, all_threads=True)
    record.current[0] = record.OpRecord(paths.record)
    in_child[0] = True
    config = item.config
    with open(paths.results, "w", encoding="utf-8") as results:
        unusable = backend.metal_unusable()

        def refuse() -> None:
            pytest.fail(str(unusable), pytrace=False)

        def phase(when: str, **kwargs: object) -> pytest.TestReport:
            hook = getattr(item.ihook, f"pytest_runtest_{when}")

            def run_phase() -> None:
                if unusable is None:
                    hook(item=item, **kwargs)
                elif when == "setup":  # and nothing set up to tear down
                    refuse()

            call = pytest.CallInfo.from_call(
                run_phase,
                when=when,  # type: ignore[arg-type]
                reraise=(pytest.exit.Exception, KeyboardInterrupt),
            )
            report: pytest.TestReport = item.ihook.pytest_runtest_makereport(
                item=item, call=call
            )
            data = config.hook.pytest_report_to_serializable(
                config=config, report=report
            )
            results.write(json.dumps(data) + "\n")
            results.flush()
            return report

        try:
            setup = phase("setup")
            if setup.passed and not config.getoption("setuponly", False):
                phase("call")
            phase("teardown", nextitem=None)
        except KeyboardInterrupt:
            pass


def run_then_exit(
    item: pytest.Item, paths: Paths, before_exit: Callable[[], None] | None = None
) -> NoReturn:
    """Run ``item`` in this forked child, then leave without Python's shutdown.

    A failure of pytest-mps itself lands in the stack file, with exit code 70.
    """
    try:
        run(item, paths)
    except BaseException:
        with open(paths.stack, "a", encoding="utf-8") as file:
            traceback.print_exc(file=file)
        os._exit(70)
    if before_exit is not None:
        before_exit()
    os._exit(0)


def warm() -> None:
    """Load, once, what every child needs: each child would load it again.

    The op record names torch's calls (``torch.overrides``) and the user's
    lines (whose filter is built on first use); done before forking, both are
    inherited. Only where torch is loaded (the record is not kept otherwise).
    """
    import sys

    if "torch" not in sys.modules or warmed[0]:
        return
    warmed[0] = True
    import torch.overrides  # noqa: F401

    from pytest_mps.watch import locations

    locations.user_location()


warmed: list[bool] = [False]

#: True in an isolated test's child process.
in_child: list[bool] = [False]


def read_reports(config: pytest.Config, path: str) -> list[pytest.TestReport]:
    """The reports a child wrote, whole lines only (a dying child cuts the last)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().split("\n")
    except OSError:
        return []
    reports = []
    for line in lines[:-1]:  # the text after the last newline is not whole
        try:
            data = json.loads(line)
        except ValueError:
            break
        report = config.hook.pytest_report_from_serializable(config=config, data=data)
        _tuples_again(report)
        reports.append(report)
    return reports


def _tuples_again(report: pytest.TestReport) -> None:
    """Give back the tuples JSON made lists of (pytest-xdist's execnet keeps them).

    pytest's terminal summary asserts that a skip's ``longrepr`` is a
    ``(path, line, reason)`` tuple; ``location`` and ``user_properties`` hold
    tuples wherever pytest makes them.
    """
    if isinstance(report.longrepr, list):
        report.longrepr = tuple(report.longrepr)
    report.location = tuple(report.location)  # type: ignore[assignment]
    report.user_properties = [tuple(p) for p in report.user_properties]  # type: ignore[misc]
