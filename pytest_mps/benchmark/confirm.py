"""A benchmark that fails the regression gate is measured again before it counts.

A shared machine slows down in bursts: another job takes the cores, the
scheduler parks a thread for a slice. A benchmark timed inside such a burst
reads tens of percent slower, and the gate cannot tell that from a slower
commit: both are real slowdowns of the code as it ran. What tells them apart is
time. With ``--mps-benchmark-compare-fail``, each measurement is compared with
the baseline as soon as it is made; one that regresses is measured again, up
to :data:`ATTEMPTS` measurements in all, and the last is the one reported and
judged at the end of the session. A slower commit is slower every time; a burst
has to last through every attempt to fail the run.

This module is imported only once a benchmark runs under the gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_mps.benchmark import baseline, compare, storage
from pytest_mps.benchmark.records import BenchmarkOptions

#: Measurements of a regressing benchmark, the first included.
ATTEMPTS = 3


class Gate:
    """The session's thresholds against its baseline, for one measurement."""

    def __init__(self, options: BenchmarkOptions) -> None:
        self.options = options
        #: machine key -> the baseline's document, None when there is none
        self._baselines: dict[str, dict[str, Any] | None] = {}

    def _baseline(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        key = str(storage.machine_info([entry])["machine_key"])
        if key not in self._baselines:
            try:
                path = baseline.find_baseline(
                    self.options.storage, key, self.options.compare or None
                )
                self._baselines[key] = baseline.load_baseline(path, key)[0]
            except baseline.BaselineError:
                # the session's gate says what is missing, once, at the end
                self._baselines[key] = None
        return self._baselines[key]

    def regressed(self, entry: Mapping[str, Any]) -> bool:
        """Whether this measurement alone would fail the gate."""
        doc = self._baseline(entry)
        if doc is None:
            return False
        try:
            found, _ = compare.regressions(
                [entry], doc, list(self.options.compare_fail)
            )
        except compare.MissingStatistic:
            return False  # the session's gate says so, once, at the end
        return bool(found)
