"""Training equivalence: resume, gradient accumulation, autocast.

A training loop can be wrong while every step looks right: a resumed run
that is not the run it resumed (a scheduler stepped twice on resume, an RNG
not restored), gradient accumulation that is not the larger batch (a loss
not divided by the number of micro-batches), mixed precision that drifts
from full precision. trainparity and pytest-torch check these; these are the
same checks as assertions, on any device.

Each takes the user's own functions, so it fits any loop:

- :func:`assert_resume_matches`: ``train(steps, state)`` trains ``steps``
  optimizer steps from ``state`` (None: from scratch) and returns the state
  after them (state dicts of the model, optimizer, scheduler; a step count).
  Running ``steps`` at once must equal running ``resume_at``, saving the
  state through ``torch.save`` as a checkpoint does, and running the rest.
- :func:`assert_accumulation_matches`: ``step(batches)`` makes one optimizer
  step from a fresh start, accumulating gradients over ``batches``, and
  returns what it made. One batch must equal the same batch in
  ``micro_batches`` pieces.
- :func:`assert_autocast_close`: ``run(context)`` runs under the given
  context manager; under ``torch.autocast`` it must stay within a stated
  tolerance of full precision.

Failures name every leaf that differs by its path (``model["fc.weight"]``,
``scheduler["last_epoch"]``) with the largest difference.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "assert_accumulation_matches",
    "assert_autocast_close",
    "assert_resume_matches",
]

#: leaves listed in a failure message, at most
MAX_SHOWN = 12


def _leaves(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, tensor or number) for every leaf; objects with state_dict opened."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (bool, int, float)):
        yield path, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _leaves(value, f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _leaves(value, f"{path}[{i}]")
    elif hasattr(obj, "state_dict") and callable(obj.state_dict):
        yield from _leaves(obj.state_dict(), path)


def _difference(a: Any, b: Any, rtol: float, atol: float) -> tuple[bool, str]:
    """(within tolerance, how far apart) for two leaves."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False, (
                f"{a.dtype} {tuple(a.shape)} against {b.dtype} {tuple(b.shape)}"
            )
        x = a.detach().to("cpu")
        y = b.detach().to("cpu")
        if not (x.is_floating_point() or x.is_complex()):
            same = bool(torch.equal(x, y))
            return same, "equal" if same else "integer values differ"
        wide = torch.complex128 if x.is_complex() else torch.float64
        x, y = x.to(wide), y.to(wide)
        diff = (x - y).abs()
        both_nan = x.isnan() & y.isnan()
        diff = torch.where(both_nan, 0.0, diff).nan_to_num(nan=math.inf)
        allowed = atol + rtol * y.abs()
        bad = int((diff > allowed).sum())
        worst = float(diff.max()) if diff.numel() else 0.0
        return bad == 0, f"max |diff| {worst:.3g}, {bad}/{diff.numel()} out"
    if isinstance(a, (bool, int, float)) and isinstance(b, (bool, int, float)):
        if isinstance(a, float) or isinstance(b, float):
            ok = math.isclose(a, b, rel_tol=rtol, abs_tol=atol) or a == b
        else:
            ok = a == b
        return ok, f"{a!r} against {b!r}"
    return False, f"{type(a).__name__} against {type(b).__name__}"


def _compare(
    where: str,
    what: tuple[str, str],
    expected: Any,
    actual: Any,
    tolerances: tuple[float, float],
    ignore: tuple[str, ...] = (),
) -> None:
    __tracebackhide__ = True
    from pytest_mps.watch.attribution import plugin_work

    # the comparison (float64, copies to the host) is the plugin's own work:
    # the audit and the watchers judge the user's training code only
    with plugin_work():
        _compare_leaves(where, what, expected, actual, tolerances, ignore)


