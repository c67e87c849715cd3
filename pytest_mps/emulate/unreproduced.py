"""What a failing emulated test touched that the emulation does not reproduce.

Some of a Mac's behaviour cannot be had on the CPU: MPS's random stream
(Philox, in Metal), the order in which its parallel kernels write and sort
equal keys, Metal's numerics where PyTorch says they differ from the CPU's,
and other Python processes, which do not load the emulation. Running into
them is no error (every training loop draws random numbers), so nothing is
raised. The calls are noted per test instead (:func:`note_draw`,
:func:`note_call`, :func:`note_process`), and a test that fails, or that a
Mac fails and that passes here (unittest's "Unexpected success"), gets one
line naming what it touched (:func:`line`).

The rules name their source: PyTorch's comments in
``torch/testing/_internal/common_mps.py`` and the MPS kernels.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

#: Calls that draw from a generator: on a Mac from MPS's own (Philox in
#: Metal, aten/src/ATen/mps/MPSGeneratorImpl.mm), here from the CPU's
#: stream, so a seeded draw gives other numbers than a Mac's.
RANDOM_CALLS = frozenset(
    {"rand", "randn", "randint", "randperm", "normal", "normal_", "uniform_"}
    | {"random_", "bernoulli", "bernoulli_", "exponential_", "geometric_"}
    | {"cauchy_", "log_normal_", "multinomial", "rand_like", "randn_like"}
    | {"randint_like", "poisson", "dropout", "dropout_", "alpha_dropout"}
    | {"feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d"}
    | {"rrelu", "rrelu_", "gumbel_softmax"}
)
#: Draws that usually make a test's inputs. Their values reach both sides of
#: a comparison, so a draw inside an op (a dropout mask) is named first.
_MAKING_INPUTS = frozenset(
    {"rand", "randn", "randint", "randperm", "normal", "normal_", "uniform_"}
    | {"random_", "rand_like", "randn_like", "randint_like"}
)
_HALF = (torch.float16, torch.bfloat16)


class _Seen:
    """A test's draws (call -> first line), notes (text -> first line), processes."""

    __slots__ = ("draws", "notes", "processes")

    def __init__(self) -> None:
        self.draws: dict[str, str] = {}
        self.notes: dict[str, str] = {}
        self.processes: list[str] = []


seen = [_Seen()]


def forget() -> None:
    """Start a new test: nothing touched yet."""
    seen[0] = _Seen()


def _location() -> str:
    from pytest_mps.watch.locations import user_location

    return user_location()


def note_draw(name: str, dtype: torch.dtype | None = None) -> None:
    """Note a call that drew random numbers on the device, once per call name.

    ``rand`` in half precision is named as a draw of its own: the CPU's gives
    an exact 0 about once in 2,900 float16 (560 bfloat16) draws (measured,
    torch 2.13), which a Dirichlet concentration, a log or a division meets.
    """
    if name not in RANDOM_CALLS:
        return
    if name in _MAKING_INPUTS:
        inside = _drawn_inside()
        if inside is not None:
            name = f"{name} inside {inside}"
        elif dtype in _HALF and name in ("rand", "rand_like", "uniform_"):
            name = f"{name} in {dtype}"
    draws = seen[0].draws
    if name not in draws:
        draws[name] = _location()


