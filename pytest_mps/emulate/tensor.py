"""The emulated MPS tensor: ``device`` is ``mps:0``, the numbers are the CPU's.

An :class:`EmulatedTensor` wraps a plain CPU tensor (``_inner``) that holds
its data. It is a ``__torch_dispatch__`` wrapper subclass whose C++ device is
the CPU, so autograd, optimizers and ``nn.Module`` see an ordinary dense
tensor and never ask for an MPS device guard (which a Linux build lacks: a
wrapper claiming the MPS device aborts the process in autograd's engine).
Python sees ``mps:0``: ``device``, ``is_mps``, ``is_cpu``, ``get_device()``,
printing, ``torch.save``.

Before each aten op, :mod:`.policy` says what a Mac would do (raise, warn,
run); the op then runs on the CPU tensors inside, so results equal the CPU's
bit for bit. Outputs are wrapped again; an output MPS cannot hold (float64)
raises PyTorch's TypeError.

Moving data between the host and the device keeps autograd's graph through
:class:`ToDevice` and :class:`ToHost`, so gradients come back on the device
they belong to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pytest_mps.audit import kernels
from pytest_mps.emulate import lazy, memory, messages, policy, wrapped_ops
from pytest_mps.emulate.generator import default_generator, is_mps_device
from pytest_mps.emulate.policy import CPU, MPS


class EmulatedTensor(torch.Tensor):
    """A tensor on the emulated MPS device; its data lives in ``_inner`` (CPU)."""

    _inner: torch.Tensor

    @staticmethod
    def __new__(cls, data: Any = None, requires_grad: bool = True) -> Any:
        """``type(param)(value, requires_grad=...)``: a ``Parameter`` of ``value``.

        On a Mac the type of a device parameter is ``Parameter``, and
        accelerate and transformers rebuild parameters by calling it; here
        the type is this class, so calling it does what ``Parameter`` does.
        The emulation itself makes its tensors with :meth:`of`.
        """
        return torch.nn.Parameter(data, requires_grad)

    @classmethod
    def of(cls, inner: torch.Tensor, requires_grad: bool = False) -> Any:
        """Wrap ``inner`` (a plain CPU tensor) without copying it."""
        __tracebackhide__ = True
        budget = memory.current[0]
        if budget is not None:
            budget.track(inner)  # MPS's out-of-memory error past the limit
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=CPU,
            requires_grad=requires_grad,
        )
        wrapper._inner = inner
        # the inner tensor, not the wrapper: nn.Module swaps wrappers
        # (torch.utils.swap_tensors), which refuses a tensor with a weakref
        wrapped_ops.live[id(inner)] = inner
        return wrapper

    # Functions reach the subclass through __torch_dispatch__ alone.
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    # -- what Python sees -----------------------------------------------------------

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        """``mps:0``."""
        return MPS

    @property
    def is_mps(self) -> bool:  # type: ignore[override]
        """True."""
        return True

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        """False."""
        return False

    def get_device(self) -> int:
        """0: the index of the one MPS device."""
        return 0

    @property
    def data(self) -> torch.Tensor:
        """A detached alias, on the device."""
        return self.detach()

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        replace_data(self, value)

    # These run through the torch-function modes when any is on (torch's C
    # method hands the call to them: the watch front sees t.cpu() and
    # t.tolist() as host reads, the emulation's own mode does the work), and
    # straight to the work otherwise: the C methods alone would take the
    # wrapper for a CPU tensor and read its missing storage.

    def numpy(self, *, force: bool = False) -> Any:
        """Raise as for any device tensor (``force=True`` copies, as PyTorch does)."""
        __tracebackhide__ = True
        if torch._C._is_torch_function_mode_enabled():
            return torch._C.TensorBase.numpy(self, force=force)
        return numpy(self, force)

    def tolist(self) -> Any:
        """The values, read back to the host."""
        __tracebackhide__ = True
        if torch._C._is_torch_function_mode_enabled():
            return torch._C.TensorBase.tolist(self)
        return to_host(self.detach(), None).tolist()

    def cpu(self, memory_format: torch.memory_format = torch.preserve_format) -> Any:
        """A copy on the host, in autograd's graph."""
        __tracebackhide__ = True
        if torch._C._is_torch_function_mode_enabled():
            return torch._C.TensorBase.cpu(self, memory_format=memory_format)
        return to_host(self, None, memory_format)

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """As ``Tensor.to``; ``to("cpu")`` copies to the host."""
        __tracebackhide__ = True
        if torch._C._is_torch_function_mode_enabled():
            return torch._C.TensorBase.to(self, *args, **kwargs)
        return move(self, args, kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        if torch._C._is_torch_function_mode_enabled():
            return str(torch.Tensor.__repr__(self))  # type: ignore[no-untyped-call]
        return wrapped_ops.describe(self)

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.detach().item().__format__(spec)
        return object.__format__(self, spec)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle as a Mac does: PyTorch's own rebuild, the storage tagged ``mps``."""
        from pytest_mps.emulate import serialization

        return serialization.reduce(self)

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        # Traceable: nn.Module._apply then swaps parameters in place (a
        # shallow copy into a plain tensor would lose the data).
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: Mapping[str, torch.Tensor], meta: Any, size: Any, stride: Any
    ) -> Any:
        return EmulatedTensor.of(inner["_inner"])

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        __tracebackhide__ = True
        return dispatch(func, args, kwargs or {})


