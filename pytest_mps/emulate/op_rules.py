"""Per-op rules of the tagged design, run at the dispatcher's BackendSelect key.

In the tagged design (:mod:`.tags`) device tensors are CPU tensors, so no
Python runs per aten op, which is what makes it cheap. The few ops a Mac
would not run as they are get a Python kernel at the ``BackendSelect`` key
instead: the ops with no MPS kernel (NotImplementedError, or PyTorch's
fallback warning with ``PYTORCH_ENABLE_MPS_FALLBACK``) and the ops whose MPS
kernel refuses some arguments (:mod:`pytest_mps.audit.kernels`). The kernel
judges, then hands the call on below BackendSelect (the CPU kernel).
BackendSelect sits below autograd, so the rules hold in backward too, and
other ops never meet them.

A rule judges an op only where a Mac dispatches it, never inside another op's
CPU kernel: ``torch.linalg.solve`` reaches ``_linalg_solve_ex``, whose CPU
kernel calls ``linalg_lu_solve``; a Mac runs ``_linalg_solve_ex``'s own MPS
kernel and never meets ``linalg_lu_solve``. An op is dispatched "from the top"
when it passes its autograd kernel; a call made inside another op's kernel
skips it (the outer op's autograd kernel excludes the autograd keys while it
runs, ``AutoDispatchBelowADInplaceOrView``). So each judged op also gets a
marker at ``AutogradCPU`` (:func:`_marker`) that tells the BackendSelect kernel
the call came from the top, then hands it to PyTorch's own autograd kernel.
(``ADInplaceOrView`` cannot mark: a functional op's autograd kernel skips it
too.) Backward formulas call ops from the top (``linalg_solve``'s backward
calls ``linalg_lu_solve``, on a Mac as here). Inference mode skips the
autograd keys everywhere: there every call is judged, as the Mac's outermost
one would be and nested ones may be. In every mode, the calls a judged op's
own CPU kernel makes are not judged (:attr:`_Depth.below`; a convolution's
CPU lowering in inference mode, where the marker cannot tell): an op gets a
kernel here only where its table outcome or its argument rules speak for the
whole op as a Mac runs it (it falls back whole to the CPU, or it is refused,
or its own MPS kernel or lowering runs), so nothing it calls inside reaches
a Mac's MPS backend.

A rule acts only inside a call on the emulated device: the function mode
(:mod:`.tagged`) raises a thread-local depth while it runs a call with a
device tensor, as does ``backward()`` of a device tensor; CPU work of the same
process runs untouched. Kernels are registered once per process and act
only while an emulation is installed (:func:`activate`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from pytest_mps import ops as mps_ops
from pytest_mps.emulate import policy

_ACTED_ON = frozenset({mps_ops.FALLBACK, mps_ops.FORCED_FALLBACK})


class _Depth(threading.local):
    value = 0
    #: The outermost torch call on the device running now, (func, args,
    #: kwargs), for the argument rules that ask which way an op was reached
    #: (``_linalg_svd`` through ``torch.linalg.svd`` runs on a Mac, through
    #: ``svdvals`` it raises).
    call: tuple[Any, Any, Any] | None = None
    #: The op whose autograd marker runs now: the call reached it from
    #: the top, as a Mac dispatches it (None: inside another op's kernel).
    top: str | None = None
    #: A judged op's CPU kernel runs now: the ops it calls are its own work,
    #: not judged, in every mode (in inference mode, which skips autograd,
    #: only this tells them apart from the Mac's calls).
    below = False


_depth = _Depth()
#: The installed emulation's policy, or None (the kernels pass through).
_current: list[policy.Policy | None] = [None]
_library: list[Any] = []
_registered: set[str] = set()
#: Ops judged only where the marker says they were dispatched from the top;
#: the rest (an op with an autograd kernel of its own) are judged wherever
#: they run.
_marked: set[str] = set()


class inside:
    """Marks the calling thread as running a call on the emulated device."""

    __slots__ = ()

    def __enter__(self) -> None:
        _depth.value += 1

    def __exit__(self, *exc: object) -> None:
        _depth.value -= 1


INSIDE = inside()


def active() -> bool:
    """True while the calling thread runs a call on the emulated device."""
    return _depth.value > 0


def _kernel(op: Any, key: str, outcome: str) -> Callable[..., Any]:
    below = torch._C.DispatchKey.BackendSelect
    name = key.removesuffix(".default")

    full = op.name()

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        rules = _current[0]
        if _depth.below:  # inside a judged op's CPU kernel: a Mac never runs it
            return op.redispatch(keyset.remove(below), *args, **kwargs)
        top = _depth.top == full or full not in _marked or _unmarkable(args)
        if not top and _depth.call is not None:
            top = _shared_kernel(_depth.call[0])
        _depth.top = None  # the ops its CPU kernel calls are not judged
        if top and rules is not None and _depth.value > 0 and not _sparse(args):
            # the installed emulation's rule: it follows its macOS version
            rule = rules.argument_rules.get(key)
            verdict = None if rule is None else rule(args, kwargs, _depth.call)
            if verdict is not None:
                rules.apply(verdict, name)
            elif outcome in _ACTED_ON:  # no rule, or it leaves it to the table
                rules._apply_outcome(outcome, name)
        _depth.below = True
        try:
            return op.redispatch(keyset.remove(below), *args, **kwargs)
        finally:
            _depth.below = False

    return kernel


def _marker(op: Any) -> Callable[..., Any]:
    """The ``AutogradCPU`` kernel of a judged op: it marks a call from the top.

    It sets the mark, then runs PyTorch's own autograd kernel for the op (the
    one the ``Autograd`` alias registered, which ``AutogradOther`` holds too):
    the call goes on exactly as it would have, grad_fn, version counters and
    views included.
    """
    full = op.name()
    cpu = torch._C.DispatchKey.AutogradCPU
    other = torch._C.DispatchKey.AutogradOther

    def marker(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        before = _depth.top
        _depth.top = full if _depth.value > 0 else None
        try:
            return op.redispatch(keyset.remove(cpu).add(other), *args, **kwargs)
        finally:
            _depth.top = before

    return marker


def _markable(op: Any) -> bool:
    """Whether ``op``'s autograd kernel for the CPU is PyTorch's generated one.

    Then ``AutogradOther`` holds the same kernel, and :func:`_marker` can take
    the CPU's place and hand the call on to it. An op with a kernel of its own
    at ``AutogradCPU``, or a composite one, keeps what it has (and is judged
    wherever it runs).
    """
    full = op.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if not has(full, "Autograd") or has(full, "CompositeImplicitAutograd"):
        return False
    if has(full, "AutogradCPU") or has(full, "AutogradOther"):
        return False
    return True


def _unmarkable(args: tuple[Any, ...]) -> bool:
    """True where the marker cannot tell a nested call from a top one.

    Inference mode excludes the autograd keys, and an inference tensor has
    none (c10/core/InferenceMode.h): no call passes the marker.
    """
    if torch.is_inference_mode_enabled():
        return True
    first = args[0] if args else None
    return isinstance(first, torch.Tensor) and first.is_inference()


#: torch call -> whether its aten op has a CompositeExplicitAutograd kernel.
_shared: dict[Any, bool] = {}
_SHARED_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def _shared_kernel(func: Any) -> bool:
    """True where the outermost torch call's op runs one kernel on every backend.

    A CompositeExplicitAutograd kernel (``logspace``'s, ``linalg_pinv``'s)
    runs below autograd, so the ops it calls skip their markers, yet a Mac
    runs that same kernel and meets them on MPS (``logspace.out``,
    ``_linalg_eigh``): they are judged. Read once per torch call from the
    dispatcher: any overload of the call's aten name with such a kernel and
    none of its own for the CPU (a structured op's functional form has both,
    and its CPU kernel is the CPU's: ``linalg_inv_ex`` on torch 2.6).
    """
    found = _shared.get(func)
    if found is None:
        name = getattr(func, "__name__", "") or ""
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        found = bool(name) and any(
            any(has(qualified, key) for key in _SHARED_KEYS)
            and not has(qualified, "CPU")
            for qualified in _packet(name)
        )
        _shared[func] = found
    return found


def _packet(name: str) -> list[str]:
    """The registered overloads of ``aten::name`` (qualified names)."""
    if not _names:
        for qualified in torch._C._dispatch_get_all_op_names():
            base = qualified.partition(".")[0]
            _names.setdefault(base, []).append(qualified)
    return _names.get(f"aten::{name}", [])


_names: dict[str, list[str]] = {}


def _sparse(args: tuple[Any, ...]) -> bool:
    """True for a call on a sparse tensor: a Mac runs it on the SparseMPS key.

    The op table reads the yaml's MPS key; sparse kernels sit under
    ``SparseMPS`` (``_coalesced_``, ``to_sparse``'s path), so they are not
    judged here.
    """
    first = args[0] if args else None
    return isinstance(first, torch.Tensor) and first.layout != torch.strided


def _overloads() -> list[Any]:
    """Every registered aten overload (``OpOverload``)."""
    found = []
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = qualified.partition("::")
        if namespace != "aten":
            continue
        name, _, overload = rest.partition(".")
        try:
            packet = getattr(torch.ops.aten, name)
            found.append(getattr(packet, overload or "default"))
        except (AttributeError, RuntimeError):
            continue
    return found


def register(rules: policy.Policy) -> int:
    """Register the kernels this policy needs (once per op per process).

    Returns how many ops have one now.
    """
    if not _library:
        _library.append(torch.library.Library("aten", "IMPL"))  # type: ignore[no-untyped-call]
    library = _library[0]
    for op in _overloads():
        full = op.name()
        if full in _registered:
            continue
        prediction = rules.table.predict(full)
        rule = rules.argument_rules.get(prediction.op)
        if rule is None and prediction.outcome not in _ACTED_ON:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(full, "BackendSelect"):
            continue  # a factory: BackendSelect already picks its backend
        library.impl(
            op,
            _kernel(op, prediction.op, prediction.outcome),
            "BackendSelect",
            with_keyset=True,
        )
        _registered.add(full)
        if _markable(op):
            library.impl(op, _marker(op), "AutogradCPU", with_keyset=True)
            _marked.add(full)
    return len(_registered)


def activate(rules: policy.Policy | None) -> None:
    """Let the kernels judge for ``rules`` (None: they pass every call on)."""
    _current[0] = rules