def _compare_leaves(
    where: str,
    what: tuple[str, str],
    expected: Any,
    actual: Any,
    tolerances: tuple[float, float],
    ignore: tuple[str, ...],
) -> None:
    __tracebackhide__ = True
    skipped = tuple(f"state[{key!r}]" for key in ignore)
    left = {p: v for p, v in _leaves(expected, "state") if not p.startswith(skipped)}
    right = {p: v for p, v in _leaves(actual, "state") if not p.startswith(skipped)}
    # (order, text): counts and settings first (a step count, a scheduler's
    # last_epoch say most), then tensors, each by path
    found: list[tuple[int, str]] = []
    for path in left.keys() - right.keys():
        found.append((0, f"{path}: only in {what[0]}"))
    for path in right.keys() - left.keys():
        found.append((0, f"{path}: only in {what[1]}"))
    for path in left.keys() & right.keys():
        ok, how = _difference(right[path], left[path], *tolerances)
        if not ok:
            found.append((1 if hasattr(left[path], "shape") else 0, f"{path}: {how}"))
    problems = [text for _, text in sorted(found)]
    if not left:
        raise TypeError(
            f"{where}: the state holds no tensor or number to compare "
            f"(got {type(expected).__name__})"
        )
    if problems:
        shown = problems[:MAX_SHOWN]
        more = len(problems) - len(shown)
        rule = (
            "bit for bit"
            if tolerances == (0.0, 0.0)
            else f"rtol={tolerances[0]:g}, atol={tolerances[1]:g}"
        )
        raise AssertionError(
            "\n".join(
                [
                    f"{where}: {what[1]} differs from {what[0]} ({rule}) in "
                    f"{len(problems)} of {len(left)} leaves:",
                    *(f"  {p}" for p in shown),
                    *([f"  ... and {more} more"] if more else []),
                ]
            )
        )