def is_emulated(value: object) -> bool:
    """True for a tensor on the emulated device."""
    return type(value) is EmulatedTensor


def wrap(
    inner: torch.Tensor,
    requires_grad: bool = False,
    check: bool = True,
    allocates: bool = True,
) -> Any:
    """An emulated tensor holding ``inner``; TypeError as on MPS for its dtype.

    With ``check``, a tensor the device allocates (not a view) also refuses
    more dimensions than an MPS allocation takes.
    """
    __tracebackhide__ = True
    found = wrapped_ops.current[0]
    if found is not None and check:
        error = found.dtype_error(inner.dtype)
        if error is not None:
            raise error
        if allocates and inner.dim() > kernels.MAX_DIMS:
            raise RuntimeError(kernels.too_many_dims(inner.dim()))
    return EmulatedTensor.of(inner, requires_grad)


def _unwrap(value: Any, plain: list[torch.Tensor]) -> Any:
    kind = type(value)
    if kind is EmulatedTensor:
        inner = value._inner
        if inner.is_conj() or inner.is_neg():
            return wrapped_ops.resolved(inner)
        return inner
    if kind is list or kind is tuple:
        return kind(_unwrap(item, plain) for item in value)
    if isinstance(value, torch.Tensor):
        plain.append(value)
    return value


