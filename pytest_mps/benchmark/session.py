"""The session side of benchmarks: collect results, save, compare, print."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps.benchmark.options import PROPERTY
from pytest_mps.benchmark.records import BenchmarkOptions

if TYPE_CHECKING:
    from pytest_mps.benchmark.compare import Regression


class Regressed:
    """A benchmark's verdict in the terminal's stats (its summary line counts it).

    ``regressed`` against a saved baseline; ``slower``, ``faster`` or ``same``
    in the A/B gate. Shaped like a report, since plugins walk every entry of
    the stats (the Hypothesis plugin reads each one's ``__dict__``).
    """

    when = "call"
    longrepr = None
    count_towards_summary = True

    def __init__(self, nodeid: str, outcome: str = "regressed") -> None:
        self.outcome = outcome
        self.nodeid = nodeid
        self.location = (nodeid.split("::", 1)[0], None, nodeid)
        self.keywords: dict[str, Any] = {}
        self.user_properties: list[tuple[str, object]] = []
        self.sections: list[tuple[str, str]] = []


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
        self.regressions: list[Regression] = []
        self.changes: dict[str, float] | None = None
        #: A usage error found once the benchmarks ran (exit 4), in one line.
        self.usage_error: str | None = None

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
        if self.is_worker:
            return
        opts = self.options
        if not self.entries:
            if opts.compare is not None:
                self.messages.append("nothing to compare: no benchmark ran")
            return
        # the engine is imported only once a benchmark has run
        from pytest_mps import __version__
        from pytest_mps.benchmark import storage

        doc: dict[str, Any] | None = None
        if opts.json or opts.save or opts.autosave or opts.compare is not None:
            from pytest_mps.machine.hooks import fingerprint

            doc = storage.document(
                self.entries,
                self.config.rootpath,
                __version__,
                fingerprint(self.config).as_dict(),
            )
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
            kept = doc if opts.save_data else storage.without_rounds(doc)
            path = storage.save_run(opts.storage, kept, name)
            self.messages.append(f"saved {path}")
        if opts.histogram is not None:
            self._plot()
        if self.usage_error is not None:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
        elif self.regressions:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            reporter: Any = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                # An entry of the stats shows in pytest's last line:
                # "7 passed, 1 benchmark regressed in 3.2s".
                names = list(dict.fromkeys(r.fullname for r in self.regressions))
                key = (
                    "benchmark regressed" if len(names) == 1 else "benchmarks regressed"
                )
                found = [Regressed(name) for name in names]
                reporter.stats.setdefault(key, []).extend(found)

    def _plot(self) -> None:
        from pytest_mps.benchmark.plot import box_plots

        assert self.options.histogram is not None
        prefix = self.options.histogram
        if not prefix.is_absolute():
            prefix = self.config.invocation_params.dir / prefix
        for path in box_plots(self.entries, prefix, self.options.table):
            self.messages.append(f"plotted {path}")

    def _compare(self, doc: dict[str, Any]) -> None:
        from pytest_mps.benchmark import baseline, compare

        opts = self.options
        key = doc["machine_info"]["machine_key"]
        try:
            path = baseline.find_baseline(opts.storage, key, opts.compare or None)
            base_doc, warning = baseline.load_baseline(path, key)
        except baseline.BaselineError as exc:
            if opts.compare_fail:
                self.usage_error = (
                    f"--mps-benchmark-compare-fail needs a baseline: {exc}"
                )
            else:
                self.messages.append(f"cannot compare: {exc}")
            return
        if warning:
            self.messages.append(f"warning: {warning}")
        differ = baseline.machine_differences(doc, base_doc, path)
        if differ is not None and opts.compare_machine == "refuse":
            self.usage_error = (
                f"{differ}; not compared (--mps-benchmark-compare-machine=refuse)"
            )
            return
        if differ is not None:
            self.messages.append(f"warning: {differ}: the comparison mixes them")
        try:
            self.regressions, self.changes = compare.regressions(
                self.entries, base_doc, list(opts.compare_fail)
            )
        except compare.MissingStatistic as exc:
            self.usage_error = (
                f"baseline {path} cannot be compared: {exc}; save a new baseline "
                "(--mps-benchmark-save NAME)"
            )
            return
        self.messages.append(f"compared with {path}")

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Print the tables, what was written, and regressions."""
        if self.is_worker:
            return
        tr = terminalreporter
        if self.entries:
            from pytest_mps.benchmark.report import device_table, results_table

            tr.write_line("")
            for line in results_table(self.entries, self.options.table, self.changes):
                tr.write_line(line)
            for line in device_table(self.entries):
                tr.write_line(line)
            waited = sum(e["extra_info"].get("lock_wait") or 0 for e in self.entries)
            workers = self.config.getoption("numprocesses", None)
            if self.options.lock == "off":
                pass
            elif isinstance(workers, int) and workers > 1:
                tr.write_line(
                    f"pytest-mps benchmark: {workers} xdist workers took turns, one "
                    f"benchmark measuring at a time; they waited {waited:.2f} s "
                    "in all for their turn"
                )
            elif waited >= 0.01:  # an uncontended lock costs microseconds
                tr.write_line(
                    f"pytest-mps benchmark: measured one at a time on this machine; "
                    f"benchmarks waited {waited:.2f} s in all for other sessions' "
                    "benchmarks to finish"
                )
        for message in self.messages:
            tr.write_line(f"pytest-mps benchmark: {message}")
        if self.usage_error is not None:
            tr.write_line(f"ERROR: {self.usage_error}", red=True, bold=True)
        if self.regressions:
            from pytest_mps.benchmark.compare import regressions_table

            tr.write_sep("=", "pytest-mps benchmark regressions", red=True, bold=True)
            for line in regressions_table(self.regressions):
                tr.write_line(line, red=True)
