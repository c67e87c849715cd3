"""``torch.save`` and ``torch.load`` of emulated tensors: the files a Mac writes.

A Mac pickles an MPS tensor with PyTorch's own ``_rebuild_tensor_v2`` and
tags its storage ``"mps"`` (torch/serialization.py, ``_mps_tag``); loading
such a file without ``map_location`` puts the tensor back on MPS, and with
``map_location="cpu"`` on the CPU. The emulation writes exactly that, so a
checkpoint saved under emulation loads on a real Mac, and one loaded under
emulation lands where it would on a Mac:

- saving: :func:`reduce` returns PyTorch's rebuild of the tensor's CPU data
  and marks the storage, which :func:`tag` (registered before the CPU's tagger)
  names ``"mps"``;
- loading: :func:`deserialize` takes ``"mps"`` storages (no map_location, or
  one that maps to mps) and marks them; PyTorch's ``_rebuild_tensor`` then
  builds a CPU tensor on them, which :func:`rebuild_tensor` wraps as emulated.

Outside the emulation a file it wrote behaves as a Mac's file on Linux:
``torch.load`` without ``map_location`` fails as PyTorch does there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from pytest_mps.emulate import tags

#: Set on storages of the emulated device (Python objects of UntypedStorage).
MARK = "_pytest_mps_emulated"
#: Before torch's own taggers (the CPU's is 10, MPS's 21).
PRIORITY = 5


def reduce(emulated: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """What ``Tensor.__reduce_ex__`` returns for a plain tensor, storage marked."""
    inner: torch.Tensor = emulated._inner
    storage = inner.untyped_storage()
    setattr(storage, MARK, True)
    typed = torch.storage.TypedStorage(  # type: ignore[no-untyped-call]
        wrap_storage=storage, dtype=inner.dtype, _internal=True
    )
    args: tuple[Any, ...] = (
        typed,
        inner.storage_offset(),
        tuple(inner.size()),
        inner.stride(),
        emulated.requires_grad,
        OrderedDict(),
    )
    metadata = torch._utils.get_tensor_metadata(inner)  # type: ignore[no-untyped-call]
    if metadata:
        args = (*args, metadata)
    rebuilt = (torch._utils._rebuild_tensor_v2, args)
    if getattr(emulated, "_is_param", False):
        # a Parameter pickles as _rebuild_parameter around its data
        return (
            torch._utils._rebuild_parameter,
            (_Rebuilt(rebuilt), emulated.requires_grad, OrderedDict()),
        )
    return rebuilt


class _Rebuilt:
    """Pickles as the rebuild it holds (a Parameter's data)."""

    def __init__(self, rebuilt: tuple[Callable[..., Any], tuple[Any, ...]]) -> None:
        self.rebuilt = rebuilt

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.rebuilt


def tag(storage: Any) -> str | None:
    """``"mps"`` for the storage of an emulated tensor."""
    if getattr(storage, MARK, False) or tags.storage_tagged(storage):
        return "mps"
    return None


def deserialize(storage: Any, location: str) -> Any:
    """Keep an ``"mps"`` storage in host memory, marked for :func:`rebuild_tensor`."""
    if not location.startswith("mps"):
        return None
    setattr(storage, MARK, True)
    return storage


class Patches:
    """Registers the tagger and the rebuild; :meth:`undo` puts torch back.

    ``wrap`` puts a loaded CPU tensor on the emulated device.
    """

    def __init__(self, wrap: Callable[[torch.Tensor], Any]) -> None:
        import torch.serialization as serialization

        self.entry = (PRIORITY, tag, deserialize)
        serialization.register_package(PRIORITY, tag, deserialize)
        self.rebuild = torch._utils._rebuild_tensor
        original = self.rebuild

        def rebuild_tensor(
            storage: Any, storage_offset: int, size: Any, stride: Any
        ) -> Any:
            host = original(storage, storage_offset, size, stride)  # type: ignore[no-untyped-call]
            if getattr(storage._untyped_storage, MARK, False):
                # float64 from a CPU file mapped to mps: TypeError, as on a Mac
                return wrap(host)
            return host

        torch._utils._rebuild_tensor = rebuild_tensor

    def undo(self) -> None:
        """Unregister the tagger and restore PyTorch's rebuild."""
        import torch.serialization as serialization

        registry = serialization._package_registry
        for entry in list(registry):
            if entry[1] is tag:
                registry.remove(entry)
        torch._utils._rebuild_tensor = self.rebuild
