"""DLPack of the emulated device: what a Mac's torch exports and imports.

On a Mac, an MPS tensor's ``__dlpack_device__()`` is ``(kDLMetal, 0)`` on a
torch whose ``Tensor.__dlpack_device__`` knows mps (2.8 onwards; older ones
raise ``ValueError: Unknown device type mps for Dlpack``, pytorch#153789),
and ``torch.from_dlpack`` of an MPS tensor or of its capsule is an MPS
tensor sharing its memory. A device tensor here is a CPU tensor, so its
capsule is the host's: the emulation answers the device itself
(:func:`device`), takes a request for a Metal capsule as one for the
tensor's own memory (:func:`export`), and tags what ``torch._C._from_dlpack``
builds on the memory of a device storage (:func:`importer`), which every
``from_dlpack`` of torch reaches, however early its caller imported it.
Foreign consumers (NumPy's ``from_dlpack``, which refuses a Metal capsule on
a Mac) still see a CPU capsule: docs/emulation.md, Conversions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.dlpack import DLDeviceType

from pytest_mps.emulate import tags


def _knows_mps() -> bool:
    """Whether the installed torch's ``__dlpack_device__`` has an mps branch."""
    try:
        source = inspect.getsource(torch.Tensor.__dlpack_device__)
    except (OSError, TypeError):  # no sources shipped: the release says
        release = tuple(int(part) for part in torch.__version__.split(".")[:2])
        return release >= (2, 8)
    return '"mps"' in source or "'mps'" in source


#: The installed torch gives mps tensors a DLPack device (kDLMetal).
METAL = _knows_mps()
UNKNOWN = "Unknown device type mps for Dlpack"


def device(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``t.__dlpack_device__()``: ``(kDLMetal, 0)`` for a device tensor."""
    __tracebackhide__ = True
    if not tags.tagged(args[0]):
        return func(*args, **kwargs)
    if not METAL:
        raise ValueError(UNKNOWN)
    return (DLDeviceType.kDLMetal, 0)


def export(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``t.__dlpack__(...)`` of a device tensor: a capsule of its memory.

    ``dl_device=(kDLMetal, 0)`` (``from_dlpack(t, device="mps")``) asks for
    the tensor's own memory, which is the host's here; another device
    (``from_dlpack(t, device="cpu")`` on torch 2.9) asks for a copy there,
    which torch makes on a Mac, so it is given one (``copy=False`` refuses).
    """
    __tracebackhide__ = True
    tensor = args[0]
    wanted = kwargs.get("dl_device")
    if wanted is None or not tags.tagged(tensor):
        return func(*args, **kwargs)
    if int(wanted[0]) != int(DLDeviceType.kDLMetal):
        if kwargs.get("copy") is False:
            raise BufferError(
                "cannot export an MPS tensor to DLPack device "
                f"{tuple(int(part) for part in wanted)} with copy=False"
            )
        args = (torch.Tensor.clone(tensor), *args[1:])
    return func(*args, **{**kwargs, "dl_device": None})


def _on_device_memory(tensor: torch.Tensor) -> bool:
    """True when ``tensor``'s data lies in a live device storage."""
    start = tensor.data_ptr()
    if start == 0:
        return False
    for storage in tags.storages():
        base = storage.data_ptr()
        if base <= start < base + storage.nbytes():
            return True
    return False


def importer(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch._C._from_dlpack``, tagging a tensor made on device memory."""

    def _from_dlpack(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if isinstance(out, torch.Tensor) and _on_device_memory(out):
            tags.tag(out)
        return out

    return _from_dlpack