#: torch's files that draw inside an op: the random projections of
#: ``pca_lowrank`` and ``svd_lowrank`` (``get_approximate_basis``).
_DRAWING_FILES = ("_lowrank.py",)
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _drawn_inside() -> str | None:
    """``torch.pca_lowrank``'s name when its code made this draw, else None."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_OURS):
        frame = frame.f_back
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    torch_file = os.sep + "torch" + os.sep in filename
    if not (torch_file and filename.endswith(_DRAWING_FILES)):
        return None
    while frame is not None and frame.f_code.co_filename == filename:
        name = frame.f_code.co_name
        frame = frame.f_back
    return f"torch.{name}"


def allocator_statistic(name: str, count: Callable[[], int]) -> Callable[[], int]:
    """``torch.mps.<name>()`` as ``count`` gives it, noted when a test reads it.

    The emulation counts the bytes of the device's live tensors; a Mac's
    allocator counts its Metal heaps and cache, and grows by a heap at a time.
    pytest-mps's own reads (the memory watcher's) are not noted.
    """
    text = (
        f"the MPS allocator's statistics (torch.mps.{name}): here the bytes "
        "of the emulated device's live tensors, without Metal's heaps or the "
        "allocator's cache"
    )

    def read() -> int:
        notes = seen[0].notes
        if text not in notes:
            # 1: torch.mps's function; 2: the code that asked
            asker = sys._getframe(2).f_code.co_filename
            if not asker.startswith(_OURS):
                notes[text] = _location()
        return count()

    return read


def note_process(executable: str) -> None:
    """Note a Python process the test started (it runs without the emulation)."""
    if len(seen[0].processes) < 3:
        seen[0].processes.append(executable)


def _first(args: Sequence[Any], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    first = args[0] if args else kwargs.get("input", kwargs.get("self"))
    return first if isinstance(first, torch.Tensor) else None


def _sort(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    first = _first(args, kwargs)
    if first is None or kwargs.get("stable") or first.dtype not in _HALF:
        return None
    return (
        f"the order MPS's {name} gives equal {first.dtype} keys: without "
        "stable=True it is undefined, and MPS's differs from the CPU's "
        "(common_mps.py's ON_MPS_XFAILLIST)"
    )


def _softmax(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    dtype = kwargs.get("dtype")
    if dtype is None:
        dtype = next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
    first = _first(args, kwargs)
    if dtype is None or first is None or dtype == first.dtype:
        return None
    return (
        f"MPS's {name} with dtype={dtype}: Metal builds its backward in the "
        "output's dtype (SoftMax.mm), where the CPU's kernel accumulates in "
        "float32"
    )


def _nanmedian(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    first = _first(args, kwargs)
    if first is None or not first.is_floating_point():
        return None
    if not bool(torch.isnan(first).any()):
        return None
    return (
        "where MPS's nanmedian puts NaN: it sorts with MPSGraph and gathers "
        "at (valid count + 1) / 2 - 1, -1 for a row of NaN (ReduceOps.mm)"
    )


def _group_norm(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str | None:
    first = _first(args, kwargs)
    if first is None or not (first.requires_grad and torch.is_grad_enabled()):
        return None
    return (
        "the gradient of MPS's native_group_norm, which PyTorch marks as "
        "differing in float32 (infinitely_differentiable_native_group_norm_"
        "backward)"
    )


def _complex_edges(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str | None:
    first = _first(args, kwargs)
    if first is None or not first.is_complex() or bool(torch.isfinite(first).all()):
        return None
    return (
        f"Metal's complex {name} at infinities and NaN (on the real axis a "
        "Mac keeps the imaginary part 0; the CPU's kernel gives NaN)"
    )


def _duplicate_writes(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str | None:
    accumulate = kwargs.get("accumulate", args[3] if len(args) > 3 else False)
    if accumulate or torch.are_deterministic_algorithms_enabled():
        return None
    indices = kwargs.get("indices", args[1] if len(args) > 1 else ())
    for index in indices or ():
        if (
            isinstance(index, torch.Tensor)
            and index.dtype != torch.bool
            and index.numel() > 1
            and torch.unique(index).numel() < index.numel()
        ):
            return (
                f"the order of MPS's parallel {name} writes to repeated "
                "indices: a Mac keeps any one of them (pytorch#97574), the "
                "CPU the last"
            )
    return None


def _drawing(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Attention whose own dropout draws (``dropout_p > 0``, training)."""
    index, training = _DROPOUT_P[name]
    p = kwargs.get("dropout_p", args[index] if len(args) > index else 0.0)
    if training is not None and not kwargs.get(
        "training", args[training] if len(args) > training else True
    ):
        return None
    if not p:
        return None
    name = f"{name} with dropout_p={p}"
    draws = seen[0].draws
    if name not in draws:
        draws[name] = _location()
    return None


#: Where attention's ``dropout_p`` (and ``training``) sit among the arguments.
_DROPOUT_P = {
    "scaled_dot_product_attention": (4, None),
    "multi_head_attention_forward": (10, 13),
}

_Rule = Callable[[str, Sequence[Any], Mapping[str, Any]], "str | None"]
#: Device calls whose Mac results the emulation does not reproduce, by name
#: (:func:`..tagged._op_name`); each rule says whether this call is one.
RULES: dict[str, _Rule] = {
    "sort": _sort,
    "argsort": _sort,
    "msort": _sort,
    "softmax": _softmax,
    "log_softmax": _softmax,
    "softmin": _softmax,
    "nanmedian": _nanmedian,
    "group_norm": _group_norm,
    "native_group_norm": _group_norm,
    "special_expm1": _complex_edges,
    "expm1": _complex_edges,
    "index_put": _duplicate_writes,
    "index_put_": _duplicate_writes,
    "scaled_dot_product_attention": _drawing,
    "multi_head_attention_forward": _drawing,
}


#: The device calls :func:`note` takes.
NOTED = frozenset(RULES) | RANDOM_CALLS


def note(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Note a device call of :data:`NOTED`: a rule's or a draw."""
    if name in RULES:
        note_call(name, args, kwargs)
    else:
        first = args[0] if args else None
        note_draw(name, kwargs.get("dtype", getattr(first, "dtype", None)))


def note_call(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Note a device call of :data:`RULES` whose Mac result is not reproduced."""
    notes = seen[0].notes
    if len(notes) >= 3:
        return
    text = RULES[name](name, args, kwargs)
    if text is not None and text not in notes:
        notes[text] = _location()


def line() -> tuple[str, str] | None:
    """What this test touched that is not emulated: (title, one line); or None.

    A note of :data:`RULES` first, then a draw inside an op (a dropout mask,
    half-precision ``rand``), then a Python process started: each "not
    emulated". A draw that only made inputs may not matter (a comparison
    copies them to both sides), so it is named as what may differ.
    """
    from pytest_mps.emulate.messages import NOT_EMULATED

    current = seen[0]
    inside = sorted(
        (n for n in current.draws if n not in _MAKING_INPUTS),
        key=lambda n: n.endswith("float16"),  # half-precision rand after the rest
    )
    if current.notes:
        text, where = next(iter(current.notes.items()))
        what = f"{text} ({where})"
    elif inside:
        what = (
            f"MPS's random stream ({inside[0]} at {current.draws[inside[0]]}): "
            "a Mac's generator (Philox, in Metal) draws other numbers from the "
            "same seed; here the CPU's stream is drawn"
        )
    elif current.processes:
        what = (
            f"another Python process ({current.processes[0]}): it runs on "
            "this Linux host without the emulation"
        )
    elif current.draws:
        name, where = next(iter(current.draws.items()))
        return "random numbers", (
            f"This test drew random numbers on the emulated device ({name} at "
            f"{where}). The emulated device draws the CPU's stream; a Mac's MPS "
            "generator draws another, so values seeded and recorded on a Mac "
            "differ here (and values recorded here differ on a Mac)."
        )
    else:
        return None
    return "not emulated", NOT_EMULATED.format(what=what)
