"""Which aten ops each OpInfo of torch's ``op_db`` runs: the OpInfo -> aten map.

PyTorch's MPS expectations (``common_mps.py``) name OpInfos; the audit sees
aten ops. This module runs each OpInfo's sample inputs per dtype (all of
them, as ``test_mps.py``'s ``test_output_match`` does) on the CPU under the
audit's own watch mode and records the ``(aten op, dtype)`` keys they run
(:func:`op_key`), so the expectations can be mapped onto aten ops by
:mod:`.expectations`. Sample inputs are made as PyTorch's MPS tests get them
(``sample_inputs("mps", ...)``: no float64 arguments), with CPU tensors. It
also notes the expectations an OpInfo carries itself
(:func:`consistency_verdicts`).

It imports ``op_db``, which needs test-only packages (numpy, expecttest), and
so runs in its own process, once per torch version::

    python -m pytest_mps.audit.opinfo_trace OUT.json

The parent (:func:`pytest_mps.audit.expectations.load_traces`) caches OUT.json
beside the yaml cache. Progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: The dtypes a tensor on MPS can hold that PyTorch's MPS tests run.
TRACED_DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
)

#: How many sample inputs per (OpInfo, dtype) are traced (None: all of them).
SAMPLES: int | None = None

#: Format of the file this writes; the reader refuses others.
FORMAT = 3


def _to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.device) and value.type == "mps":
        return torch.device("cpu")
    if isinstance(value, str) and value.split(":")[0] == "mps":
        return "cpu"
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _on_cpu_mode() -> Any:
    """A TorchFunctionMode that makes tensors asked for on "mps" on the CPU.

    ``torch.device`` calls pass through, so a sample function that checks
    ``torch.device(device).type == "mps"`` still takes its MPS branch.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    class OnCpu(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            if func is torch.device:
                return func(*args, **(kwargs or {}))
            return func(*_to_cpu(args), **_to_cpu(dict(kwargs or {})))

    return OnCpu()


def trace_opinfo(op: Any, dtype_name: str) -> tuple[list[str], str | None]:
    """The op keys that ``op``'s samples run at ``dtype_name``, or an error.

    Every sample is run, as PyTorch's ``test_output_match`` runs them: an op
    key that only a later sample reaches (``nanmedian.dim`` without
    ``keepdim``, from the nanmedian OpInfo's third sample on) is still known
    to run. A sample
    that raises on the CPU says nothing (not even the ops it ran before it
    raised); the error is returned only when every sample raises.
    """
    import torch

    from pytest_mps.audit.rules import op_key
    from pytest_mps.watch.mode import watching

    seen: set[str] = set()
    this_sample: set[str] = set()

    def record(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        this_sample.add(op_key(func.name(), args, kwargs, torch.Tensor))

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    try:
        with _on_cpu_mode():
            # the sample function itself: OpInfo.sample_inputs wraps it in an
            # iterator that walks the whole stack (inspect.stack) per sample
            found = op.sample_inputs_func(op, "mps", dtype, False)
            samples = list(_first(found, SAMPLES))
    except Exception as exc:
        return [], f"{type(exc).__name__}: {str(exc)[:200]}"
    error: str | None = None
    ran = 0
    for sample in samples:
        this_sample.clear()
        try:
            first = _to_cpu(sample.input)
            args = _to_cpu(sample.args)
            kwargs = _to_cpu(sample.kwargs)
            with watching([record], every_op=True):
                op(first, *args, **kwargs)
        except Exception as exc:  # this sample fails on the CPU: no word
            error = error or f"{type(exc).__name__}: {str(exc)[:200]}"
        else:
            ran += 1
            seen.update(this_sample)
    if ran == 0:
        return sorted(seen), error or "no sample inputs"
    return sorted(seen), None


def _first(samples: Iterable[Any], count: int | None) -> Iterable[Any]:
    for index, sample in enumerate(samples):
        if count is not None and index >= count:
            return
        yield sample


def consistency_verdicts(op: Any, dtypes: Iterable[str]) -> dict[str, str]:
    """What an OpInfo's own decorators expect of its MPS test, per dtype.

    The result maps a dtype name to ``"xfail"`` or ``"skip"``.

    Besides common_mps.py, an OpInfo can carry PyTorch's MPS expectation
    itself: ``nn.functional.channel_shuffle`` has
    ``DecorateInfo(unittest.expectedFailure, 'TestConsistency')`` ("The
    operator 'aten::channel_shuffle' is not currently implemented for the MPS
    device"), ``nn.functional.pad``'s ``replicate_negative`` a
    ``unittest.skip``. Asked the way ``test_mps.py`` asks them:
    ``is_active("TestConsistency", "test_output_match", "mps", dtype, {})``.
    """
    import unittest

    import torch

    def dummy() -> None:
        """A test body to apply a decorator to."""

    found: dict[str, str] = {}
    for info in getattr(op, "decorators", ()):
        if not hasattr(info, "is_active"):
            continue  # a bare decorator (precisionOverride): no expectation
        for name in dtypes:
            dtype = getattr(torch, name)
            if not info.is_active(
                "TestConsistency", "test_output_match", "mps", dtype, {}
            ):
                continue
            for decorator in info.decorators:
                if decorator is unittest.expectedFailure:
                    found[name] = "xfail"
                elif getattr(_applied(decorator, dummy), "__unittest_skip__", False):
                    found.setdefault(name, "skip")
    return found


def _applied(decorator: Any, test: Any) -> Any:
    """``decorator(test)``, or None for a decorator that needs a real test."""
    try:
        return decorator(test)
    except Exception:
        return None


def trace_all(progress: bool = True) -> dict[str, Any]:
    """Trace every OpInfo of ``op_db`` over :data:`TRACED_DTYPES`."""
    import warnings

    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    warnings.simplefilter("ignore")
    # samples are tiny: a thread pool only spins, and two traces at once
    # (pytest-xdist workers) took 89 s each with 2 threads, 23 s with 1
    torch.set_num_threads(1)
    start = time.perf_counter()
    result: dict[str, Any] = {}
    op: Any
    for index, op in enumerate(op_db):
        key = op.name + op.variant_test_name
        cpu = {str(d).removeprefix("torch.") for d in op.supported_dtypes("cpu")}
        mps = {str(d).removeprefix("torch.") for d in op.supported_dtypes("mps")}
        entry: dict[str, Any] = {
            "cpu_dtypes": sorted(cpu),
            "mps_dtypes": sorted(mps),
            "ops": {},
            "errors": {},
            "consistency": consistency_verdicts(op, TRACED_DTYPES),
        }
        for dtype in TRACED_DTYPES:
            if dtype not in cpu:
                continue
            keys, error = trace_opinfo(op, dtype)
            entry["ops"][dtype] = keys
            if error is not None:
                entry["errors"][dtype] = error
        result[key] = entry
        if progress and (index % 50 == 0 or index == len(op_db) - 1):
            print(
                f"pytest-mps: traced {index + 1}/{len(op_db)} OpInfos "
                f"({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return {"format": FORMAT, "torch": torch.__version__, "opinfos": result}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m pytest_mps.audit.opinfo_trace OUT.json", file=sys.stderr
        )
        return 2
    data = trace_all()
    with open(args[0], "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
