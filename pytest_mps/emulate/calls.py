"""The torch calls the user's code makes, seen before they reach the dispatcher.

One ``TorchFunctionMode`` for the whole emulated session (installed by
:mod:`.install`, as ``torch.set_default_device`` installs its own) does what
the dispatcher cannot on a Linux build:

- makes tensors on the emulated device: a factory given ``device="mps"``
  runs on the CPU and its result is wrapped (``torch.zeros``, ``torch.tensor``,
  ``new_ones``, ``torch.randn(..., generator=...)``); ``t.to("mps")`` copies,
  in autograd's graph;
- notes the outermost call (:class:`.policy.Call`), so a CPU tensor the user
  passed is told from one PyTorch made inside the call;
- applies the call rules the aten ops do not show (``F.linear`` of integers);
- takes ``p.data = t`` across the boundary, which PyTorch would turn into a
  shallow copy of a storage the emulated tensor does not have.

Calls made from inside another torch call's Python code (the mode is off
there, as for every ``TorchFunctionMode``) are not seen: a factory there given
``device="mps"`` fails as on a Linux build. Threads started while the
emulation is installed enter the mode too (:mod:`.install`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._device as _device
from torch.overrides import TorchFunctionMode

from pytest_mps.audit import rules as audit_rules
from pytest_mps.emulate import lazy, policy, tensor, wrapped_ops
from pytest_mps.emulate.generator import (
    EmulatedGenerator,
    default_generator,
    is_mps_device,
)
from pytest_mps.emulate.policy import CPU, MPS

#: torch/csrc/utils/tensor_new.cpp, new_tensor of a tensor (UserWarning).
_NEW_TENSOR_COPY = (
    "To copy construct from a tensor, it is recommended to use "
    "sourceTensor.detach().clone() or sourceTensor.detach().clone()."
    "requires_grad_(True), rather than tensor.new_tensor(sourceTensor)."
)
_ALIASING_FACTORIES = frozenset({torch.as_tensor, torch.asarray})
_RANDOM_FACTORIES = frozenset(
    {torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal}
)


def _device_arg(kwargs: Mapping[str, Any]) -> Any:
    return kwargs.get("device")


def _any_emulated(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """True when an emulated tensor is among the arguments, by position or name.

    ``nn.init.normal_`` hands its tensor over as ``tensor=``.
    """
    for value in (*args, *kwargs.values()):
        if type(value) is tensor.EmulatedTensor:
            return True
        if type(value) is list or type(value) is tuple:
            if any(type(v) is tensor.EmulatedTensor for v in value):
                return True
    return False


class EmulationMode(TorchFunctionMode):
    """Sees every torch call of the thread that entered it (see the module doc)."""

    def __init__(self, rules: policy.Policy) -> None:
        super().__init__()
        self.rules = rules
        self.call_rules: dict[Any, tuple[str, Callable[..., Any]]] = (
            audit_rules.call_rules()
        )
        self.special: dict[Any, Callable[..., Any]] = {
            torch.Tensor.to: self._to,
            torch.Tensor.data.__set__: self._set_data,  # type: ignore[attr-defined]
            torch.Tensor.cpu: self._cpu,
            torch.Tensor.tolist: self._tolist,
            torch.Tensor.numpy: self._numpy,
            torch.Tensor.__repr__: self._repr,
            torch.Tensor.new_tensor: self._new_tensor,
            torch.Tensor.type_as: self._type_as,
            torch.Tensor.type: self._type,
            torch.Tensor.backward: self._backward,
            torch.Tensor.untyped_storage: self._untyped_storage,
            torch.Tensor.data_ptr: self._data_ptr,
            torch._has_compatible_shallow_copy_type: self._compatible,
            torch.Tensor.device.__get__: self._device,
        }

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        __tracebackhide__ = True
        kwargs = kwargs or {}
        outer = policy.current_call() is None
        if outer:
            policy.set_current_call(policy.Call(func, args, kwargs))
        try:
            special = self.special.get(func)
            if special is not None:
                return special(args, kwargs)
            found = self.call_rules.get(func)
            if found is not None and _any_emulated(args, kwargs):
                verdict = found[1](args, kwargs)
                if verdict is not None:
                    self.rules.apply(verdict, found[0])
            device = kwargs.get("device")
            if device is None and _device.CURRENT_DEVICE is not None:
                # torch.set_default_device("mps") / `with torch.device("mps")`:
                # its mode sits below this one and would hand "mps" to C++
                if func in _device._device_constructors():
                    device = _device.CURRENT_DEVICE
                    kwargs = {**kwargs, "device": device}
            if device is not None and is_mps_device(device):
                return self._factory(func, args, kwargs)
            generator = kwargs.get("generator")
            if type(generator) is EmulatedGenerator and not _any_emulated(args, kwargs):
                self.rules.check_generator(generator, CPU)
            if device is not None and _any_emulated(args, kwargs):
                # zeros_like(t, device="cpu"): a copy on the host, asked for
                with wrapped_ops.host_copy():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)
        finally:
            if outer:
                policy.set_current_call(None)

    # -- calls taken over ---------------------------------------------------------

    def _factory(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """A call given ``device="mps"``: run it on the CPU, wrap what it makes."""
        __tracebackhide__ = True
        options = dict(kwargs)
        options["device"] = CPU
        generator = options.get("generator")
        if generator is not None:
            self.rules.check_generator(generator, MPS)
        elif func in _RANDOM_FACTORIES:
            options["generator"] = default_generator
        # torch.tensor((torch.cos(one), 0.0), device="mps"): C++ reads the
        # values of the device tensors in the data, which are in their _inner
        args = tuple(_host_data(a) for a in args)
        out = func(*args, **options)
        if not isinstance(out, torch.Tensor) or tensor.is_emulated(out):
            return out
        if func in _ALIASING_FACTORIES or _shares_storage(out, args):
            out = out.clone()
        if out.grad_fn is not None:
            return tensor.to_device(out)
        return tensor.wrap(out.detach(), requires_grad=out.requires_grad)

    def _untyped_storage(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """The storage holding the data (safetensors compares its pointers)."""
        __tracebackhide__ = True
        if tensor.is_emulated(args[0]):
            return args[0]._inner.untyped_storage()
        return torch.Tensor.untyped_storage(*args, **kwargs)

    def _data_ptr(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """The address of the first element of the data."""
        __tracebackhide__ = True
        if tensor.is_emulated(args[0]):
            return args[0]._inner.data_ptr()
        return torch.Tensor.data_ptr(*args, **kwargs)

    def _device(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``t.device``: mps for an uninitialized tensor moved to the device."""
        __tracebackhide__ = True
        if lazy.is_lazy(args[0]) and lazy.on_device(args[0]):
            return MPS
        return torch.Tensor.device.__get__(*args)

    def _compatible(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """False between the device and the host, as between MPS and the CPU.

        ``Module._apply`` asks before ``param.data = moved``; on a Mac a move
        between devices makes new parameters instead, and so it does here.
        """
        first, second = (*args, *kwargs.values())[:2]
        if tensor.is_emulated(first) != tensor.is_emulated(second):
            return False
        return torch._has_compatible_shallow_copy_type(first, second)

    def _to(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        return tensor.move(args[0], args[1:], kwargs)

    def _cpu(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        if tensor.is_emulated(args[0]):
            return tensor.to_host(args[0], None, kwargs.get("memory_format"))
        return torch.Tensor.cpu(*args, **kwargs)

    def _tolist(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        if tensor.is_emulated(args[0]):
            return tensor.to_host(args[0].detach(), None).tolist()
        return torch.Tensor.tolist(*args, **kwargs)

    def _numpy(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        if tensor.is_emulated(args[0]):
            return tensor.numpy(args[0], bool(kwargs.get("force", False)))
        return torch.Tensor.numpy(*args, **kwargs)

    def _repr(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        if tensor.is_emulated(args[0]):
            return wrapped_ops.describe(args[0])
        return torch.Tensor.__repr__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _new_tensor(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``t.new_tensor(data)``, on ``t``'s device as on a Mac.

        C++ builds it from ``t``'s options, which say CPU for the emulated tensor.
        """
        __tracebackhide__ = True
        base = args[0]
        if not tensor.is_emulated(base):
            return torch.Tensor.new_tensor(*args, **kwargs)
        data = args[1] if len(args) > 1 else kwargs["data"]
        dtype = kwargs.get("dtype") or base.dtype
        device = torch.device(kwargs.get("device") or base.device)
        requires_grad = bool(kwargs.get("requires_grad", False))
        if isinstance(data, torch.Tensor):
            warnings.warn(_NEW_TENSOR_COPY, UserWarning, stacklevel=3)
            source = data.detach()
            if not tensor.is_emulated(source):
                source = source.clone()
            out = tensor.move(
                source, (), {"device": device, "dtype": dtype, "copy": True}
            )
            return out.requires_grad_(requires_grad)
        options = {"dtype": dtype, "device": device, "requires_grad": requires_grad}
        if device.type == "mps":
            return self._factory(torch.tensor, (data,), options)
        return torch.tensor(data, **options)

    def _type_as(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``t.type_as(other)``: ``other``'s dtype and device.

        C++ goes by ``other.type()``, which names the CPU for the emulated tensor.
        """
        __tracebackhide__ = True
        base = args[0]
        other = args[1] if len(args) > 1 else kwargs["other"]
        if tensor.is_emulated(base) or tensor.is_emulated(other):
            return tensor.move(base, (), {"device": other.device, "dtype": other.dtype})
        return torch.Tensor.type_as(*args, **kwargs)

    def _type(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``t.type()``, as on a Mac.

        No argument: ``torch.mps.FloatTensor``; ``"torch.mps.HalfTensor"`` moves
        the tensor to the device.
        """
        __tracebackhide__ = True
        base = args[0]
        wanted = args[1] if len(args) > 1 else kwargs.get("dtype")
        if wanted is None:
            name: str = torch.Tensor.type(base)
            if tensor.is_emulated(base):
                return "torch.mps." + name.removeprefix("torch.")
            return name
        if isinstance(wanted, str) and wanted.startswith("torch.mps."):
            host_type = "torch." + wanted.removeprefix("torch.mps.")
            dtype = torch.empty(0).type(host_type).dtype
            return tensor.move(base, (), {"device": MPS, "dtype": dtype})
        if tensor.is_emulated(base):
            probe = torch.empty(0).type(wanted)
            return tensor.move(base, (), {"device": probe.device, "dtype": probe.dtype})
        return torch.Tensor.type(*args, **kwargs)

    def _backward(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``y.backward(gradient)``, with the engine's check of its device.

        validate_outputs (torch/csrc/autograd/engine.cpp) compares the gradient's
        device with ``y``'s: a 0-dim gradient is moved, any other raises.
        """
        __tracebackhide__ = True
        base = args[0]
        gradient = args[1] if len(args) > 1 else kwargs.get("gradient")
        if tensor.is_emulated(base) and isinstance(gradient, torch.Tensor):
            if not tensor.is_emulated(gradient):
                if gradient.dim() != 0:
                    raise RuntimeError(
                        f"invalid gradient at index 0 - expected device "
                        f"{base.device} but got {gradient.device}"
                    )
                moved = tensor.to_device(gradient)
                if len(args) > 1:
                    args = (base, moved, *args[2:])
                else:
                    kwargs = {**kwargs, "gradient": moved}
        return torch.Tensor.backward(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _set_data(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        target, value = args[0], args[1]
        if tensor.is_emulated(target) or tensor.is_emulated(value):
            tensor.replace_data(target, value)
            return None
        return torch.Tensor.data.__set__(target, value)  # type: ignore[attr-defined]


def _host_data(value: Any) -> Any:
    """``value`` with each emulated tensor in it (lists, tuples) as its data."""
    kind = type(value)
    if kind is tensor.EmulatedTensor:
        return value._inner.detach()
    if kind is list or kind is tuple:
        return kind(_host_data(item) for item in value)
    return value


def _shares_storage(out: torch.Tensor, args: Sequence[Any]) -> bool:
    """True when ``out`` aliases a host tensor among ``args`` (``as_tensor(t)``)."""
    if out.layout != torch.strided:
        return False
    pointer = out.untyped_storage().data_ptr()
    for value in args:
        if isinstance(value, torch.Tensor) and not tensor.is_emulated(value):
            if value.layout == torch.strided and (
                value.untyped_storage().data_ptr() == pointer
            ):
                return True
    return False