def _as_state(obj: Any) -> Any:
    """``obj`` with each module, optimizer and scheduler as its state dict."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        return {k: _as_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_as_state(v) for v in obj)
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        return obj.state_dict()
    return obj


def _checkpointed(state: Any) -> Any:
    """``state`` after a round trip through ``torch.save``, as a checkpoint file.

    Modules, optimizers and schedulers in it are saved as their state dicts.
    """
    import torch

    from pytest_mps.watch.attribution import plugin_work

    buffer = io.BytesIO()
    with plugin_work():
        torch.save(_as_state(state), buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)


def _tolerances(where: str, rtol: float, atol: float) -> tuple[float, float]:
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{where}: {name}={value!r} is not a tolerance (>= 0)")
    return float(rtol), float(atol)


def assert_resume_matches(
    train: Callable[[int, Any], Any],
    *,
    steps: int = 6,
    resume_at: int = 3,
    rtol: float = 0.0,
    atol: float = 0.0,
    ignore: tuple[str, ...] = (),
) -> None:
    """Assert that training resumed from a checkpoint is the run it resumed.

    ``train(n, state)`` trains ``n`` optimizer steps from ``state`` (``None``:
    from scratch, seeded by ``train`` itself) and returns the state after them,
    as a checkpoint would hold it: state dicts of the model, the optimizer and
    the scheduler, a step count, RNG states (modules, optimizers and schedulers
    may be returned as they are: their ``state_dict()`` is compared). Runs
    ``train(steps, None)``, then ``train(resume_at, None)``, saves that state
    through ``torch.save`` / ``torch.load`` and runs
    ``train(steps - resume_at, loaded)``; the two final states must agree,
    bit for bit by default. ``ignore`` names keys of a dict state left out of
    the comparison (a run's clock, its evaluation history). The failure names
    each leaf that differs.
    """
    __tracebackhide__ = True
    where = "assert_resume_matches"
    tolerances = _tolerances(where, rtol, atol)
    if not (isinstance(steps, int) and isinstance(resume_at, int)):
        raise TypeError(f"{where}: steps and resume_at must be integers")
    if not 0 < resume_at < steps:
        raise ValueError(
            f"{where}: resume_at={resume_at} must lie between 0 and steps={steps}"
        )
    whole = _checkpointed(train(steps, None))
    halfway = _checkpointed(train(resume_at, None))
    resumed = _checkpointed(train(steps - resume_at, halfway))
    _compare(
        where,
        (
            f"{steps} steps in one run",
            f"{resume_at} steps, a checkpoint, then {steps - resume_at} resumed",
        ),
        whole,
        resumed,
        tolerances,
        tuple(ignore),
    )


def _split(batch: Any, pieces: int, where: str) -> list[Any]:
    """``batch`` cut along dim 0 into ``pieces`` equal parts, containers kept."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.shape[0] % pieces:
            raise ValueError(
                f"{where}: a batch of {batch.shape[0]} does not split into "
                f"{pieces} equal micro-batches"
            )
        return list(batch.chunk(pieces))
    if isinstance(batch, Mapping):
        parts = {k: _split(v, pieces, where) for k, v in batch.items()}
        return [{k: v[i] for k, v in parts.items()} for i in range(pieces)]
    if isinstance(batch, (list, tuple)):
        columns = [_split(v, pieces, where) for v in batch]
        return [type(batch)(c[i] for c in columns) for i in range(pieces)]
    return [batch] * pieces


def assert_accumulation_matches(
    step: Callable[[list[Any]], Any],
    batch: Any,
    *,
    micro_batches: int = 4,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    """Assert that accumulating gradients over micro-batches is the larger batch.

    ``step(batches)`` starts from the same initial state each call (seeded
    model and optimizer), accumulates gradients over the list ``batches``,
    makes one optimizer step and returns what to compare (the model, its
    gradients, the loss). ``step([batch])`` must agree with
    ``step(pieces)``, where ``pieces`` is ``batch`` cut along its first
    dimension into ``micro_batches`` equal parts (tensors, and tensors in
    dicts, lists and tuples). Sums taken in another order round differently:
    the default tolerance allows float32's rounding, not a loss left
    undivided by the number of micro-batches.
    """
    __tracebackhide__ = True
    where = "assert_accumulation_matches"
    tolerances = _tolerances(where, rtol, atol)
    if not isinstance(micro_batches, int) or micro_batches < 2:
        raise ValueError(f"{where}: micro_batches={micro_batches!r} must be 2 or more")
    pieces = _split(batch, micro_batches, where)
    whole = step([batch])
    accumulated = step(pieces)
    _compare(
        where,
        ("one batch", f"{micro_batches} accumulated micro-batches"),
        whole,
        accumulated,
        tolerances,
    )


def assert_autocast_close(
    run: Callable[[contextlib.AbstractContextManager[Any]], Any],
    *,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
    rtol: float = 5e-2,
    atol: float = 5e-2,
) -> None:
    """Assert that ``run`` under autocast stays within a tolerance of full precision.

    ``run(context)`` runs the computation (a few training steps, a forward
    and backward) with ``context`` around its forward passes and returns what
    to compare (a loss, the model after the steps). It runs once under
    ``contextlib.nullcontext()`` and once under ``torch.autocast(device_type,
    dtype)``; ``dtype`` defaults to bfloat16 (CPU, MPS) or float16 (CUDA).
    The default tolerance is PyTorch's MPS-vs-CPU one for half-precision
    matmuls (``test_mps.py``); state the one your model is held to.
    """
    __tracebackhide__ = True
    import torch

    where = "assert_autocast_close"
    tolerances = _tolerances(where, rtol, atol)
    kind = torch.device(device).type
    if dtype is None:
        dtype = torch.float16 if kind == "cuda" else torch.bfloat16
    full = run(contextlib.nullcontext())
    mixed = run(torch.autocast(kind, dtype=dtype))
    _compare(
        where,
        ("full precision", f"autocast to {str(dtype).removeprefix('torch.')}"),
        full,
        mixed,
        tolerances,
    )
