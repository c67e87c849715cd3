"""What the watchers found in each test, and the session summary of it.

Fallback, host-sync and mixed-device watchers record into the test's
``TestFindings``; the teardown report carries them on ``user_properties`` (so
they survive pytest-xdist) and the controller builds the terminal summary and
the ``watch`` section of the ``--mps-report`` JSON from the reports.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

import pytest

from pytest_mps.watch import settings
from pytest_mps.watch.locations import relative_location

#: Kinds of finding, in summary order, with the heading each gets.
KINDS = {
    "fallback": "ops that fell back to the CPU (no MPS kernel)",
    "mps-fallback": "MPS kernels that fell back to the CPU",
    "int64-downcast": "int64 computed as int32 on MPS",
    "not-implemented": "ops with no MPS kernel (fallback disabled)",
    "mixed-devices": "ops mixing devices",
    "cpu-scalar": (
        "0-dim CPU tensors read as scalars by device ops (legal on MPS; each "
        "is a host read per call, and one computed on the device first is a "
        "sync: pass a Python number or keep it on the device)"
    ),
    "host-sync": "ops that made the host wait for the device",
}


class Finding:
    """One op of one kind in one test: how often, and where first."""

    def __init__(
        self,
        kind: str,
        op: str,
        count: int,
        location: str,
        allowed: bool = False,
        detail: str = "",
    ) -> None:
        self.kind = kind
        self.op = op
        self.count = count
        self.location = location
        self.allowed = allowed
        self.detail = detail

    def as_dict(self) -> dict[str, Any]:
        """The finding as the JSON row it travels as."""
        return dict(vars(self))


class TestFindings:
    """The findings of one test, keyed by (kind, op)."""

    __test__ = False  # not a test class, despite the name

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], Finding] = {}

    def add(
        self,
        kind: str,
        op: str,
        location: str,
        *,
        allowed: bool = False,
        detail: str = "",
    ) -> Finding:
        """Count one occurrence; the first one's location and detail are kept."""
        entry = self.entries.get((kind, op))
        if entry is None:
            entry = Finding(kind, op, 0, location, allowed, detail)
            self.entries[(kind, op)] = entry
        entry.count += 1
        return entry

    def of_kind(self, *kinds: str) -> list[Finding]:
        """The findings of these kinds, in the order first seen."""
        return [f for f in self.entries.values() if f.kind in kinds]


findings_key = pytest.StashKey[TestFindings]()


def findings_for(item: pytest.Item) -> TestFindings:
    """The test's findings, created on first use."""
    found = item.stash.get(findings_key, None)
    if found is None:
        found = item.stash[findings_key] = TestFindings()
    return found


def describe(findings: Iterable[Finding], root: Any) -> list[str]:
    """One line per finding: ``aten::nonzero x3, first at test_x.py:12``."""
    lines = []
    for f in findings:
        times = f"x{f.count}" if f.count > 1 else "once"
        where = relative_location(f.location, root)
        note = " (allowed)" if f.allowed else ""
        detail = f": {f.detail}" if f.detail else ""
        lines.append(f"{f.op} {times}, first at {where}{note}{detail}")
    return lines


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when != "teardown":
        return report
    found = item.stash.get(findings_key, None)
    if found is not None and found.entries:
        root = item.config.rootpath
        rows = [
            {**f.as_dict(), "location": relative_location(f.location, root)}
            for f in found.entries.values()
        ]
        report.user_properties.append((settings.FINDINGS_PROPERTY, rows))
    return report


def aggregate(
    pairs: Iterable[tuple[str, dict[str, Any]]],
) -> dict[str, list[dict[str, Any]]]:
    """Per kind, per op: total count and the tests that hit it."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for nodeid, row in pairs:
        ops = table.setdefault(row["kind"], {})
        entry = ops.setdefault(row["op"], {"op": row["op"], "count": 0, "tests": []})
        entry["count"] += row["count"]
        entry["tests"].append(
            {
                "nodeid": nodeid,
                "count": row["count"],
                "location": row["location"],
                "allowed": row["allowed"],
            }
        )
    return {
        kind: sorted(table[kind].values(), key=lambda e: (-e["count"], e["op"]))
        for kind in KINDS
        if kind in table
    }


def write_summary(
    terminalreporter: Any, pairs: Iterable[tuple[str, dict[str, Any]]]
) -> None:
    """The session summary of ``(nodeid, row)`` pairs, grouped by kind and op."""
    summary = aggregate(pairs)
    if not summary:
        return
    terminalreporter.write_sep("=", "pytest-mps: what tests did on the device")
    for kind, entries in summary.items():
        terminalreporter.write_line(f"{KINDS[kind]}:")
        for entry in entries:
            tests = entry["tests"]
            allowed = sum(1 for t in tests if t["allowed"])
            note = f", allowed in {allowed}" if allowed else ""
            terminalreporter.write_line(
                f"  {entry['op']}: {entry['count']} call(s) in {len(tests)} "
                f"test(s){note}"
            )
            for test in tests[:5]:
                terminalreporter.write_line(
                    f"    {test['nodeid']} x{test['count']} (first at "
                    f"{test['location']})"
                )
            if len(tests) > 5:
                terminalreporter.write_line(f"    ... and {len(tests) - 5} more")