def dispatch(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Run one aten op for emulated tensors: check as MPS would, compute on the CPU."""
    __tracebackhide__ = True
    op = wrapped_ops.ops.get(id(func))
    if op is None:
        op = wrapped_ops.ops[id(func)] = wrapped_ops.Op(func)
    rules = wrapped_ops.current[0]
    plain: list[torch.Tensor] = []
    inner_args = [_unwrap(a, plain) for a in args]
    inner_kwargs = {k: _unwrap(v, plain) for k, v in kwargs.items()}
    to_host_out = False
    if "device" in inner_kwargs:
        device = inner_kwargs["device"]
        if is_mps_device(device):
            inner_kwargs["device"] = CPU
        elif device is not None and torch.device(device).type == "cpu":
            # PyTorch's C++ passes an emulated tensor's options along
            # (ToCopyBackward's grad.to(self.options())): its CPU device means
            # "where self is". Only a host copy the user asked for (t.cpu(),
            # zeros_like(t, device="cpu")) leaves the device.
            to_host_out = wrapped_ops.host_copies.depth > 0
    if rules is not None:
        if plain:
            rules.check_placement(func, args, kwargs, is_emulated)
        if op.generator or "generator" in inner_kwargs:
            generator = inner_kwargs.get("generator")
            if generator is None:
                inner_kwargs["generator"] = default_generator
            else:
                # The dispatcher hands over a new Python object for the same
                # C++ generator, of the base class: the user's call says
                # whose generator it is.
                call = policy.current_call()
                given = call.kwargs.get("generator") if call is not None else None
                rules.check_generator(given or generator, MPS)
        rules.check_op(func, args, kwargs)
    out = func(*inner_args, **inner_kwargs)
    if op.writes_first and args and type(args[0]) is EmulatedTensor:
        wrapped_ops.follow_metadata(args[0])
    if to_host_out:
        return out
    if op.returns_view and torch.is_inference_mode_enabled():
        # A view of a normal tensor made in inference mode is a normal
        # tensor sharing its base's version counter: the wrapper must be one
        # too, or autograd cannot set that counter on it.
        base = args[0] if args else None
        if type(base) is EmulatedTensor and not base.is_inference():
            with torch.inference_mode(False):
                return _wrap_outputs(out, args, allocates=False)
    return _wrap_outputs(out, args, allocates=not op.returns_view)


def _wrap_outputs(out: Any, args: Sequence[Any], allocates: bool = True) -> Any:
    # An op that returns one of its arguments (add_, copy_ into a CPU tensor)
    # returns that very object; anything new is on the device.
    __tracebackhide__ = True
    # With no torch call seen (TorchScript, whose x.device is the CPU and
    # whose code may pick float64 for it), the dtype is not judged.
    check = policy.current_call() is not None
    if type(out) is tuple or type(out) is list:
        return type(out)(_wrap_one(v, args, check, allocates) for v in out)
    return _wrap_one(out, args, check, allocates)


def _wrap_one(value: Any, args: Sequence[Any], check: bool, allocates: bool) -> Any:
    """``value`` as an op's output: an argument it returns as itself, else wrapped."""
    __tracebackhide__ = True
    if not isinstance(value, torch.Tensor):
        return value
    for arg in args:
        if type(arg) is EmulatedTensor:
            if arg._inner is value:
                return arg
        elif arg is value:
            return arg
    return wrap(value, check=check, allocates=allocates)


# -- moving data between host and device ------------------------------------------


class ToDevice(torch.autograd.Function):
    """Host to device, in autograd's graph: the gradient goes back to the host."""

    @staticmethod
    def forward(ctx: Any, host: torch.Tensor) -> Any:
        """A copy of ``host`` on the device."""
        __tracebackhide__ = True
        return wrap(host.detach().clone())

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        """The gradient, back on the host."""
        return grad.cpu() if is_emulated(grad) else grad


class ToHost(torch.autograd.Function):
    """Device to host, in autograd's graph: the gradient goes back to the device."""

    @staticmethod
    def forward(ctx: Any, device_tensor: Any, memory_format: Any) -> Any:
        """A copy of ``device_tensor``'s data on the host."""
        __tracebackhide__ = True
        return device_tensor._inner.clone(memory_format=memory_format)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        """The gradient, back on the device."""
        return (grad if is_emulated(grad) else to_device(grad)), None


def to_device(host: torch.Tensor) -> Any:
    """Copy a host tensor to the emulated device (``t.to("mps")``)."""
    __tracebackhide__ = True
    if is_emulated(host):
        return host
    if host.requires_grad and torch.is_grad_enabled():
        result = ToDevice.apply(host)  # type: ignore[no-untyped-call]
        return result
    found = wrapped_ops.current[0]
    if found is not None:
        error = found.dtype_error(host.dtype)
        if error is not None:
            raise error
    return wrap(host.detach().clone(memory_format=torch.preserve_format))


def to_host(
    tensor: Any, dtype: torch.dtype | None, memory_format: Any = None
) -> torch.Tensor:
    """Copy an emulated tensor to the host (``t.cpu()``), as the ``_to_copy`` op.

    Run through the dispatcher so the watchers see the read back; in
    autograd's graph when it needs the gradient.
    """
    __tracebackhide__ = True
    memory_format = memory_format or torch.preserve_format
    if tensor.requires_grad and torch.is_grad_enabled():
        result: torch.Tensor = ToHost.apply(tensor, memory_format)  # type: ignore[no-untyped-call]
        return result if dtype is None else result.to(dtype)
    with wrapped_ops.host_copy():
        host: torch.Tensor = torch.ops.aten._to_copy.default(
            tensor, dtype=dtype, device=CPU, memory_format=memory_format
        )
    return host


def move(tensor: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``Tensor.to(*args, **kwargs)`` for a tensor of either side."""
    __tracebackhide__ = True
    device, dtype, _non_blocking, memory_format = _parse_to(args, kwargs)
    copy = bool(kwargs.get("copy", False))
    if device is None:
        device = tensor.device
    if lazy.is_lazy(tensor):
        return lazy.move(tensor, device, dtype)
    if device.type == "mps":
        if not is_emulated(tensor):
            if dtype is not None and dtype != tensor.dtype:
                tensor = torch.Tensor.to(tensor, dtype)
            if memory_format is not None:
                tensor = tensor.contiguous(memory_format=memory_format)
            return to_device(tensor)
        options: dict[str, Any] = {"copy": copy}
        if dtype is not None:
            options["dtype"] = dtype
        if memory_format is not None:
            options["memory_format"] = memory_format
        return torch.Tensor.to(tensor, **options)
    if device.type == "cpu" and is_emulated(tensor):
        return to_host(tensor, dtype, memory_format)
    if is_emulated(tensor):
        # meta (a model emptied for loading), or a real device beside ours
        return torch.Tensor.to(tensor._inner, *args, **kwargs)
    return torch.Tensor.to(tensor, *args, **kwargs)


def numpy(tensor: Any, force: bool) -> Any:
    """``Tensor.numpy()``: PyTorch's TypeError for a device tensor, unless forced."""
    __tracebackhide__ = True
    if force:
        return to_host(tensor.detach(), None).numpy()
    raise TypeError(messages.TO_NUMPY)


def _parse_to(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[torch.device | None, torch.dtype | None, bool, Any]:
    """``Tensor.to``'s arguments; ``to(other)`` of a device tensor means mps."""
    first: Any = args[0] if args else kwargs.get("other")
    if is_emulated(first):
        return MPS, first.dtype, bool(kwargs.get("non_blocking", False)), None
    rest = {k: v for k, v in kwargs.items() if k != "copy"}
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **rest)
    return device, dtype, non_blocking, memory_format


def replace_data(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """``tensor.data = value`` across the emulated boundary.

    PyTorch shallow-copies ``value``'s storage into ``tensor``. Between two
    tensors on the device with one dtype, the wrapper takes ``value``'s data
    as its own and follows its shape (:func:`.wrapped_ops.follow_metadata`),
    keeping its identity whoever else holds it. Otherwise (a dtype change, a host
    tensor) the two Python objects swap contents, keeping ``tensor``'s
    identity, ``requires_grad`` and class role (a ``Parameter`` stays one).
    """
    replacement: Any = value.detach()
    if (
        is_emulated(tensor)
        and is_emulated(replacement)
        and replacement.dtype == tensor.dtype
        and replacement.layout == torch.strided
    ):
        tensor._inner = replacement._inner  # type: ignore[attr-defined]
        wrapped_ops.follow_metadata(tensor)
        return
    if is_emulated(replacement):
        replacement = EmulatedTensor.of(replacement._inner)  # its own wrapper
    else:
        replacement = replacement.clone()
    replacement.requires_grad_(tensor.requires_grad)
    if getattr(tensor, "_is_param", False) or isinstance(tensor, torch.nn.Parameter):
        replacement._is_param = True
    grad = tensor.grad
    tensor.grad = None
    torch.utils.swap_tensors(tensor, replacement)  # type: ignore[no-untyped-call]
    if grad is not None and grad.shape == tensor.shape:
        tensor.grad = grad
