"""The audit's per-test op callback: what each op would do on MPS, and where.

:class:`Recorder` looks each aten op up in the op table (:mod:`.ops`), checks
its tensors' dtypes, and reuses the watch family's host-sync and device-mix
checks so both features judge alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pytest_mps.audit import ops as mps_ops


def _is_allowed(op: str, allowed: frozenset[str] | None) -> bool:
    from pytest_mps.watch import fallback

    return fallback.is_allowed(op, allowed)


@lru_cache(maxsize=1)
def _unsupported_dtypes() -> dict[Any, str]:
    """Every torch dtype MPS cannot hold, with PyTorch's error for it."""
    import torch

    return {
        dtype: message
        for dtype in vars(torch).values()
        if isinstance(dtype, torch.dtype)
        and (message := mps_ops.dtype_problem(dtype)) is not None
    }


class Recorder:
    """The per-test op callback: counts findings and where they first happened."""

    def __init__(
        self,
        table: mps_ops.OpTable,
        keep_ops: bool,
        count_cpu: bool = True,
        mixed: bool = False,
    ) -> None:
        import torch

        from pytest_mps.watch.findings import TestFindings
        from pytest_mps.watch.host_sync import sync_checks
        from pytest_mps.watch.mixed_devices import DeviceGuard

        self.table = table
        # the watching modules' own checks, so both features judge alike
        self.syncs = sync_checks()
        self.count_cpu = count_cpu
        self.devices = DeviceGuard(TestFindings()) if mixed else None
        self.tensor = torch.Tensor
        self.dtype = torch.dtype
        self.bad = _unsupported_dtypes()
        self.predictions: dict[Any, mps_ops.Prediction] = {}
        self.findings: dict[tuple[str, str], dict[str, Any]] = {}
        self.ops: set[str] | None = set() if keep_ops else None

    def _note(self, kind: str, name: str, outcome: str, why: str, op: str) -> None:
        found = self.findings.get((kind, name))
        if found is not None:
            found["count"] += 1
            return
        from pytest_mps.watch.locations import user_location

        self.findings[(kind, name)] = {
            "kind": kind,
            "name": name,
            "outcome": outcome,
            "why": why,
            "op": op,
            "count": 1,
            "first": user_location(),
        }

    def _check_dtype(self, value: Any, op: str) -> None:
        dtype = value.dtype if isinstance(value, self.tensor) else value
        message = self.bad.get(dtype)
        if message is not None:
            self._note("dtype", str(dtype), "unsupported dtype", message, op)

    def __call__(
        self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Look at one op before it runs: its prediction and its dtypes."""
        prediction = self.predictions.get(func)
        if prediction is None:
            prediction = self.predictions[func] = self.table.predict(func.name())
        op = prediction.op
        if self.ops is not None:
            self.ops.add(op)
        if (
            prediction.outcome in mps_ops.PROBLEMS
            or prediction.outcome == mps_ops.UNKNOWN
        ):
            self._note("op", op, prediction.outcome, prediction.rule, op)
        check = self.syncs.get(func)
        if check is not None:
            reason = check(args, kwargs, self.count_cpu)
            if reason is not None:
                self._note("host-sync", op, "host sync", reason, op)
        if self.devices is not None:
            self.devices(func, args, kwargs)
        tensor, dtype = self.tensor, self.dtype
        for value in (*args, *kwargs.values()):
            if isinstance(value, (tensor, dtype)):
                self._check_dtype(value, op)
            elif isinstance(value, (list, tuple)):
                for inner in value:
                    if isinstance(inner, tensor):
                        self._check_dtype(inner, op)

    def results(self, allowed: frozenset[str] | None) -> list[dict[str, Any]]:
        """The findings, each marked allowed or not, problems first."""
        rows = []
        for row in self.findings.values():
            allow = row["kind"] == "op" and _is_allowed(row["name"], allowed)
            rows.append({**row, "allowed": allow})
        if self.devices is not None:
            for found in self.devices.findings.entries.values():
                rows.append(
                    {
                        "kind": "mixed-devices",
                        "name": found.op,
                        "outcome": "mixed devices",
                        "why": found.detail,
                        "op": found.op,
                        "count": found.count,
                        "first": found.location,
                        "allowed": False,
                    }
                )
        return sorted(rows, key=lambda r: (not is_problem(r), r["kind"], r["name"]))


def is_problem(row: Mapping[str, Any]) -> bool:
    """True for a finding that would break or slow the test on MPS."""
    if row.get("allowed"):
        return False
    return row["kind"] == "dtype" or row["outcome"] in mps_ops.PROBLEMS
