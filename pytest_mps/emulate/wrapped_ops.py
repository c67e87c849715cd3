"""The wrapper design's bookkeeping around each aten op (see :mod:`.tensor`).

What dispatch reads once of an op's schema (:class:`Op`), whether an op
returns a view, the user's requests for a host copy (:class:`host_copy`), the
running policy and the live tensors, and the repairs an op's output needs (a
lazy conj or neg bit applied, a wrapper's shape after an in-place metadata op),
and how a wrapper prints (as PyTorch prints an MPS tensor).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from pytest_mps.emulate import policy
from pytest_mps.watch.device_mix import written_positions

#: The running emulation's policy (set by :mod:`.install`), or None.
current: list[policy.Policy | None] = [None]


#: The data of the emulated tensors alive now, by id, for
#: ``torch.mps.current_allocated_memory()`` (a WeakSet would compare tensors
#: with ``==``).
live: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


class Op:
    """What dispatch asks of one aten op, read once from its schema.

    Kept by ``id(func)``: an ``OpOverload``'s ``__hash__`` is Python code,
    and a dict lookup keyed by the op itself ran it four times per op.
    The record holds the op, so the id is never reused.
    """

    __slots__ = ("func", "generator", "returns_view", "writes_first")

    def __init__(self, func: Any) -> None:
        self.func = func
        self.generator = any(a.name == "generator" for a in func._schema.arguments)
        self.writes_first = 0 in written_positions(func)
        self.returns_view = returns_view(func)


ops: dict[int, Op] = {}


view_ops: dict[Any, bool] = {}


def returns_view(func: Any) -> bool:
    """True for an op whose output aliases its input without writing it."""
    found = view_ops.get(func)
    if found is None:
        returns = func._schema.returns
        info = returns[0].alias_info if returns else None
        found = view_ops[func] = info is not None and not info.is_write
    return found


class HostCopies(threading.local):
    """How deep the thread is in :class:`host_copy` blocks."""

    depth = 0


#: Above 0 while the user's own call asks for a copy on the host.
host_copies = HostCopies()


class host_copy:
    """While open, an op given ``device="cpu"`` leaves the device (see dispatch)."""

    def __enter__(self) -> None:
        host_copies.depth += 1

    def __exit__(self, *exc: object) -> None:
        host_copies.depth -= 1


def resolved(inner: torch.Tensor) -> torch.Tensor:
    """A copy of a lazily conjugated or negated view, its bits applied.

    The CPU kernels an op reaches from ``__torch_dispatch__`` do not apply
    the view's conj or neg bit (``a * torch.conj(b)`` computed ``a * b``):
    apply them here, on the bit-free view, as PyTorch's fallback would.
    """
    out = inner
    if out.is_conj():
        out = torch.conj_physical(out.conj())
    if out.is_neg():
        out = torch.neg(out._neg_view())
    return out


def follow_metadata(wrapper: Any) -> None:
    """Give ``wrapper`` its data's shape after an in-place metadata op.

    ``unsqueeze_``, ``t_``, ``resize_``, ``set_`` and their family change the
    shape of the data in ``_inner``; the wrapper's own sizes were fixed when
    it was made. Point the wrapper at the data's storage with the data's
    shape, below the Python dispatch, keeping its identity.
    """
    inner = wrapper._inner
    if (
        wrapper.size() == inner.size()
        and wrapper.stride() == inner.stride()
        and wrapper.storage_offset() == inner.storage_offset()
    ):
        return
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        torch.ops.aten.set_.source_Storage_storage_offset(
            wrapper,
            inner.untyped_storage(),
            inner.storage_offset(),
            inner.size(),
            inner.stride(),
        )


_OWN_PREFIX = "EmulatedTensor("


def describe(tensor: Any) -> str:
    """``repr`` as PyTorch prints an MPS tensor: ``tensor([...], device='mps:0')``."""
    text: str = torch._tensor_str._str(tensor)  # type: ignore[no-untyped-call]
    if text.startswith(_OWN_PREFIX):
        shift = len(_OWN_PREFIX) - len("tensor(")
        lines = text[len(_OWN_PREFIX) :].split("\n")
        text = "\n".join(["tensor(" + lines[0], *(line[shift:] for line in lines[1:])])
    if getattr(tensor, "_is_param", False):
        return "Parameter containing:\n" + text
    return text
