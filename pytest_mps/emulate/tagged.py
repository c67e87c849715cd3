"""The tagged design's function mode: CPU tensors that act as MPS tensors.

A device tensor of this design is a plain CPU tensor whose storage carries a
tag (:mod:`.tags`); the kernels that run on it are the CPU's, so autograd,
views, in-place ops, ``.data``, storages and the lazy conj bit behave as
PyTorch's own. One ``TorchFunctionMode`` (:class:`TagMode`) sees each torch
call the user's code makes, once, however many aten ops it runs:

- a call given ``device="mps"`` (or under ``torch.set_default_device("mps")``)
  runs on the CPU and its tensors are tagged; ``t.to("mps")`` is a tagged
  copy, ``t.cpu()`` an untagged one, in autograd's graph (``Tensor.to``);
- a call with a device tensor among its arguments tags what it returns, and
  raises first where a Mac raises: a CPU tensor that is not 0-dim beside
  device tensors (PyTorch's text for the op's kernel family), a 0-dim one
  where the Metal kernel binds it as a buffer, a CPU generator, a call rule
  of the audit (``F.linear`` of integers); after it, a dtype MPS cannot hold
  (float64) raises PyTorch's TypeError;
- ``device``, ``is_mps``, ``is_cpu``, ``get_device()``, ``type()`` and
  printing answer mps for a tagged tensor; ``numpy()`` refuses it;
  ``.grad`` of a device parameter is tagged when read.

Ops with no MPS kernel, and kernels that refuse some arguments, are judged
per aten op by :mod:`.op_rules` while the mode runs a device call, in forward
and backward; a call the CPU refuses goes to :mod:`.refused`. Per torch call
this costs a dict lookup and a look at each tensor argument's storage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._device as _device
from torch.overrides import TorchFunctionMode

from pytest_mps.audit import kernels
from pytest_mps.audit import rules as audit_rules
from pytest_mps.emulate import (
    backward,
    computed,
    messages,
    op_rules,
    policy,
    refused,
    tags,
    unreproduced,
)
from pytest_mps.emulate.answers import (
    FROM_SELF,
    TensorAnswers,
    shares_host_storage,
    untagged,
)
from pytest_mps.emulate.generator import EmulatedGenerator, default_generator
from pytest_mps.emulate.policy import CPU, MPS
from pytest_mps.watch import device_mix
from pytest_mps.watch.device_mix import BUFFER_KERNELS

_OP_OVERLOAD = torch._ops.OpOverload
_current_node = torch._C._current_autograd_node

Tensor = torch.Tensor
MARK = tags.MARK
_RANDOM_FACTORIES = frozenset(
    {torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal}
)
_ALIASING_FACTORIES = frozenset({torch.as_tensor, torch.asarray})
#: Made from data through ``_to_copy``'s ``empty_strided_mps``, which does not
#: check the 16-dimension limit that ``empty_mps`` checks (EmptyTensor.cpp).
_FROM_DATA = _ALIASING_FACTORIES | {torch.tensor}
#: Calls that take host tensors beside device ones by design: copies and
#: moves, indexing with host indices (TensorAdvancedIndexing.cpp moves them,
#: ``make_info``), construction from data, metadata-only ``*_as``, and
#: arguments PyTorch requires on the host: the lengths of
#: ``pack_padded_sequence`` and the ``batch_sizes`` of packed RNN calls
#: (torch/nn/utils/rnn.py; aten/src/ATen/native/PackedSequence.cpp), the
#: lengths of ``ctc_loss`` (LossCTC.cpp takes IntArrayRef or host tensors).
CROSSING = frozenset(
    {
        "copy_",
        "to",
        "cpu",
        "setitem",
        "getitem",
        "index_put_",
        "index_put",
        "set_",
        "tensor",
        "as_tensor",
        "asarray",
        "new_tensor",
        "expand_as",
        "view_as",
        "reshape_as",
        "type_as",
        "is_same_size",
        "_pack_padded_sequence",
        "pack_padded_sequence",
        "_pad_packed_sequence",
        "lstm",
        "gru",
        "rnn_tanh",
        "rnn_relu",
        "ctc_loss",
        # tensor_indices_or_sections must be a CPU long tensor
        # (aten/src/ATen/native/TensorShape.cpp, tensor_split)
        "tensor_split",
        "_has_compatible_shallow_copy_type",
        "set",  # a property's setter: p.data = t (the storage carries the tag)
    }
)
#: Calls whose outputs at these positions stay on the host by design: the
#: batch sizes of a packed sequence must be a CPU tensor (PackedSequence
#: refuses others: "batch_sizes should always be on CPU").
HOST_OUTPUTS = {"_pack_padded_sequence": frozenset({1})}


class _Calls(threading.local):
    #: The host tensors among the arguments of the device call running now.
    hosts: list[Tensor] | None = None


_calls = _Calls()


def on_host(tensor: Tensor) -> bool:
    """True when a CPU tensor is the host's on a Mac too.

    Inside a device call, only the host tensors the user's code passed to it
    (or views of them); a CPU tensor PyTorch made inside the call from a
    device tensor's options would be on the device on a Mac. The watchers'
    view (``watch/device_mix.on_host``).
    """
    if tensor.device.type != "cpu":
        return False
    try:
        marks = tensor.untyped_storage().__dict__
    except (RuntimeError, NotImplementedError, ValueError):
        return True
    if MARK in marks:
        return False
    hosts = _calls.hosts
    if hosts is None:
        return True
    key = tensor.untyped_storage()._cdata
    for host in hosts:
        if host is tensor:
            return True
        try:
            if host.untyped_storage()._cdata == key:
                return True
        except (RuntimeError, NotImplementedError, ValueError):
            continue
    return False


def _is_mps(device: Any) -> bool:
    if type(device) is int:  # deviceFromLong: the accelerator, mps on a Mac
        return True
    if type(device) is str:
        return device.partition(":")[0].strip() == "mps"
    return isinstance(device, torch.device) and device.type == "mps"


def _op_name(func: Any) -> str:
    """The aten-style name of a torch call: ``__imul__`` is ``mul_``."""
    name = getattr(func, "__name__", "") or ""
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        name = name[2:-2]
        if name.startswith("i") and name[1:] in _INPLACE_DUNDERS:
            return name[1:] + "_"
        if name.startswith("r") and name[1:] in _INPLACE_DUNDERS:
            return name[1:]
    return name


_INPLACE_DUNDERS = frozenset(
    {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor"}
    | {"lshift", "rshift", "matmul", "div"}
)


class TagMode(TensorAnswers, TorchFunctionMode):
    """Sees every torch call of the thread that entered it (see the module doc)."""

    def __init__(self, rules: policy.Policy) -> None:
        super().__init__()
        self.rules = rules
        self.bad_dtypes = rules.bad_dtypes
        self.call_rules: dict[Any, tuple[str, Callable[..., Any]]] = (
            audit_rules.call_rules()
        )
        # where's kernel builds a TensorIterator too (TensorCompare.cpp)
        self.iterators = frozenset(
            name.partition(".")[0].removesuffix("_") for name in rules.table.iterators
        ) | {"where"}
        self.names: dict[Any, str] = {}
        self.special: dict[Any, Callable[..., Any]] = self._answers()

    # -- every call ---------------------------------------------------------------

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        __tracebackhide__ = True
        if kwargs is None:
            kwargs = {}
        special = self.special.get(func)
        if special is not None:
            return special(func, args, kwargs)
        device = kwargs.get("device")
        if device is None and _device.CURRENT_DEVICE is not None:
            # torch.set_default_device("mps"): its mode sits below this one
            if func in _device._device_constructors():
                device = _device.CURRENT_DEVICE
                kwargs = {**kwargs, "device": device}
        if device is not None and _is_mps(device):
            return self._factory(func, args, kwargs)
        on_device = False
        hosts: list[Tensor] = []
        for value in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(value, Tensor):
                try:
                    marks = value.untyped_storage().__dict__
                except (RuntimeError, NotImplementedError, ValueError):
                    continue
                if MARK in marks:
                    on_device = True
                else:
                    hosts.append(value)
            elif type(value) is list or type(value) is tuple:
                for item in value:
                    if isinstance(item, Tensor):
                        try:
                            marks = item.untyped_storage().__dict__
                        except (RuntimeError, NotImplementedError, ValueError):
                            continue
                        if MARK in marks:
                            on_device = True
                        else:
                            hosts.append(item)
        generator = kwargs.get("generator")
        if types and not all(issubclass(kind, Tensor) for kind in types):
            return self._tensor_like(func, types, args, kwargs)
        if not on_device:
            if type(generator) is EmulatedGenerator:
                self.rules.check_generator(generator, CPU)
            return func(*args, **kwargs)
        if device is not None:
            # zeros_like(t, device="cpu"), as_tensor(t, device="cpu"): made on
            # the host, as asked; PyTorch copies what would alias the device
            return untagged(func(*args, **kwargs))
        name = self.names.get(func)
        if name is None:
            name = self.names[func] = _op_name(func)
        if name in FROM_SELF and args and not tags.tagged(args[0]):
            # host.new_tensor(device_data): new_* take the device of self
            return untagged(func(*args, **kwargs))
        if name in unreproduced.NOTED:
            unreproduced.note(name, args, kwargs)
        found = self.call_rules.get(func)
        if found is not None:
            # F.linear's own placement and dtype texts come first; the rule
            # reads .device, which only the mode answers with mps
            with self:
                verdict = found[1](args, kwargs)
            if verdict is not None:
                self.rules.apply(verdict, found[0])
        if hosts and type(func) is _OP_OVERLOAD and _current_node() is not None:
            hosts = backward.engine_gradients(hosts)
        if hosts:
            self._check_hosts(func, name, args, kwargs, hosts)
        if generator is not None and type(generator) is not EmulatedGenerator:
            self.rules.check_generator(generator, MPS)
        depth = op_rules._depth
        depth.value += 1
        outer = _calls.hosts
        _calls.hosts = hosts
        outer_call = depth.call
        if outer_call is None:
            depth.call = (func, args, kwargs)
        try:
            compute = computed.OWN.get(name)
            if compute is None:
                out = func(*args, **kwargs)
            else:
                out = compute(func, args, kwargs)
        except (RuntimeError, IndexError) as error:  # NotImplementedError too
            out = self._after_error(func, args, kwargs, error)
        finally:
            depth.value -= 1
            _calls.hosts = outer
            depth.call = outer_call
        if type(out) is Tensor:  # the common case, inline
            message = self.bad_dtypes.get(out.dtype)
            if message is not None:
                raise TypeError(message)
            try:
                marks = out.untyped_storage().__dict__
            except (RuntimeError, NotImplementedError, ValueError):
                return out  # a functorch wrapper or sparse: no storage of its own
            if MARK not in marks and (not hosts or all(out is not h for h in hosts)):
                if out.dim() > kernels.MAX_DIMS:  # a new allocation on the device
                    raise RuntimeError(kernels.too_many_dims(out.dim()))
                tags.tag(out)
            return out
        self._check_dtype(out)
        tags.tag_outputs(out, hosts, HOST_OUTPUTS.get(name, frozenset()))
        return out

    def _after_error(
        self,
        func: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        error: RuntimeError | IndexError,
    ) -> Any:
        """A device call the CPU refused (:func:`.refused.after_error`)."""
        __tracebackhide__ = True
        return refused.after_error(
            func, _op_name(func), args, kwargs, error, self.rules
        )

    # -- checks ---------------------------------------------------------------------

    def _check_hosts(
        self,
        func: Any,
        name: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        hosts: list[Tensor],
    ) -> None:
        """Raise as a Mac does for host tensors beside device ones."""
        __tracebackhide__ = True
        if name in CROSSING:
            return
        cpu = [h for h in hosts if h.device.type == "cpu"]
        scalars = [h for h in cpu if h.dim() == 0]
        base = name.removesuffix("_")
        if scalars and base in BUFFER_KERNELS:
            argument = refused.argument_name(func, args, kwargs, scalars[0])
            raise RuntimeError(
                messages.BUFFER_SCALAR.format(
                    # the overload of a tensor weight
                    op=f"aten::{name}.Tensor",
                    argument=argument,
                    source=BUFFER_KERNELS[base],
                )
            )
        others = [h for h in hosts if h.dim() != 0 or h.device.type != "cpu"]
        if not others:
            # 0-dim host tensors: scalars to PyTorch's device check; fill_
            # reads its value on the host by design (fill_tensor_)
            note = device_mix.scalar_seen[0]
            if note is not None and scalars and base != "fill":
                note(name, args, kwargs)
            return
        if base == "gradient":
            # pre_check_gradient (ReduceOps.cpp) compares devices before any kernel
            raise RuntimeError(messages.GRADIENT.format(MPS, others[0].device))
        own = refused.own_placement(base, args)
        if own is not None:
            raise RuntimeError(own)
        if base in ("mm", "addmm", "matmul"):
            raise RuntimeError(refused.same_gpu_text(base, args, kwargs))
        if base in self.iterators:
            # a TensorIterator lists its outputs first: a host tensor written
            # in place (exp_avg.lerp_(grad, w) with CPU state) comes first
            written = kwargs.get("out")
            if written is None and name.endswith("_") and args:
                written = args[0]
            if any(written is h for h in others):
                first, second = others[0].device, MPS
            else:
                first, second = MPS, others[0].device
            raise RuntimeError(messages.TWO_DEVICES.format(first=first, second=second))
        raise RuntimeError(messages.PLACEHOLDER)

    # -- calls taken over -----------------------------------------------------------

    def _factory(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """A call given ``device="mps"``: run it on the CPU, tag what it makes."""
        __tracebackhide__ = True
        options = dict(kwargs)
        options["device"] = CPU
        self._check_new_dtype(options.get("dtype"))
        generator = options.get("generator")
        if generator is not None:
            self.rules.check_generator(generator, MPS)
        elif func in _RANDOM_FACTORIES:
            options["generator"] = default_generator
        unreproduced.note_draw(_op_name(func), options.get("dtype"))
        depth = op_rules._depth
        outer_call = depth.call
        if outer_call is None:  # the kernel rules ask which call this is
            depth.call = (func, args, options)
        with op_rules.INSIDE:
            try:
                out = func(*args, **options)
            except RuntimeError as error:  # NotImplementedError too
                raise refused.mps_only(error, self.rules) from None
            finally:
                depth.call = outer_call
        if not isinstance(out, Tensor):
            return out
        if not tags.tagged(out) and (
            func in _ALIASING_FACTORIES or shares_host_storage(out, args)
        ):
            out = out.clone()
        self._check_dtype(out)
        if out.dim() > kernels.MAX_DIMS and func not in _FROM_DATA:
            raise RuntimeError(kernels.too_many_dims(out.dim()))
        tags.tag(out)
        return out
