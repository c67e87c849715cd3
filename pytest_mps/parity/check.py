"""``assert_device_parity``: a module computes on the device what it does on the CPU.

PyTorch checks its own MPS kernels this way (TestConsistency in test/test_mps.py
runs each op on MPS and on the CPU and compares outputs and gradients). This
does it for a user's module or function: two copies, one per device, the same
weights, inputs and seeds; forward, a backward with fixed weights on the
outputs, optional optimizer steps; then every output, input gradient, parameter
gradient, parameter after the steps and buffer is compared, named by its path.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from pytest_mps import backend
from pytest_mps.accelerator import canonical
from pytest_mps.assertions import argument_names
from pytest_mps.parity.compare import (
    LeafDiff,
    compare,
    default_tolerance,
    dtype_name,
    table,
    tolerance_source,
)
from pytest_mps.parity.run import (
    Leaves,
    Plan,
    Run,
    float64_in,
    mode_notes,
    rng_restored,
    run,
    tf32_notes,
)

if TYPE_CHECKING:
    import torch

__all__ = ["ParityError", "ParityReport", "assert_device_parity"]

#: the failure message lists at most this many leaves out of tolerance
_MAX_ROWS = 30


@dataclasses.dataclass
class ParityReport:
    """Every leaf compared, with the notes on how the two runs were made."""

    reference: str
    target: str
    diffs: list[LeafDiff]
    notes: list[str]

    @property
    def failed(self) -> list[LeafDiff]:
        """The leaves with elements out of tolerance."""
        return [d for d in self.diffs if not d.ok]

    def __str__(self) -> str:
        head = f"{self.target} against {self.reference}: {len(self.diffs)} leaves"
        return "\n".join([head, *self.notes, table(self.diffs)])


class ParityError(AssertionError):
    """The device differs from the reference; ``report`` holds every leaf."""

    def __init__(self, message: str, report: ParityReport) -> None:
        super().__init__(message)
        self.report = report


def _device(where: str, value: Any, argument: str) -> torch.device:
    import torch

    try:
        device = torch.device(canonical(value))
    except (RuntimeError, TypeError):
        raise ValueError(
            f"{where}: {argument}={value!r} is not a device; "
            "use cpu, mps, cuda or cuda:N"
        ) from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(
            f"{where}: {argument}={value!r}: parity is checked on cpu, mps or cuda"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"{where}: {argument}={value!r}: CUDA is not available "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False)"
        )
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"{where}: {argument}={value!r}: only {torch.cuda.device_count()} "
            "CUDA device(s) are visible"
        )
    if device.type == "mps":
        reason = backend.mps_unavailable_reason()
        if reason is not None:
            raise ValueError(
                f"{where}: {argument}={value!r}: MPS cannot be used: {reason}"
            )
    return device


def _simple(name: str) -> bool:
    """True for ``x``, ``self.model``, ``batch["ids"]``: fit to head a path."""
    try:
        node = ast.parse(name, mode="eval").body
    except SyntaxError:
        return False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name)


def _differences(ref: Leaves, tgt: Leaves, sides: tuple[str, str]) -> Iterator[str]:
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


def _validate(
    where: str,
    fn_or_module: Any,
    steps: Any,
    grads: bool,
    tolerances: tuple[Any, Any],
    reference_dtype: Any,
    train: Any,
    kwargs: Any,
) -> None:
    """Raise naming the argument when one is not usable."""
    import torch

    is_module = isinstance(fn_or_module, torch.nn.Module)
    if not callable(fn_or_module):
        raise TypeError(
            f"{where}: fn_or_module must be a torch.nn.Module or a callable, got "
            f"{type(fn_or_module).__name__} {fn_or_module!r:.80}"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"{where}: steps={steps!r} is not a count of steps (>= 0)")
    if steps and not (is_module and any(True for _ in fn_or_module.parameters())):
        raise ValueError(
            f"{where}: steps={steps} needs fn_or_module to be a torch.nn.Module "
            f"with parameters, not a {type(fn_or_module).__name__}"
        )
    if steps and not grads:
        raise ValueError(f"{where}: steps={steps} needs grads=True")
    rtol, atol = tolerances
    if (rtol is None) != (atol is None):
        raise ValueError(
            f"{where}: give both rtol and atol or neither "
            f"(rtol={rtol!r}, atol={atol!r})"
        )
    for label, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (isinstance(value, (int, float)) and value >= 0):
            raise ValueError(f"{where}: {label}={value!r} is not a tolerance (>= 0)")
    if reference_dtype is not None and not (
        isinstance(reference_dtype, torch.dtype) and reference_dtype.is_floating_point
    ):
        raise TypeError(
            f"{where}: reference_dtype={reference_dtype!r} is not a floating dtype"
        )
    if train is not None and not (is_module and isinstance(train, bool)):
        raise ValueError(
            f"{where}: train={train!r} needs True or False and a torch.nn.Module"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"{where}: kwargs must be a mapping, got {kwargs!r:.80}")


def _compare_runs(
    reference_run: Run,
    target_run: Run,
    target: torch.device,
    sides: tuple[str, str],
    widened: bool,
    tolerances: tuple[float | None, float | None],
) -> tuple[list[LeafDiff], list[str], list[str]]:
    """Every leaf's difference, the differences in structure, the tolerances."""
    problems: list[str] = []
    diffs: list[LeafDiff] = []
    used: dict[str, tuple[float, float, str]] = {}
    for kind in ("outputs", "grads", "after"):
        ref_leaves = getattr(reference_run, kind)
        tgt_leaves = dict(getattr(target_run, kind))
        problems += _differences(ref_leaves, list(tgt_leaves.items()), sides)
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
        else f"{dtype}: rtol={r:.1e}, atol={a:.1e} x scale ({source})"
        for dtype, (r, a, source) in used.items()
    ]
    return diffs, problems, notes


