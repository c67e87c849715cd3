"""What a tagged tensor's properties and methods answer under the tags design.

:class:`TensorAnswers` holds :class:`~.tagged.TagMode`'s answers to the calls
it takes over by identity (its ``special`` table): ``.device`` and
``torch.device(0)`` say mps, ``.to``/``.cpu`` move between the device and the
host, ``.numpy()`` of a device tensor raises as on a Mac, ``.grad`` and
``backward`` keep gradients on the device, and the dtype checks a Mac's
allocator makes. TagMode takes them as a base class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pytest_mps.emulate import backward, dlpack, lazy, messages, op_rules, tags
from pytest_mps.emulate.policy import CPU, MPS

Tensor = torch.Tensor


def accelerator_index(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """``to``'s arguments with an integer device read as ``mps:<index>``.

    On a Mac ``t.to(0)`` and ``module.to(0)`` mean mps:0: c10's
    ``deviceFromLong`` takes the current accelerator, which a Linux CPU build
    lacks ("Cannot access accelerator device when none is available").
    """
    if args and type(args[0]) is int:  # a bool is no index
        args = (torch.device("mps", args[0]), *args[1:])
    device = kwargs.get("device")
    if type(device) is int:
        kwargs = {**kwargs, "device": torch.device("mps", device)}
    return args, kwargs


#: Calls whose output takes the device of ``self`` (the first argument),
#: whatever the device of their data (``new_tensor``'s, TensorFactories.cpp).
FROM_SELF = frozenset(
    {
        "new_tensor",
        "new_zeros",
        "new_ones",
        "new_empty",
        "new_full",
        "new_empty_strided",
    }
)


def untagged(out: Any) -> Any:
    """``out``, copied off the device where it is a device tensor."""
    if type(out) is Tensor and tags.tagged(out):
        return Tensor.clone(out)
    return out


def shares_host_storage(out: Tensor, args: Sequence[Any]) -> bool:
    """True when ``out`` aliases a host tensor among ``args`` (``as_tensor(t)``)."""
    if out.layout != torch.strided:
        return False
    key = out.untyped_storage()._cdata
    for value in args:
        if isinstance(value, Tensor) and value.layout == torch.strided:
            if value.untyped_storage()._cdata == key:
                return True
    return False


class TensorAnswers:
    """The answers of :class:`~.tagged.TagMode` for tagged tensors (a base class)."""

    #: dtype -> PyTorch's refusal on the emulated Mac (``Policy.bad_dtypes``).
    bad_dtypes: dict[torch.dtype, str]

    def _answers(self) -> dict[Any, Callable[..., Any]]:
        """The calls these answers take over, by identity: the mode's table."""
        return {
            _property(Tensor, "device").__get__: self._device,
            _property(Tensor, "is_mps").__get__: self._is_mps_get,
            _property(Tensor, "is_cpu").__get__: self._is_cpu,
            Tensor.get_device: self._get_device,
            Tensor.type: self._type,
            Tensor.to: self._to,
            Tensor.cpu: self._cpu,
            Tensor.numpy: self._numpy,
            Tensor.__array__: self._array,
            Tensor.__repr__: self._repr,
            Tensor.__format__: self._format,
            Tensor.type_as: self._type_as,
            _property(Tensor, "grad").__get__: self._grad_get,
            _property(Tensor, "grad").__set__: self._grad_set,
            Tensor.backward: self._backward,
            torch.autograd.backward: self._autograd,
            torch.autograd.grad: self._autograd,
            Tensor.register_hook: self._register_hook,
            torch._C._nn._parse_to: self._parse_to,
            torch.device: self._device_of,
            # a move between the device and the host keeps the parameter
            # objects (param.data = moved), as dense tensors of any two
            # devices are compatible on a Mac too
            torch._has_compatible_shallow_copy_type: self._pass,
            Tensor.__dlpack_device__: dlpack.device,
            Tensor.__dlpack__: dlpack.export,
        }

    def _check_dtype(self, out: Any) -> None:
        __tracebackhide__ = True
        if isinstance(out, Tensor):
            message = self.bad_dtypes.get(out.dtype)
            if message is not None:
                raise TypeError(message)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, Tensor):
                    message = self.bad_dtypes.get(item.dtype)
                    if message is not None:
                        raise TypeError(message)

    def _check_new_dtype(self, dtype: torch.dtype | None) -> None:
        __tracebackhide__ = True
        if dtype is not None:
            message = self.bad_dtypes.get(dtype)
            if message is not None:
                raise TypeError(message)

    def _pass(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return func(*args, **kwargs)

    def _parse_to(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """``_parse_to(0)`` (``Module.to(0)``): an integer is the accelerator."""
        args, kwargs = accelerator_index(args, kwargs)
        return func(*args, **kwargs)

    def _device(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        value = args[0]
        if lazy.is_lazy(value):
            return MPS if lazy.on_device(value) else func(*args, **kwargs)
        if tags.tagged(value):
            return MPS
        return func(*args, **kwargs)

    def _device_of(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        # torch.device(0) names the current accelerator: mps:0 on a Mac (a
        # Linux CPU build has none and raises); accelerate's device_map={"": 0}
        if len(args) == 1 and not kwargs and type(args[0]) is int:
            return func("mps", args[0])
        return func(*args, **kwargs)

    def _is_mps_get(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        return tags.tagged(args[0]) or func(*args, **kwargs)

    def _is_cpu(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return not tags.tagged(args[0]) and func(*args, **kwargs)

    def _get_device(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        return 0 if tags.tagged(args[0]) else func(*args, **kwargs)

    def _type(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``t.type()``: ``torch.mps.FloatTensor`` for a device tensor."""
        __tracebackhide__ = True
        base = args[0]
        wanted = args[1] if len(args) > 1 else kwargs.get("dtype")
        if wanted is None:
            name: str = func(base)
            if tags.tagged(base):
                return "torch.mps." + name.removeprefix("torch.")
            return name
        if isinstance(wanted, str) and wanted.startswith("torch.mps."):
            host_type = "torch." + wanted.removeprefix("torch.mps.")
            dtype = torch.empty(0).type(host_type).dtype
            return self._to(Tensor.to, (base, MPS, dtype), {})
        if tags.tagged(base) and _host_type_name(wanted):
            # "torch.FloatTensor" names a CPU type: a Mac copies to the host
            dtype = torch.empty(0).type(wanted).dtype
            return self._to(Tensor.to, (base, "cpu", dtype), {})
        out = func(*args, **kwargs)
        if tags.tagged(base) and out.device.type == "cpu" and out is not base:
            # t.type(torch.float16) stays on the device
            self._check_dtype(out)
            tags.tag(out)
        return out

    def _to(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``Tensor.to`` in every form, the device read from the tags."""
        __tracebackhide__ = True
        source: Tensor = args[0]
        copy = bool(kwargs.get("copy", False))
        rest = {k: v for k, v in kwargs.items() if k != "copy"}
        first = args[1] if len(args) > 1 else rest.get("other")
        if isinstance(first, Tensor):
            device: torch.device | None = MPS if tags.tagged(first) else first.device
            dtype: torch.dtype | None = first.dtype
            non_blocking = bool(rest.get("non_blocking", False))
            memory_format = None
        else:
            parsed, options = accelerator_index(args[1:], rest)
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(
                *parsed, **options
            )
        if lazy.is_lazy(source):
            return lazy.move(source, device or source.device, dtype)
        on_device = tags.tagged(source)
        to_device = device.type == "mps" if device is not None else on_device
        if to_device:
            self._check_new_dtype(dtype if dtype is not None else source.dtype)
            host = source
            if source.device.type != "cpu":
                host = source.to("cpu")  # meta raises PyTorch's own error
            out = Tensor.to(
                host,
                dtype=dtype,
                non_blocking=non_blocking,
                copy=copy or not on_device,
                memory_format=memory_format or torch.preserve_format,
            )
            tags.tag(out)
            return out
        if on_device and device is not None and device.type == "cpu":
            return Tensor.to(
                source,
                device=CPU,
                dtype=dtype,
                non_blocking=non_blocking,
                copy=True,
                memory_format=memory_format or torch.preserve_format,
            )
        return func(*args, **kwargs)

    def _cpu(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        if tags.tagged(args[0]):
            return Tensor.to(
                args[0],
                device=CPU,
                copy=True,
                memory_format=kwargs.get("memory_format") or torch.preserve_format,
            )
        return func(*args, **kwargs)

    def _numpy(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        if tags.tagged(args[0]):
            if not kwargs.get("force", False):
                raise TypeError(messages.TO_NUMPY)
            return Tensor.numpy(args[0].detach().clone())
        return func(*args, **kwargs)

    def _array(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        __tracebackhide__ = True
        if tags.tagged(args[0]):
            raise TypeError(messages.TO_NUMPY)
        return func(*args, **kwargs)

    def _tensor_like(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> Any:
        """A call on a ``__torch_function__`` class that is not a tensor.

        Torch calls the mode first; run as torch would next, the class's own
        ``__torch_function__``, with the mode pushed again, so that what it
        computes on the tensors it holds (kornia's ``TensorWrapper``) meets
        the mode: their results are on the device of those tensors.
        """
        __tracebackhide__ = True
        for kind in types:
            if not issubclass(kind, Tensor):
                handler = kind.__torch_function__
                mode: Any = self
                with mode:
                    result = handler(func, types, args, kwargs)
                if result is not NotImplemented:
                    return result
        return func(*args, **kwargs)

    def _type_as(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """``t.type_as(other)``: ``t.type(other.type())``, which names the device."""
        __tracebackhide__ = True
        other = args[1] if len(args) > 1 else kwargs["other"]
        return self._to(Tensor.to, (args[0], other), {})

    def _format(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``f"{t}"`` prints as ``repr``, for a tensor of more than 0 dims."""
        if tags.tagged(args[0]) and args[0].dim() != 0:
            return self._repr(Tensor.__repr__, args[:1], {})
        return func(*args, **kwargs)

    def _repr(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Printed as PyTorch prints an MPS tensor (``device='mps:0'``)."""
        if tags.tagged(args[0]):
            # with the mode pushed again, _str reads the device as mps
            mode: Any = self  # a TagMode, which this class is a base of
            with mode:
                text: str = torch._tensor_str._str(args[0], **kwargs)  # type: ignore[no-untyped-call]
            return text
        return func(*args, **kwargs)

    def _grad_get(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """``p.grad``: autograd made it on the CPU; it is on the device of ``p``."""
        grad = func(*args, **kwargs)
        if grad is not None and tags.tagged(args[0]):
            tags.tag(grad)
        return grad

    def _grad_set(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        __tracebackhide__ = True
        target, value = args[0], args[1]
        if isinstance(value, Tensor) and tags.tagged(target) != tags.tagged(value):
            found = "mps" if tags.tagged(value) else value.device.type
            wanted = "mps" if tags.tagged(target) else target.device.type
            raise RuntimeError(
                f"attempting to assign a gradient with device type '{found}' to a "
                f"tensor with device type '{wanted}'. Please ensure that the "
                "gradient and the tensor are on the same device"
            )
        return func(*args, **kwargs)

    def _backward(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """``y.backward(gradient)``: the engine's device check, rules in backward."""
        __tracebackhide__ = True
        base = args[0]
        if not tags.tagged(base):
            return func(*args, **kwargs)
        gradient = args[1] if len(args) > 1 else kwargs.get("gradient")
        if isinstance(gradient, Tensor) and not tags.tagged(gradient):
            if gradient.dim() != 0:
                raise RuntimeError(
                    f"invalid gradient at index 0 - expected device {MPS} but got "
                    f"{gradient.device}"
                )
        with op_rules.INSIDE, backward.ON_DEVICE:
            return func(*args, **kwargs)

    def _autograd(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """``torch.autograd.backward``/``grad`` from device tensors: as on a Mac.

        The rules hold in backward, Python run by autograd sees the device,
        and each gradient ``grad`` returns is on its input's device. A
        backward of host tensors alone (a float64 ``gradcheck``) is the CPU's.
        """
        __tracebackhide__ = True
        roots = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
        if not any(tags.tagged(r) for r in _as_tuple(roots)):
            return func(*args, **kwargs)
        with op_rules.INSIDE, backward.ON_DEVICE:
            out = func(*args, **kwargs)
        if func is torch.autograd.grad:
            inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
            for grad, given in zip(_as_tuple(out), _as_tuple(inputs), strict=False):
                if isinstance(grad, Tensor) and tags.tagged(given):
                    tags.tag(grad)
        return out

    def _register_hook(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """``t.register_hook(hook)``: a device tensor's gradient is on the device."""
        if tags.tagged(args[0]) and len(args) > 1:
            return func(args[0], backward.tensor_hook(args[1]), *args[2:], **kwargs)
        return func(*args, **kwargs)


def _as_tuple(value: Any) -> tuple[Any, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


def _host_type_name(wanted: Any) -> bool:
    """Whether ``wanted`` is a legacy CPU tensor type: ``"torch.FloatTensor"``.

    (A ``torch.cuda.`` name raises as on a Mac, in torch's own words.)
    """
    if isinstance(wanted, type) and not issubclass(wanted, Tensor):
        wanted = f"{wanted.__module__}.{wanted.__name__}"  # torch.FloatTensor
    return (
        isinstance(wanted, str)
        and wanted.removeprefix("torch.").endswith("Tensor")
        and "." not in wanted.removeprefix("torch.")
    )


def _property(owner: type, name: str) -> Any:
    """The descriptor ``owner.name`` (its getter and setter reach the mode)."""
    for klass in owner.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(name)
