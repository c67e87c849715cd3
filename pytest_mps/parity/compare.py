"""Comparing two runs leaf by leaf: tolerances per dtype and device, and the table.

The closeness test is ``torch.testing.assert_close``'s, with ``atol`` in units
of the leaf's scale: an element passes when ``|target - reference| <= atol *
scale + rtol * |reference|``, where ``scale`` is the leaf's largest finite
``|reference|`` value, or 1 when that is smaller (so leaves of values up to 1
get assert_close's rule unchanged). A gradient is a long sum: its rounding
error is bounded relative to the sum of its terms' magnitudes, not to its own
value (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
section 4.2), so elements that cancel to near zero carry errors in units of
the leaf's scale. Measured on the template's GPT (10.7M parameters, batch 4 x
256), float32 gradients reach 1e3 and differ between the CPU and an H100 by
up to 1.3e-3 (1e-6 of the scale), and between float32 and float64 on the CPU
by up to 4e-7 of the scale. NaNs in the same places and equal infinities count
as equal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pytest_mps.parity.run import Leaves, Run

if TYPE_CHECKING:
    import torch

#: a failure message lists at most this many leaves out of tolerance
MAX_ROWS = 30

# torch.testing.assert_close's defaults, (rtol, atol) by dtype: the table in its
# documentation, _DTYPE_PRECISIONS in torch/testing/_comparison.py.
_ASSERT_CLOSE = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}
# assert_close's half-precision defaults are for one op. A module runs matmuls
# whose accumulation order differs between kernels, and PyTorch's own MPS-vs-CPU
# check allows its matmul-family ops (linear, matmul, addmm, baddbmm)
# atol=5e-2, rtol=5e-2 in float16 and atol=5e-2, rtol=1e-1 in bfloat16
# (TestConsistency._compute_tolerances in test/test_mps.py). Every backend has
# its own accumulation order, so these hold on every device.
_HALF = {
    "float16": (5e-2, 5e-2),
    "bfloat16": (1e-1, 5e-2),
    "complex32": (5e-2, 5e-2),
}
# MPS float32 kernels use fast-math reductions; PyTorch's MPS-vs-CPU check
# allows its FP32_LOW_PRECISION_LIST ops (the softmaxes, norms, cumulative
# ops, matmul-backed losses) atol=1e-4, rtol=3e-5 in float32 and complex64
# (TestConsistency._compute_tolerances in test/test_mps.py).
_MPS_SINGLE = {"float32": (3e-5, 1e-4), "complex64": (3e-5, 1e-4)}
# TF32 rounds float32 operands to 10-bit mantissas (unit roundoff 2**-11,
# about 4.9e-4) before multiplying: cuDNN's convolutions and RNNs do so by
# default on CUDA (torch.backends.cudnn.allow_tf32), float32 matmuls where
# torch.backends.cuda.matmul.allow_tf32 or float32_matmul_precision says. A
# correct GRU then differs from the CPU by 2.8e-4 (issue 76, an H200). The
# allowance stays ten times under a 1% fault: an element of a leaf whose
# output is 1% off fails wherever it is over a tenth of the leaf's scale.
_TF32 = {"float32": (1e-3, 1e-3), "complex64": (1e-3, 1e-3)}

#: True while a check whose device side uses TF32 compares (:func:`tf32_allowed`).
_tf32: list[bool] = [False]


@contextlib.contextmanager
def tf32_allowed(on: bool) -> Iterator[None]:
    """Within the block, CUDA float32 leaves get TF32's allowance where ``on``."""
    before = _tf32[0]
    _tf32[0] = on
    try:
        yield
    finally:
        _tf32[0] = before


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def default_tolerance(dtype: torch.dtype, device_type: str) -> tuple[float, float]:
    """``(rtol, atol)`` for a leaf of ``dtype`` computed on a ``device_type``.

    assert_close's defaults, wider for float16/bfloat16 everywhere, for
    float32 on MPS, and for float32 on CUDA within :func:`tf32_allowed`;
    exact (0, 0) for integers and bools.
    """
    name = dtype_name(dtype)
    if name in _HALF:
        return _HALF[name]
    if device_type == "mps" and name in _MPS_SINGLE:
        return _MPS_SINGLE[name]
    if device_type == "cuda" and _tf32[0] and name in _TF32:
        return _TF32[name]
    return _ASSERT_CLOSE.get(name, (0.0, 0.0))


def tolerance_source(dtype: torch.dtype, device_type: str) -> str:
    """Where :func:`default_tolerance`'s figures for ``dtype`` come from."""
    name = dtype_name(dtype)
    if name in _HALF:
        return "test_mps.py's matmul-family tolerance (half precision)"
    if device_type == "mps" and name in _MPS_SINGLE:
        return "test_mps.py's FP32_LOW_PRECISION_LIST tolerance (MPS)"
    if device_type == "cuda" and _tf32[0] and name in _TF32:
        return "TF32's allowance: the device side rounds float32 to TF32, see above"
    if name in _ASSERT_CLOSE:
        return "torch.testing.assert_close's default"
    return "exact"


