"""The audit's per-test op callback: what each op would do on MPS, and where.

:class:`Recorder` looks each aten op up in the op table (:mod:`.ops`), checks
its tensors' dtypes, and reuses the watch family's host-sync and device-mix
checks so both features judge alike.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from functools import lru_cache
from types import FrameType
from typing import TYPE_CHECKING, Any

from pytest_mps import ops as mps_ops
from pytest_mps.audit import calls, problems

if TYPE_CHECKING:
    from pytest_mps.audit.ignores import Ignore
    from pytest_mps.audit.rules import Call, Verdict


def _is_allowed(op: str, allowed: frozenset[str] | None) -> bool:
    from pytest_mps.watch import fallback

    return fallback.is_allowed(op, allowed)


@lru_cache(maxsize=4)
def _unsupported_dtypes(macos: tuple[int, int]) -> dict[Any, str]:
    """Every torch dtype MPS cannot hold on ``macos``, with PyTorch's error."""
    import torch

    from pytest_mps.audit.rules import MACOS_14_DTYPES

    found = {
        dtype: message
        for dtype in vars(torch).values()
        if isinstance(dtype, torch.dtype)
        and (message := mps_ops.dtype_problem(dtype)) is not None
    }
    if macos < (14, 0):
        for dtype in vars(torch).values():
            if isinstance(dtype, torch.dtype) and str(dtype) in MACOS_14_DTYPES:
                found[dtype] = MACOS_14_DTYPES[str(dtype)]
    return found


_ROW_OUTCOMES = (mps_ops.FALLBACK, mps_ops.FORCED_FALLBACK, mps_ops.UNKNOWN)


