"""Which of the audit's finding rows are problems, and their order in reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_mps import ops as mps_ops

#: Kinds of finding that fail ``--mps-audit=error`` whatever their outcome.
FAILING_KINDS = ("dtype", "host-sync", "mixed-devices")


def is_problem(row: Mapping[str, Any]) -> bool:
    """True for a finding in the code under test that would break or stall on MPS.

    Findings allowed (``mps_allow_fallback``), ignored (``mps_audit_ignore``)
    or made by the test's own checks (asserts, ``torch.testing``) are not.
    """
    if row.get("allowed") or row.get("ignored") or row.get("side") == "test":
        return False
    return row["kind"] in FAILING_KINDS or row["outcome"] in mps_ops.PROBLEMS


def sort_key(row: Mapping[str, Any]) -> tuple[bool, bool, str, str]:
    """Problems first, then the rest of the code's findings, then the test's."""
    return (not is_problem(row), row.get("side") == "test", row["kind"], row["name"])