@dataclasses.dataclass(frozen=True)
class LeafDiff:
    """How far one leaf on the target is from the reference."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    rtol: float
    #: the absolute floor: the given atol times ``scale``
    atol: float
    #: the leaf's largest finite ``|reference|``, or 1 when that is smaller
    scale: float
    #: index of the element furthest outside (or nearest to) its tolerance;
    #: None when the leaves are equal
    worst: tuple[int, ...] | None
    mismatched: int
    numel: int

    @property
    def ok(self) -> bool:
        """True when every element is within tolerance."""
        return self.mismatched == 0


def compare(
    path: str,
    reference: torch.Tensor,
    target: torch.Tensor,
    rtol: float,
    atol: float,
    dtype: str,
) -> LeafDiff:
    """Compare two host tensors of one shape in float64 (complex128)."""
    import torch

    wide = torch.complex128 if target.is_complex() else torch.float64
    a = reference.detach().to("cpu", wide)
    b = target.detach().to("cpu", wide)
    diff = (a - b).abs()
    # assert_close with equal_nan=True: NaN against NaN and inf against the same
    # inf are equal; a NaN against a number, or inf against finite, is not
    equal = (a.isnan() & b.isnan()) | (a.isinf() & (a == b))
    diff = torch.where(equal, 0.0, diff)
    diff = torch.where(diff.isnan(), math.inf, diff)
    finite = a.abs()[a.isfinite()]
    scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
    floor = atol * scale
    allowed = torch.where(a.isfinite(), floor + rtol * a.abs(), 0.0)
    bad = diff > allowed
    rel = torch.where(diff == 0, 0.0, diff / a.abs())
    rel = torch.where(rel.isnan(), math.inf, rel)
    excess = torch.where(diff == 0, 0.0, diff / allowed)
    worst: tuple[int, ...] | None = None
    if diff.numel() and bool(diff.any()):
        flat = int(excess.reshape(-1).argmax())
        worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    return LeafDiff(
        path=path,
        dtype=dtype,
        shape=tuple(a.shape),
        max_abs=float(diff.max()) if diff.numel() else 0.0,
        max_rel=float(rel.max()) if rel.numel() else 0.0,
        rtol=rtol,
        atol=floor,
        scale=scale,
        worst=worst,
        mismatched=int(bad.sum()),
        numel=diff.numel(),
    )


_COLUMNS = (
    "leaf",
    "dtype",
    "shape",
    "max abs",
    "max rel",
    "rtol",
    "atol",
    "worst at",
    "out of tol",
)


def _shape(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "-"
    return (
        "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    )


def _row(d: LeafDiff) -> tuple[str, ...]:
    share = d.mismatched / d.numel if d.numel else 0.0
    return (
        d.path,
        d.dtype,
        _shape(d.shape),
        f"{d.max_abs:.2e}",
        f"{d.max_rel:.2e}",
        f"{d.rtol:.1e}",
        f"{d.atol:.1e}",
        _shape(d.worst),
        f"{d.mismatched}/{d.numel} ({share:.1%})",
    )


def table(diffs: list[LeafDiff]) -> str:
    """The leaves as an aligned text table, one row each."""
    rows = [_COLUMNS, *(_row(d) for d in diffs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]
    return "\n".join(lines)


def differences(ref: Leaves, tgt: Leaves, sides: tuple[str, str]) -> Iterator[str]:
    """What differs in structure between the two sides' leaves."""
    ref_paths, tgt_paths = dict(ref), dict(tgt)
    only_ref = [p for p in ref_paths if p not in tgt_paths]
    only_tgt = [p for p in tgt_paths if p not in ref_paths]
    if only_ref:
        yield f"{', '.join(only_ref)} only on {sides[0]}"
    if only_tgt:
        yield f"{', '.join(only_tgt)} only on {sides[1]}"
    for path, r in ref:
        t = tgt_paths.get(path, r)
        if (r is None) != (t is None):
            yield f"{path} is None on {sides[0] if r is None else sides[1]} only"
        elif r is not None and t is not None and r.shape != t.shape:
            yield (
                f"{path} has shape {tuple(r.shape)} on {sides[0]}, "
                f"{tuple(t.shape)} on {sides[1]}"
            )


def compare_runs(
    reference_run: Run,
    target_run: Run,
    target: torch.device,
    sides: tuple[str, str],
    widened: bool,
    tolerances: tuple[float | None, float | None],
) -> tuple[list[LeafDiff], list[str], list[str]]:
    """Every leaf's difference, the differences in structure, the tolerances."""
    __tracebackhide__ = True
    problems: list[str] = []
    diffs: list[LeafDiff] = []
    used: dict[str, tuple[float, float, str]] = {}
    for kind in ("outputs", "grads", "after"):
        ref_leaves = getattr(reference_run, kind)
        tgt_leaves = dict(getattr(target_run, kind))
        problems += differences(ref_leaves, list(tgt_leaves.items()), sides)
        for path, r in ref_leaves:
            t = tgt_leaves.get(path)
            if r is None or t is None or r.shape != t.shape:
                continue
            label = dtype_name(t.dtype)
            if r.dtype != t.dtype:
                if not (widened and t.is_floating_point()):
                    problems.append(
                        f"{path} is {dtype_name(r.dtype)} on {sides[0]}, "
                        f"{label} on {sides[1]}"
                    )
                    continue
                label += f" (ref {dtype_name(r.dtype)})"
            rtol, atol = tolerances
            if rtol is not None and atol is not None:
                tol = (float(rtol), float(atol), "given")
            else:
                tol = (
                    *default_tolerance(t.dtype, target.type),
                    tolerance_source(t.dtype, target.type),
                )
            used.setdefault(dtype_name(t.dtype), tol)
            diffs.append(compare(path, r, t, tol[0], tol[1], label))
    notes = [
        f"{dtype}: exact"
        if r == a == 0
        else f"{dtype}: |device - reference| <= {a:.1e} x scale + {r:.1e} x "
        f"|reference|, scale = the leaf's largest |reference|, at least 1 ({source})"
        for dtype, (r, a, source) in used.items()
    ]
    return diffs, problems, notes
