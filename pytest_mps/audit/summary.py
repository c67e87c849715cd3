"""The audit's session summary: per test, per op or dtype, and the tests' own checks.

Findings of the code under test are listed per test and in one table; those
silenced by ``mps_audit_ignore`` are listed with their reason; those the
tests' own checks made (asserts, ``torch.testing``) are listed apart, one line
per op, and count against nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pytest_mps import ops as mps_ops
from pytest_mps.audit.problems import is_problem
from pytest_mps.watch.locations import relative_location

PROPERTY = "pytest_mps_audit"
OPS_PROPERTY = "pytest_mps_audit_ops"

#: What a host sync or a mix of devices means for a user, as printed.
_KIND_MEANING = {
    "host-sync": "makes the host wait for the device",
    "mixed-devices": "mixes tensors of several devices (raises or crashes on MPS)",
}


def describe(row: Mapping[str, Any]) -> str:
    """One finding as a sentence: what MPS would do, why, and who says so."""
    origin = f"[{row.get('rule', row['kind'])}; {row.get('certainty', '')}"
    origin += f"; {row['source']}]" if row.get("source") else "]"
    if row["kind"] == "dtype":
        return f"{row['name']} (in {row['op']}): {row['why']} {origin}"
    meaning = _KIND_MEANING.get(row["kind"]) or mps_ops.MEANING[row["outcome"]]
    return f"{row['name']}: {meaning} ({row['why']}) {origin}"


def collect(stats: Mapping[str, list[Any]]) -> tuple[dict[str, list[Any]], set[str]]:
    """Each test's findings and every op seen, from the reports' properties."""
    per_test: dict[str, list[Any]] = {}
    ops: set[str] = set()
    for reports in stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == PROPERTY:
                    per_test[report.nodeid] = list(value)
                elif name == OPS_PROPERTY:
                    ops.update(value)
    return per_test, ops


def _test_side(row: Mapping[str, Any]) -> bool:
    return row.get("side") == "test"


def session_rows(
    per_test: Mapping[str, list[Any]], test_side: bool = False
) -> list[dict[str, Any]]:
    """One row per op or dtype over the session: count, tests, first user line.

    The code under test's findings, or with ``test_side`` the tests' own.
    """
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for nodeid, findings in per_test.items():
        for found in findings:
            if _test_side(found) != test_side:
                continue
            key = (found["kind"], found["name"], found.get("ignored") or "")
            row = rows.get(key)
            if row is None:
                row = rows[key] = {**found, "count": 0, "tests": [], "allowed": True}
            row["count"] += found["count"]
            row["tests"].append(nodeid)
            row["allowed"] = row["allowed"] and found["allowed"]
    return sorted(
        rows.values(), key=lambda r: (not is_problem(r), r["kind"], r["name"])
    )


def _label(row: Mapping[str, Any]) -> str:
    label = str(row["outcome"])
    if row.get("ignored"):
        return label + " (ignored)"
    return label + (" (allowed)" if row.get("allowed") else "")


def _live(findings: list[Any]) -> bool:
    return any(not _test_side(r) and not r.get("ignored") for r in findings)


def write(
    terminalreporter: Any,
    root: os.PathLike[str] | str,
    torch_version: str,
    per_test: Mapping[str, list[Any]],
) -> dict[str, list[dict[str, Any]]]:
    """Write the summary; return its session tables (code and test side)."""
    rows = session_rows(per_test)
    checks = session_rows(per_test, test_side=True)
    write_line = terminalreporter.write_line
    terminalreporter.write_sep(
        "=", f"MPS audit: predicted from torch {torch_version}'s op table"
    )
    clean = sum(1 for found in per_test.values() if not _live(found))
    only_checks = sum(
        1
        for found in per_test.values()
        if not _live(found) and any(_test_side(r) for r in found)
    )
    apart = f" ({only_checks} with the tests' own checks only)" if only_checks else ""
    write_line(f"{len(per_test)} tests audited, {clean} without findings{apart}")
    for nodeid, findings in per_test.items():
        mine = [r for r in findings if not _test_side(r)]
        if mine:
            write_line(nodeid)
        for row in mine:
            where = relative_location(row["first"], root)
            write_line(f"  {row['name']}  {_label(row)}  x{row['count']}  at {where}")
            if row.get("ignored"):
                write_line(f"    ignored: {row['ignored']}")
    if rows:
        width = max(len(row["name"]) for row in rows)
        write_line("")
        write_line(
            f"{'op or dtype':<{width}}  {'predicted':<28} count  tests  first at"
        )
        for row in rows:
            where = relative_location(row["first"], root)
            write_line(
                f"{row['name']:<{width}}  {_label(row):<28} {row['count']:>5}  "
                f"{len(row['tests']):>5}  {where}"
            )
        write_line("")
        for outcome in sorted({r["outcome"] for r in rows if r["kind"] == "op"}):
            write_line(f"{outcome}: {mps_ops.MEANING[outcome]}")
            if outcome == mps_ops.FALLBACK:
                # PyTorch 2.6+ names this tracker in its error (#77764 before)
                write_line(
                    "  ask for a kernel on PyTorch's MPS op tracker, "
                    "https://github.com/pytorch/pytorch/issues/141287"
                )
        for row in rows:
            if row["kind"] != "op":
                write_line(f"{row['name']} ({row['outcome']}): {row['why']}")
    if checks:
        write_line("")
        write_line(
            "the tests' own checks (asserts, torch.testing), counted against nothing:"
        )
        for row in checks:
            where = relative_location(row["first"], root)
            write_line(
                f"  {row['name']}  {row['outcome']}  x{row['count']} in "
                f"{len(row['tests'])} test(s), first at {where}"
            )
    return {"session": rows, "test_side": checks}
