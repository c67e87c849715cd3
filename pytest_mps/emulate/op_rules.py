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
when it passes its autograd kernel and then the ``ADInplaceOrView`` key; a call
made inside another op's kernel skips both (that kernel runs under
``AutoDispatchBelowADInplaceOrView``). So each judged op also gets a marker at
``ADInplaceOrView`` (:func:`_marker`) that does what PyTorch's kernel there
does (bump the version of an out= or in-place argument) and tells the
BackendSelect kernel the call came from the top. Backward formulas call ops
from the top too (``linalg_solve``'s backward calls ``linalg_lu_solve``, on a
Mac as here). Inference mode runs ``ADInplaceOrView`` inside kernels as well,
and inference tensors skip it: there every call is judged, as the Mac's
outermost one would be and nested ones may be.

A rule acts only inside a call on the emulated device: the function mode
(:mod:`.tagged`) raises a thread-local depth while it runs a call with a
device tensor, as does ``backward()`` of a device tensor; CPU work of the same
process runs untouched. Kernels are registered once per process and act
only while an emulation is installed (:func:`activate`).
"""

from __future__ import annotations

import threading
import warnings
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
    #: The op whose ADInplaceOrView marker runs now: the call reached it from
    #: the top, as a Mac dispatches it (None: inside another op's kernel).
    top: str | None = None


_depth = _Depth()
#: The installed emulation's policy, or None (the kernels pass through).
_current: list[policy.Policy | None] = [None]
_library: list[Any] = []
_registered: set[str] = set()
#: Ops judged only where the marker says they were dispatched from the top;
#: the rest (a view op's ADInplaceOrView kernel cannot be redone in Python)
#: are judged wherever they run.
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
        top = _depth.top == full or full not in _marked or _unmarkable(args)
        _depth.top = None  # the ops its CPU kernel calls are not judged
        if top and rules is not None and _depth.value > 0 and not _sparse(args):
            # the installed emulation's rule: it follows its macOS version
            rule = rules.argument_rules.get(key)
            if rule is not None:
                verdict = rule(args, kwargs, _depth.call)
                if verdict is not None:
                    rules.apply(verdict, name)
            elif outcome in _ACTED_ON:
                rules._apply_outcome(outcome, name)
        return op.redispatch(keyset.remove(below), *args, **kwargs)

    return kernel


def _marker(op: Any, rewrites: bool) -> Callable[..., Any]:
    """The ADInplaceOrView kernel of a judged op: it marks a call from the top.

    It does what PyTorch's kernel at that key does, marks or not: for an
    out= or in-place overload (``rewrites``) the generated kernel
    (``ADInplaceOrViewType``) redispatches below itself under
    ``AutoDispatchBelowADInplaceOrView``, then bumps the version of each
    argument it wrote; a functional op has a fallthrough there.
    """
    full = op.name()
    key = torch._C.DispatchKey.ADInplaceOrView
    written = [
        (index, argument.name)
        for index, argument in enumerate(op._schema.arguments)
        if argument.alias_info is not None and argument.alias_info.is_write
    ]

    def marker(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        before = _depth.top
        _depth.top = full if _depth.value > 0 else None
        try:
            if not rewrites:
                return op.redispatch(keyset.remove(key), *args, **kwargs)
            with torch._C._AutoDispatchBelowADInplaceOrView():
                result = op.redispatch(keyset.remove(key), *args, **kwargs)
        finally:
            _depth.top = before
        for index, name in written:
            tensor = args[index] if index < len(args) else kwargs.get(name)
            if isinstance(tensor, torch.Tensor):
                torch.autograd.graph.increment_version(tensor)
        return result

    return marker


def _markable(op: Any) -> bool | None:
    """Whether ``op`` can get a marker, and of which kind.

    True for one whose ADInplaceOrView kernel rewrites arguments (redone by
    :func:`_marker`), False for a fallthrough there, None for a view op (its
    kernel records the view, which Python cannot redo).
    """
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "ADInplaceOrView"):
        return False
    for argument in op._schema.arguments:
        if argument.alias_info is not None and not argument.alias_info.is_write:
            return None
    if not any(
        argument.alias_info is not None and argument.alias_info.is_write
        for argument in op._schema.arguments
    ):
        return None
    return True


def _unmarkable(args: tuple[Any, ...]) -> bool:
    """True where the marker cannot tell a nested call from a top one.

    Inference mode keeps ``ADInplaceOrView`` inside kernels, and an inference
    tensor has no such key at all (c10/core/InferenceMode.h).
    """
    if torch.is_inference_mode_enabled():
        return True
    first = args[0] if args else None
    return isinstance(first, torch.Tensor) and first.is_inference()


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
        rewrites = _markable(op)
        if rewrites is not None:
            with warnings.catch_warnings():
                # "Overriding a previously registered kernel": the marker
                # redoes what the generated kernel did
                warnings.simplefilter("ignore", UserWarning)
                library.impl(
                    op, _marker(op, rewrites), "ADInplaceOrView", with_keyset=True
                )
            _marked.add(full)
    return len(_registered)


def activate(rules: policy.Policy | None) -> None:
    """Let the kernels judge for ``rules`` (None: they pass every call on)."""
    _current[0] = rules