def _check(
    where: str,
    fn_or_module: Any,
    inputs: tuple[Any, ...],
    names: list[str],
    *,
    device: Any,
    reference: Any = "cpu",
    grads: bool = True,
    steps: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    reference_dtype: torch.dtype | None = None,
    train: bool | None = None,
    optimizer: Callable[[list[Any]], Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> ParityReport:
    __tracebackhide__ = True
    import torch

    _validate(
        where,
        fn_or_module,
        steps,
        grads,
        (rtol, atol),
        reference_dtype,
        train,
        kwargs,
    )
    target = _device(where, device, "device")
    ref = _device(where, reference, "reference")
    if reference_dtype == torch.float64 and ref.type == "mps":
        raise ValueError(
            f"{where}: reference_dtype=torch.float64 with reference={reference!r}: "
            "MPS holds no float64; keep the reference on the CPU"
        )
    is_module = isinstance(fn_or_module, torch.nn.Module)
    name = names[0] if _simple(names[0]) else ("model" if is_module else "fn")
    input_names = [n if _simple(n) else f"inputs[{i}]" for i, n in enumerate(names[1:])]
    sides = (f"the reference ({ref})", f"the device ({target})")
    notes: list[str] = []
    target_dtype = None
    if target.type == "mps" and float64_in(fn_or_module, inputs, kwargs):
        target_dtype = torch.float32
        reference_dtype = reference_dtype or torch.float64
        notes.append(
            f"{target} holds no float64: the device runs in float32, against "
            f"a {dtype_name(reference_dtype)} reference on {ref}"
        )
    elif reference_dtype is not None:
        notes.append(f"the reference runs in {dtype_name(reference_dtype)} on {ref}")
    if is_module:
        train, why = mode_notes(fn_or_module, train, seed, ref.type, target.type)
        notes += why
    if "cuda" in (ref.type, target.type):
        notes += tf32_notes(fn_or_module if is_module else None)
    if steps:
        how = "SGD(lr=0.1)" if optimizer is None else "the given optimizer"
        notes.append(f"{steps} optimizer step{'s' if steps > 1 else ''} with {how}")
    plan = Plan(
        fn=fn_or_module,
        name=name,
        inputs=inputs,
        input_names=input_names,
        kwargs=dict(kwargs or {}),
        train=train,
        grads=grads,
        steps=steps,
        optimizer=optimizer or (lambda params: torch.optim.SGD(params, lr=0.1)),
        seed=seed,
    )
    with rng_restored([ref, target]):
        reference_run = run(plan, ref, reference_dtype)
        target_run = run(plan, target, target_dtype)
    if grads and not reference_run.backward:
        notes.append("no output requires grad: gradients not compared")
    diffs, problems, tolerance_notes = _compare_runs(
        reference_run,
        target_run,
        target,
        sides,
        reference_dtype is not None,
        (rtol, atol),
    )
    notes += tolerance_notes
    for note in notes:
        print(f"{where}: {note}")
    if problems:
        raise AssertionError(
            f"{where}: fn_or_module ({name}) gives results of different structure "
            f"on {sides[0]} and {sides[1]}:\n  " + "\n  ".join(problems)
        )
    report = ParityReport(str(ref), str(target), diffs, notes)
    failed = report.failed
    if failed:
        shown = failed[:_MAX_ROWS]
        more = len(failed) - len(shown)
        raise ParityError(
            "\n".join(
                [
                    f"{where}: {len(failed)} of {len(diffs)} leaves differ between "
                    f"{sides[0]} and {sides[1]}",
                    *notes,
                    table(shown),
                    *([f"... and {more} more leaves out of tolerance"] if more else []),
                ]
            ),
            report,
        )
    return report


def assert_device_parity(
    fn_or_module: Any,
    *inputs: Any,
    device: str | torch.device,
    reference: str | torch.device = "cpu",
    grads: bool = True,
    steps: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    reference_dtype: torch.dtype | None = None,
    train: bool | None = None,
    optimizer: Callable[[list[Any]], Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> ParityReport:
    """Assert that ``fn_or_module(*inputs)`` gives on ``device`` what it gives on CPU.

    A module is deep-copied to each device (weights and buffers); tensors in
    ``inputs`` and ``kwargs`` (nested in dicts, lists, tuples, dataclasses) are
    copied too, floating ones as leaves that require grad when ``grads``. Each
    side is seeded with ``seed``, runs forward, then (``grads``) the backward of
    ``sum(w * output)`` over its differentiable outputs with fixed random ``w``,
    then ``steps`` optimizer steps (``optimizer(params)``, default
    ``SGD(lr=0.1)``). Compared, each named by its path: every output leaf,
    input and parameter gradient, parameter after the steps and buffer.

    Tolerances per dtype: ``torch.testing.assert_close``'s defaults, wider for
    float16/bfloat16 and for float32 on MPS; ``rtol`` and ``atol`` replace them
    for every leaf. ``atol`` counts in units of each leaf's largest
    ``|reference|`` value where that exceeds 1 (the table's ``atol`` column
    shows the result): gradients are long sums, accurate relative to their
    scale, not element by element. ``reference_dtype=torch.float64`` runs the
    reference in float64 (on MPS, which holds no float64, a float64 model runs
    in float32 against a float64 reference). A module with dropout in train
    mode runs seeded on two devices of one type and in eval mode on different
    types (CPU and GPU generators draw different numbers); ``train`` sets the
    mode. Notes on these choices are printed and head the failure message, a
    table of the leaves out of tolerance (a :class:`ParityError`, whose
    ``report`` has every leaf). Returns a :class:`ParityReport` of every leaf.
    """
    __tracebackhide__ = True
    names = argument_names(_caller(), "assert_device_parity", 1 + len(inputs))
    return _check(
        "assert_device_parity",
        fn_or_module,
        inputs,
        names,
        device=device,
        reference=reference,
        grads=grads,
        steps=steps,
        rtol=rtol,
        atol=atol,
        reference_dtype=reference_dtype,
        train=train,
        optimizer=optimizer,
        kwargs=kwargs,
        seed=seed,
    )


def _caller() -> FrameType | None:
    frame = inspect.currentframe()
    # this helper's frame -> the parity helper -> the user's call site
    return frame.f_back.f_back if frame and frame.f_back else None


class DeviceParity:
    """:func:`assert_device_parity` with ``device`` bound to the test's device."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __call__(self, fn_or_module: Any, *inputs: Any, **options: Any) -> ParityReport:
        """Run :func:`assert_device_parity` on the test's device."""
        __tracebackhide__ = True
        if "device" in options:
            raise TypeError(
                f"device_parity: device is the test's device ({self.device}); "
                "call assert_device_parity to choose another"
            )
        names = argument_names(_caller(), "device_parity", 1 + len(inputs))
        return _check(
            "device_parity", fn_or_module, inputs, names, device=self.device, **options
        )
