"""Which CPU storages are on the emulated MPS device: a tag per storage.

The tagged design of the emulation (``../shared/design/emulation.md``; the
``tags`` design of :class:`.install.Emulation`) keeps every tensor an
ordinary CPU tensor, so autograd and every kernel see the CPU. "On the
emulated device" is a mark on the tensor's storage. Views, ``.data``,
``.detach()``, ``nn.Parameter(x)``, ``p.data = y`` and in-place ops share
their tensor's storage, so they carry the mark with no work; a mark on the
tensor object would be lost by each.

PyTorch keeps one Python object per storage for as long as the storage lives
(``a.untyped_storage() is a.untyped_storage()``, torch 2.6 onwards), so an
attribute on that object lives exactly as long as the storage, and a new
storage at a reused address starts unmarked. Reading it costs one attribute
lookup. The live device storages are kept as weak references (one per
storage, added when it is first tagged, gone with it) for
``torch.mps.current_allocated_memory()``, which the memory watcher samples
before each op.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

#: The attribute set on the storages of the emulated device.
MARK = "_pytest_mps_device"
#: Called with each newly tagged tensor (the emulated memory limit), or None.
on_new: list[Callable[[torch.Tensor], None] | None] = [None]
#: A weak reference to each tagged storage alive (its callback drops it).
_live: set[weakref.ref[Any]] = set()
#: How many storages were ever tagged in this process: a test that raised it
#: made a tensor on the emulated device (the session's summary counts them).
made = [0]


def tag(tensor: torch.Tensor) -> None:
    """Put ``tensor``'s storage (and so every view of it) on the device."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, ValueError):
        return  # sparse, nested, uninitialized: no storage of their own
    if MARK not in storage.__dict__:
        track = on_new[0]
        if track is not None:
            track(tensor)
        setattr(storage, MARK, True)
        _live.add(weakref.ref(storage, _live.discard))
        made[0] += 1


def untag(tensor: torch.Tensor) -> None:
    """Take ``tensor``'s storage off the device."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, ValueError):
        return
    storage.__dict__.pop(MARK, None)


def tagged(value: object) -> bool:
    """True for a tensor whose storage is on the emulated device."""
    if not isinstance(value, torch.Tensor):
        return False
    try:
        return MARK in value.untyped_storage().__dict__
    except (RuntimeError, NotImplementedError, ValueError):
        return False


def storage_tagged(storage: Any) -> bool:
    """True for an ``UntypedStorage`` on the emulated device."""
    return bool(getattr(storage, MARK, False))


def storages() -> Iterator[Any]:
    """The tagged storages alive now."""
    for ref in list(_live):
        storage = ref()
        if storage is not None and MARK in storage.__dict__:
            yield storage


def allocated_bytes() -> int:
    """Bytes held by the tagged storages alive now."""
    return sum(storage.nbytes() for storage in storages())


def tag_outputs(out: Any, hosts: Sequence[torch.Tensor], skip: frozenset[int]) -> None:
    """Tag each tensor ``out`` holds unless it is a host input or kept on the host."""
    if isinstance(out, torch.Tensor):
        if not hosts or all(out is not h for h in hosts):
            tag(out)
        return
    if type(out) is tuple or type(out) is list or isinstance(out, tuple):
        for index, item in enumerate(out):
            if index in skip:
                continue
            if isinstance(item, torch.Tensor):
                if not hosts or all(item is not h for h in hosts):
                    tag(item)
            elif type(item) is tuple or type(item) is list:
                for inner in item:
                    if isinstance(inner, torch.Tensor):
                        tag(inner)


def storage_device(original: Any) -> property:
    """``UntypedStorage.device`` that says mps for a tagged storage.

    ``t.untyped_storage().device`` is mps on a Mac. torch's own Python code
    (``torch.storage``'s ``clone``, ``cpu``, ``__deepcopy__``, pickling,
    ``torch.serialization``) still reads the host: it allocates and copies by
    that device, and the storage's memory is the host's.
    """
    getter = original.__get__
    mps = torch.device("mps", 0)

    def device(storage: Any) -> torch.device:
        if MARK in storage.__dict__:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller != "torch" and not caller.startswith("torch."):
                return mps
        value: torch.device = getter(storage)
        return value

    return property(device, doc=original.__doc__)


def storage_cpu(original: Any) -> Any:
    """``UntypedStorage.cpu()``: a host copy of a tagged storage, as on a Mac."""

    def cpu(storage: Any) -> Any:
        if MARK in storage.__dict__:
            return torch.UntypedStorage(storage.nbytes()).copy_(storage)  # type: ignore[no-untyped-call]
        return original(storage)

    return cpu
