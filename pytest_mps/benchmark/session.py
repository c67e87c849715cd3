"""The session side of benchmarks: collect results, save, compare, print."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_mps.benchmark.options import PROPERTY, BenchmarkOptions


class BenchmarkSession:
    """Registered in ``pytest_configure``; gathers every test's measurements.

    Results arrive on ``report.user_properties`` through
    ``pytest_runtest_logreport``, which xdist replays on the controller, so the
    controller's table and files hold every worker's benchmarks.
    """

    def __init__(self, config: pytest.Config, options: BenchmarkOptions) -> None:
        self.config = config
        self.options = options
        self.entries: list[dict[str, Any]] = []
        self.messages: list[str] = []
        self.failures: list[str] = []
        self.changes: dict[str, float] | None = None

    @property
    def is_worker(self) -> bool:
        """True inside a pytest-xdist worker: the controller reports."""
        return hasattr(self.config, "workerinput")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the measurements a passed test's call report carries.

        A failed test's numbers are left out, as pytest-benchmark does.
        """
        if report.when != "call" or not report.passed:
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self.entries.append(json.loads(str(value)))

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write, save and compare; a regression fails the session."""
        if self.is_worker or not self.entries:
            if self.options.compare is not None and not self.is_worker:
                self.messages.append("nothing to compare: no benchmark ran")
            return
        # the engine is imported only once a benchmark has run
        from pytest_mps import __version__
        from pytest_mps.benchmark import storage

        opts = self.options
        doc: dict[str, Any] | None = None
        if opts.json or opts.save or opts.autosave or opts.compare is not None:
            doc = storage.document(self.entries, self.config.rootpath, __version__)
        if doc is not None and opts.compare is not None:
            self._compare(doc)
        if doc is not None and opts.json:
            path = (
                opts.json
                if opts.json.is_absolute()
                else self.config.invocation_params.dir / opts.json
            )
            storage.write_atomic(path, doc)
            self.messages.append(f"wrote {path}")
        if doc is not None and (opts.save or opts.autosave):
            name = opts.save or storage.autosave_name(doc["commit_info"])
            path = storage.save_run(opts.storage, doc, name)
            self.messages.append(f"saved {path}")
        if self.failures:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _compare(self, doc: dict[str, Any]) -> None:
        from pytest_mps.benchmark import storage

        opts = self.options
        key = doc["machine_info"]["machine_key"]
        try:
            path = storage.find_baseline(opts.storage, key, opts.compare or None)
            baseline, warning = storage.load_baseline(path, key)
        except storage.BaselineError as exc:
            self.messages.append(f"cannot compare: {exc}")
            return
        if warning:
            self.messages.append(f"warning: {warning}")
        self.messages.append(f"compared with {path}")
        self.failures, self.changes = storage.regressions(
            self.entries, baseline, list(opts.compare_fail)
        )

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Print the tables, what was written, and regressions."""
        if self.is_worker:
            return
        tr = terminalreporter
        if self.entries:
            from pytest_mps.benchmark.report import device_table, results_table

            tr.write_line("")
            for line in results_table(self.entries, self.changes):
                tr.write_line(line)
            for line in device_table(self.entries):
                tr.write_line(line)
        for message in self.messages:
            tr.write_line(f"pytest-mps benchmark: {message}")
        if self.failures:
            tr.write_sep("=", "pytest-mps benchmark regressions", red=True, bold=True)
            for failure in self.failures:
                tr.write_line(f"FAILED {failure}", red=True)
