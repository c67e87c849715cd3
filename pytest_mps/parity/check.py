"""``assert_device_parity``: a module computes on the device what it does on the CPU.

PyTorch checks its own MPS kernels this way (TestConsistency in test/test_mps.py
runs each op on MPS and on the CPU and compares outputs and gradients). This
does it for a user's module or function: two copies, one per device, the same
weights, inputs and seeds; forward, a backward with fixed weights on the
outputs, optional optimizer steps; then every output, input gradient, parameter
gradient, parameter after the steps and buffer is compared, named by its path.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from pytest_mps.assertions import argument_names, named_leaves
from pytest_mps.parity import settings
from pytest_mps.parity.arguments import device_named, validate
from pytest_mps.parity.compare import (
    MAX_ROWS,
    LeafDiff,
    compare_runs,
    dtype_name,
    table,
    tf32_allowed,
)
from pytest_mps.parity.findings import Localization
from pytest_mps.parity.layouts import (
    Layout,
    fitting,
    laid_out,
    layout_failure,
    layouts_note,
)
from pytest_mps.parity.localize import localized
from pytest_mps.parity.run import (
    Plan,
    Run,
    float64_in,
    make_plan,
    mode_notes,
    rng_restored,
    run,
    tf32_notes,
)
from pytest_mps.parity.twice import twice as run_twice
from pytest_mps.watch.attribution import plugin_work

if TYPE_CHECKING:
    import torch

__all__ = ["ParityError", "ParityReport", "assert_device_parity"]


@dataclasses.dataclass
class ParityReport:
    """Every leaf compared, with the notes on how the two runs were made."""

    reference: str
    target: str
    diffs: list[LeafDiff]
    notes: list[str]
    #: with ``layouts=True``: per layout, every leaf against the contiguous run
    layouts: dict[str, list[LeafDiff]] = dataclasses.field(default_factory=dict)
    #: on failure: the first device op out of tolerance on its own inputs
    localization: Localization | None = None
    #: the reference's and the device's runs, every leaf on the host
    runs: tuple[Run, Run] | None = dataclasses.field(default=None, repr=False)

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
    layouts: bool = False,
    twice: bool = False,
) -> ParityReport:
    __tracebackhide__ = True
    import torch

    validate(
        where,
        fn_or_module,
        steps,
        grads,
        (rtol, atol),
        reference_dtype,
        train,
        kwargs,
    )
    target = device_named(where, device, "device")
    ref = device_named(where, reference, "reference")
    if reference_dtype == torch.float64 and ref.type == "mps":
        raise ValueError(
            f"{where}: reference_dtype=torch.float64 with reference={reference!r}: "
            "MPS holds no float64; keep the reference on the CPU"
        )
    is_module = isinstance(fn_or_module, torch.nn.Module)
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
    tf32 = False
    if "cuda" in (ref.type, target.type):
        found = tf32_notes(fn_or_module if is_module else None)
        notes += found
        tf32 = target.type == "cuda" and bool(found)
    if steps:
        how = "SGD(lr=0.1)" if optimizer is None else "the given optimizer"
        notes.append(f"{steps} optimizer step{'s' if steps > 1 else ''} with {how}")
    plan = make_plan(
        fn_or_module, names, inputs, kwargs, train=train, grads=grads,
        steps=steps, optimizer=optimizer, seed=seed,
    )  # fmt: skip
    # the plugin's own work: the reference, the copies, the comparison; the
    # device side's calls into the user's code are the user's (parity.run)
    with plugin_work(), tf32_allowed(tf32):
        try:
            return _run_and_compare(
                where, plan, (ref, target), (reference_dtype, target_dtype), notes,
                (rtol, atol), layouts, twice,
            )  # fmt: skip
        except ParityError as error:
            if not settings.wanted():
                raise
            from pytest_mps.parity import bundle

            options: dict[str, Any] = {
                "names": names, "grads": grads, "steps": steps, "rtol": rtol,
                "atol": atol,
                "reference_dtype": reference_dtype, "train": train, "seed": seed,
                "layouts": layouts, "twice": twice, "kwargs": kwargs,
                **({"optimizer": optimizer} if optimizer is not None else {}),
            }  # fmt: skip
            lines = bundle.on_failure(
                fn_or_module, inputs, options, error.report.runs, (ref, target), where
            )
            if lines:
                error.args = ("\n".join([str(error), *lines]),)
            raise


def _run_and_compare(
    where: str,
    plan: Plan,
    devices: tuple[torch.device, torch.device],
    dtypes: tuple[torch.dtype | None, torch.dtype | None],
    notes: list[str],
    tolerances: tuple[float | None, float | None],
    layouts: bool,
    twice: bool = False,
) -> ParityReport:
    __tracebackhide__ = True
    ref, target = devices
    sides = (f"the reference ({ref})", f"the device ({target})")
    widened = dtypes[0] is not None
    with rng_restored([ref, target]):
        reference_run = run(plan, ref, dtypes[0], checked=False)
        target_run = run(plan, target, dtypes[1])
        given = named_leaves((plan.inputs, plan.kwargs), "inputs")
        fits = fitting(t for _, t in given) if layouts else []
        variants = []
        for layout in fits:  # a loop: a comprehension's frame would show
            variants.append(
                (layout, _run_layout(where, plan, layout, devices, dtypes[1]))
            )
    if plan.grads and not reference_run.backward:
        notes.append("no output requires grad: gradients not compared")
    diffs, problems, tolerance_notes = compare_runs(
        reference_run, target_run, target, sides, widened, tolerances
    )
    notes += tolerance_notes
    if layouts:
        notes.append(layouts_note(fits))
    for note in notes:
        print(f"{where}: {note}")
    if problems:
        raise AssertionError(
            f"{where}: fn_or_module ({plan.name}) gives results of different "
            f"structure on {sides[0]} and {sides[1]}:\n  " + "\n  ".join(problems)
        )
    report = ParityReport(str(ref), str(target), diffs, notes)
    report.runs = (reference_run, target_run)
    failed = report.failed
    if failed:
        shown = failed[:MAX_ROWS]
        more = len(failed) - len(shown)
        found, where_lines = localized(plan, devices, dtypes, tolerances, target_run)
        report.localization = found
        raise ParityError(
            "\n".join(
                [
                    f"{where}: {len(failed)} of {len(diffs)} leaves differ between "
                    f"{sides[0]} and {sides[1]}",
                    *notes,
                    table(shown),
                    *([f"... and {more} more leaves out of tolerance"] if more else []),
                    *where_lines,
                ]
            ),
            report,
        )
    lines: list[str] = []
    for layout, variant in variants:
        here = (f"the contiguous run ({target})", f"{layout.name} ({target})")
        against_run, odd, _ = compare_runs(
            target_run, variant, target, here, False, tolerances
        )
        against_ref, odd_ref, _ = compare_runs(
            reference_run, variant, target, sides, widened, tolerances
        )
        report.layouts[layout.name] = against_run
        failure = layout_failure(
            layout, target, against_run, against_ref, odd + odd_ref
        )
        if failure and report.localization is None:
            found, where_lines = localized(
                laid_out(plan, layout), devices, dtypes, tolerances, variant
            )
            report.localization = found
            failure += where_lines
        lines += failure
    if lines:
        raise ParityError("\n".join([f"{where}: {lines[0]}", *lines[1:]]), report)
    if twice:
        lines, _ = run_twice(where, plan, target, (0.0, 0.0), dtypes[1])
        if lines:
            raise ParityError("\n".join(lines), report)
    return report


def _run_layout(
    where: str,
    plan: Plan,
    layout: Layout,
    devices: tuple[torch.device, torch.device],
    dtype: torch.dtype | None,
) -> Run:
    """The device side in ``layout``; an error there is a ParityError naming it."""
    __tracebackhide__ = True
    ref, target = devices
    try:
        return run(laid_out(plan, layout), target, dtype, checked=False)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ParityError(
            f"{where}: layout {layout.name} ({layout.what}) raises on {target}: "
            f"{type(exc).__name__}: {first}",
            ParityReport(str(ref), str(target), [], []),
        ) from exc


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
    layouts: bool = False,
    twice: bool = False,
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

    ``layouts=True`` then runs the device side again with every input remade,
    same values, transposed, strided and (4-d, 5-d) channels_last, compares
    each run with the contiguous one and the reference, and names the layout
    that differs (MPS kernels have returned wrong results on non-contiguous
    inputs: pytorch#124834, #118115). A ``device`` or ``reference`` this
    machine lacks skips the test with the reason. ``twice=True`` then runs
    the device side twice more and fails unless both runs agree bit for bit,
    naming the first op whose outputs differ between them
    (:func:`~pytest_mps.parity.twice.assert_reproducible`). On a failure the
    device side runs again under recorders, and the message names the first
    device op wrong on its own inputs and its layer (:mod:`.localize`). The
    reference and the
    comparison are the plugin's own work: ``--mps-audit`` and the watchers see
    only the device side's forward, backward and optimizer steps.
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
        layouts=layouts,
        twice=twice,
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
