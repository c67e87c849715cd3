"""Lazy parameters (``nn.LazyLinear``, torch_geometric's ``Linear(-1, ...)``).

On a real accelerator an ``UninitializedParameter`` moved with
``module.to(device)`` stays uninitialized, now on that device (PyTorch's
``Module._apply`` sets its ``.data``), and its first forward materializes it
there (measured with ``nn.LazyLinear(4).to("cuda")``, torch 2.11). The
emulated tensor is a class of its own and cannot also be an
``UninitializedParameter``, so an uninitialized tensor moved to the emulated
device stays what it is, marked as on the device: its ``device`` says mps,
``copy.deepcopy`` keeps the mark, and ``materialize`` makes an emulated tensor
and takes its place (``torch.utils.swap_tensors``), keeping the object the
module holds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]

from pytest_mps.emulate import patching
from pytest_mps.emulate.policy import MPS

#: The attribute that marks an uninitialized tensor as on the emulated device.
MARK = "_pytest_mps_on_device"


def is_lazy(value: object) -> bool:
    """True for an ``UninitializedParameter`` or ``UninitializedBuffer``."""
    return isinstance(value, UninitializedTensorMixin)


def on_device(value: Any) -> bool:
    """True for an uninitialized tensor moved to the emulated device."""
    return bool(value.__dict__.get(MARK, False))


def move(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """``value.to(device, dtype)`` for an uninitialized tensor."""
    out = value if dtype is None or dtype == value.dtype else value.to(dtype)
    for tensor in (value, out):
        if device.type == "mps":
            tensor.__dict__[MARK] = True
        else:
            tensor.__dict__.pop(MARK, None)
    if device.type not in ("mps", "cpu"):
        return torch.Tensor.to(out, device)
    return out


class Patches(patching.Patches):
    """``materialize`` and ``__deepcopy__`` of the uninitialized classes."""

    def __init__(self) -> None:
        super().__init__()
        original = UninitializedTensorMixin.materialize

        def materialize(
            self: Any, shape: Any, device: Any = None, dtype: Any = None
        ) -> None:
            if device is None and on_device(self):
                device = MPS
            if device is None or torch.device(device).type != "mps":
                original(self, shape, device, dtype)
                return
            made = torch.empty(shape, device=MPS, dtype=dtype or self.dtype)
            become = self.cls_to_become
            requires_grad = self.requires_grad
            self.__dict__.pop(MARK, None)
            if become is torch.nn.Parameter:
                made = torch.nn.Parameter(made, requires_grad)
            torch.utils.swap_tensors(self, made)  # type: ignore[no-untyped-call]

        self.patch(UninitializedTensorMixin, "materialize", materialize)
        for cls in (torch.nn.UninitializedParameter, torch.nn.UninitializedBuffer):
            self.patch(cls, "__deepcopy__", _deepcopy(cls.__deepcopy__))


def _deepcopy(original: Any) -> Any:
    def deepcopy(self: Any, memo: dict[int, Any]) -> Any:
        result = original(self, memo)
        if on_device(self):
            result.__dict__[MARK] = True
        return result

    return deepcopy