class Recorder:
    """The per-test op callback: counts findings and where they first happened.

    Per op call, in order: an argument rule of :mod:`.rules` if the op has one,
    else the op table's prediction; then PyTorch's MPS test lists for the
    call's (op, dtype, categorical arguments) key; then the dtypes of its
    tensors (a 0-dim float64 tensor is a scalar MPS ops take from the CPU).
    """

    def __init__(
        self,
        table: mps_ops.OpTable,
        keep_ops: bool,
        count_cpu: bool = True,
        mixed: bool = False,
        expected: Mapping[str, Any] | None = None,
        macos: tuple[int, int] = (99, 0),
        expected_syncs: tuple[tuple[str, str], ...] = (),
        ignores: tuple[Ignore, ...] = (),
        device_only: bool = False,
    ) -> None:
        import torch

        from pytest_mps.audit.rules import argument_rules
        from pytest_mps.watch.device_mix import (
            MIXED,
            describe_tensors,
            exempt_ops,
            mix_kind,
        )
        from pytest_mps.watch.host_sync import sync_checks

        self.table = table
        # the watching modules' own checks, so both features judge alike
        self.syncs = sync_checks()
        self.count_cpu = count_cpu
        # functions whose host reads are by design (mps_expected_host_syncs)
        self.expected_syncs = expected_syncs
        # ops mixing CPU and device tensors, but for the copies between them
        self.exempt: frozenset[Any] | None = exempt_ops() if mixed else None
        self.mixes, self.describe = mix_kind, describe_tensors
        self.mixed = MIXED
        self.tensor = torch.Tensor
        self.dtype = torch.dtype
        self.bad = _unsupported_dtypes(macos)
        self.rules = argument_rules(lambda op: table.predict(op).outcome, macos)
        # PyTorch's MPS test lists, attributed to (op, dtype, ...) keys
        self.expected: Mapping[str, Any] = expected or {}
        self.expected_ops = frozenset(k.partition("|")[0] for k in self.expected)
        self.predictions: dict[Any, mps_ops.Prediction] = {}
        # (kind, name, side, reason ignored or "") -> the finding
        self.findings: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.ops: set[str] | None = set() if keep_ops else None
        # the outermost torch API call running now (see calls())
        self.call: Call | None = None
        self.call_rules: dict[Any, Any] | None = None
        # the mps_audit_ignore marker and ini lines that apply to this test
        self.ignores = ignores
        # whose work the op being looked at is: (side, user frame), once per op
        self.who: tuple[str, FrameType | None] | None = None
        # float64 / complex128 findings inside the running call, held until it
        # returns (see settle_wide)
        self.held: list[tuple[Any, ...]] = []
        # dtypes PyTorch's CPU code picks where its MPS code picks float32/complex64
        self.wide = frozenset((torch.float64, torch.complex128))
        # under --mps-emulate the device's tensors are told from the host's:
        # what MPS runs (ops, dtypes) is judged for ops on the device only
        self.device_only = device_only

    def calls(self) -> contextlib.AbstractContextManager[Any]:
        """Note the torch API call each aten op runs under, while in the block.

        On the CPU an op's aten ops can hide what MPS would run: ``F.linear``
        is ``addmm`` there but a kernel of its own on MPS; ``svdvals`` and
        ``linalg.svd`` both show ``_linalg_svd``. A ``TorchFunctionMode`` sees
        each torch call once, before it decomposes (calls made inside it are
        not seen again), so the rules know which call an op came from.
        """
        mode: contextlib.AbstractContextManager[Any] = calls.calls_mode_class()(self)
        return mode

    def on_call(
        self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """A torch API call is about to run: apply the rules made for calls."""
        if self.call_rules is None:
            from pytest_mps.audit.rules import call_rules

            self.call_rules = call_rules()
        found = self.call_rules.get(func)
        if found is None:
            return
        op, rule = found
        verdict = rule(args, kwargs)
        if verdict is not None:
            self._note_verdict(op, verdict, "call rule")
            self.who = None  # holds the user's frame: let it go

    def _whose(self) -> tuple[str, FrameType | None]:
        """The running op's side (code, test, assert) and user frame, once per op."""
        if self.who is None:
            from pytest_mps.watch.attribution import whose

            self.who = whose(sys._getframe(1))
        return self.who

    def _note(
        self,
        kind: str,
        name: str,
        outcome: str,
        why: str,
        op: str,
        source: str = "",
        certainty: str = mps_ops.CERTAIN,
        rule: str = "",
        who: tuple[str, FrameType | None] | None = None,
    ) -> None:
        from pytest_mps.watch.attribution import side_for

        side, frame = who if who is not None else self._whose()
        side = side_for(side, kind)
        filename = frame.f_code.co_filename if frame is not None else ""
        reason = next(
            (i.reason for i in self.ignores if i.covers(kind, name, filename)), ""
        )
        found = self.findings.get((kind, name, side, reason))
        if found is not None:
            found["count"] += 1
            return
        self.findings[(kind, name, side, reason)] = {
            "kind": kind,
            "name": name,
            "outcome": outcome,
            "why": why,
            "op": op,
            "rule": rule or kind,
            "source": source,
            "certainty": certainty,
            "count": 1,
            "first": f"{filename}:{frame.f_lineno}" if frame is not None else "unknown",
            "side": side,
            "ignored": reason or None,
        }

    def _note_verdict(self, op: str, verdict: Verdict, rule: str) -> None:
        self._note(
            "op",
            op,
            verdict.outcome,
            verdict.rule,
            op,
            verdict.source,
            verdict.certainty,
            rule,
        )

    def _expected_sync(self, op: str) -> bool:
        """True for a read-back by design: optimizer counters, listed functions."""
        if calls.optimizer_counter(op):
            return True
        if not self.expected_syncs:
            return False
        from pytest_mps.watch.locations import in_functions

        return in_functions(self._whose()[1], self.expected_syncs)

    def settle_wide(self, call: tuple[Any, Any, Any] | None) -> None:
        """Decide the float64 / complex128 findings held while a call ran.

        PyTorch's own code picks wide dtypes on the CPU path where MPS gets
        float32: torch 2.14's quantile computes its ranks in float64 "on every
        device except MPS" (aten/src/ATen/native/Sorting.cpp, pytorch PR
        #187574); batch_norm's statistics use the CPU's accumulate type, double
        for float (aten/src/ATen/AccumulateType.h, where MPS's is float). So a
        wide tensor that a call makes inside itself, from arguments with no
        wide dtype and into results with none, is the CPU path's choice, not
        the user's: dropped. A call given one (``dtype=torch.float64``, a
        float64 tensor) or returning one (``x.double()``) keeps its findings,
        and so does a call that raised (``call`` None).
        """
        held, self.held = self.held, []
        if not held:
            return
        if call is not None and not any(self._wide(value) for value in call):
            return
        for who, (kind, name, outcome, why, op, source, certainty, rule) in held:
            self._note(kind, name, outcome, why, op, source, certainty, rule, who)

    def _wide(self, value: Any) -> bool:
        """True when ``value`` holds a float64 / complex128 tensor or dtype."""
        if isinstance(value, self.tensor):
            return value.dtype in self.wide
        if isinstance(value, self.dtype):
            return value in self.wide
        if isinstance(value, (list, tuple)):
            return any(self._wide(v) for v in value)
        if isinstance(value, Mapping):
            return any(self._wide(v) for v in value.values())
        return False

    def _check_dtype(self, value: Any, op: str, scalar: bool) -> None:
        """Note ``value``'s dtype (a tensor's, or a dtype argument) if MPS lacks it.

        The one place a tensor's dtype is judged: with ``scalar`` (a 0-dim
        value), floating and complex dtypes pass, as MPS ops take such
        scalars from the CPU.
        """
        if isinstance(value, self.tensor):
            dtype = value.dtype
            scalar = value.dim() == 0
        else:
            dtype = value
        message = self.bad.get(dtype)
        if message is None:
            return
        if scalar and dtype.is_floating_point | dtype.is_complex:
            return  # a 0-dim scalar: MPS ops take it from the CPU
        source = "OperationUtils.mm getMPSDataType / EmptyTensor.cpp"
        rule = "dtype: macOS" if "MacOS 14" in message else "dtype"
        if self.call is not None and dtype in self.wide:
            args = ("dtype", str(dtype), "unsupported dtype", message, op, source)
            self.held.append((self._whose(), (*args, mps_ops.CERTAIN, rule)))
            return
        self._note(
            "dtype", str(dtype), "unsupported dtype", message, op, source, rule=rule
        )

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
        if self.device_only and not calls.on_device(args, kwargs, self.tensor):
            self._watch_host_op(func, op, args, kwargs)
            return
        rule = self.rules.get(op)
        verdict = rule(args, kwargs, self.call) if rule is not None else None
        if verdict is not None:
            self._note_verdict(op, verdict, "argument rule")
        elif rule is None and prediction.outcome in _ROW_OUTCOMES:
            self._note(
                "op",
                op,
                prediction.outcome,
                prediction.rule,
                op,
                prediction.source,
                prediction.certainty,
                "op table",
            )
        if op in self.expected_ops:
            from pytest_mps.audit.rules import op_key

            evidence = self.expected.get(op_key(op, args, kwargs, self.tensor))
            if evidence is not None:
                self._note(
                    "op-dtype",
                    op,
                    mps_ops.EXPECTED_FAIL,
                    f"at {evidence.dtype}: {evidence.describe()}",
                    op,
                    evidence.source,
                    mps_ops.CERTAIN,
                    "PyTorch's MPS test lists",
                )
        self._watch_host_op(func, op, args, kwargs)
        tensor, dtype = self.tensor, self.dtype
        scalar: bool | None = None
        for value in (*args, *kwargs.values()):
            if isinstance(value, tensor):
                self._check_dtype(value, op, False)
            elif isinstance(value, dtype):
                if scalar is None:
                    from pytest_mps.audit.rules import makes_scalar

                    scalar = makes_scalar(args, tensor)
                self._check_dtype(value, op, scalar)
            elif isinstance(value, (list, tuple)):
                for inner in value:
                    if isinstance(inner, tensor):
                        self._check_dtype(inner, op, False)
        self.who = None  # holds the user's frame: let it go

    def _watch_host_op(
        self, func: Any, op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """The host-sync and mixed-device checks, which every op gets."""
        check = self.syncs.get(func)
        if check is not None:
            reason = check(args, kwargs, self.count_cpu)
            if reason is not None and not self._expected_sync(op):
                self._note("host-sync", op, "host sync", reason, op)
        if (
            self.exempt is not None
            and func not in self.exempt
            and self.mixes(func, args, kwargs) == self.mixed
        ):
            why = self.describe(args, kwargs)
            self._note("mixed-devices", op, "mixed devices", why, op)
        self.who = None

    def results(self, allowed: frozenset[str] | None) -> list[dict[str, Any]]:
        """The findings, each marked allowed or not, problems first."""
        rows = []
        for row in self.findings.values():
            allow = row["kind"] in ("op", "op-dtype") and _is_allowed(
                row["name"], allowed
            )
            rows.append({**row, "allowed": allow})
        return sorted(rows, key=problems.sort_key)
