"""The cheap way into the watch mode: skip the aten ops of calls known to be clean.

A Python ``TorchDispatchMode`` costs about 10 us per aten op, which is most of
a host-bound GPU training step (768 aten ops in a nanoGPT step on an H100).
The host-sync and mixed-device guards only care about a few ops, and the
calls a training loop makes by the hundred (``F.linear``, ``x.view``,
``torch._foreach_mul_``, ``p.grad``) cannot sync when their tensors share a
device. So these guards watch through a ``TorchFunctionMode`` that sees each
torch API call once, before it decomposes into aten ops:

- a call in the clean table whose tensor arguments are all on the CPU or all
  off it runs straight through, unwatched;
- ``Tensor.backward`` and ``torch.autograd.backward``/``grad`` count as
  clean: the backward's aten ops mirror the forward's, which were watched
  call by call (so a sync inside a custom ``autograd.Function.backward`` is
  not seen: use ``--mps-watch-every-op`` for that);
- ``t.item()``, ``bool(t)``, ``t.tolist()`` of a CPU tensor are clean when
  no callback counts CPU tensors as device tensors (``watches_cpu``): the
  test runs on an accelerator, and torch.optim reads its CPU step counters
  this way once per parameter and step;
- the calls that read tensor data into Python without an aten op that says
  so on the CPU (``t.tolist()``, ``t.numpy()``, ``np.asarray(t)``,
  ``repr(t)``, ``f"{t}"``, iterating a 1-D tensor, ``t.cpu()``,
  ``t.to("cpu")``) are shown to the callbacks that look at host reads
  (``host_read``) before they run, on every device alike;
- every other call (``.item()``, ``.cpu()``, ``x[mask]``, ``nonzero``, any
  call not in the table, any call mixing devices) runs inside the watch mode,
  whose callbacks see its aten ops exactly as without the front.

A clean call must not sync on any device when its tensors share one (CPU or
not): no data-dependent output size, no reading values back, no copy between
host and device. The table lists calls by identity; unknown calls are watched.
``--mps-watch-every-op`` turns the front off (every aten op watched).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pytest_mps.watch.device_mix import is_cpu, mixes_devices

#: Kinds of clean calls.
PLAIN = 1  # clean when its tensors share a side (CPU or not)
INDEX = 2  # Tensor.__getitem__: clean for ints, slices, None and ... only
MOVE = 3  # Tensor.to / Tensor.cpu: clean unless it crosses host and device
READ = 4  # t.item(), bool(t): clean on a CPU tensor when no callback counts the CPU
HOST = 5  # t.tolist(), repr(t): a host read the CPU runs no telling aten op for
UNBIND = 6  # Tensor.unbind: clean, but a host read where Tensor.__iter__ calls it

_BASIC_INDEX = (int, slice, types.NoneType, types.EllipsisType)

_TENSOR_METHODS = """
add add_ sub sub_ mul mul_ div div_ true_divide neg neg_ pow pow_
__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__
__truediv__ __rtruediv__ __itruediv__ __div__ __rdiv__ __idiv__ __matmul__
__rmatmul__ __neg__ __pow__ __rpow__ __ipow__ __len__
exp exp_ log log_ sqrt sqrt_ rsqrt rsqrt_ tanh tanh_ sigmoid sigmoid_ relu relu_
abs abs_ clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ lerp lerp_
addcmul addcmul_ addcdiv addcdiv_ reciprocal reciprocal_ sin cos square
float half bfloat16 double type_as
sum mean var std norm amax amin max min argmax argmin softmax log_softmax cumsum
view view_as reshape reshape_as transpose transpose_ permute contiguous split
chunk unsqueeze squeeze flatten unflatten expand expand_as t narrow select
flip roll tril triu masked_fill masked_fill_ detach detach_ requires_grad_ clone
zero_ fill_ matmul mm bmm baddbmm addmm
size dim numel stride is_contiguous is_complex is_floating_point element_size
nelement data_ptr get_device storage_offset
new_zeros new_ones new_empty new_full
"""

_TORCH_FUNCTIONS = """
add mul sub div matmul mm bmm baddbmm addmm outer einsum cat concat stack
arange zeros ones empty full zeros_like ones_like empty_like full_like
rand randn randint rand_like randn_like randint_like tril triu
softmax log_softmax exp log sqrt rsqrt tanh sigmoid relu clamp lerp addcmul
addcdiv sum mean amax amin cumsum is_complex is_floating_point numel flatten
reshape transpose permute unsqueeze squeeze split chunk unbind narrow
layer_norm rms_norm group_norm batch_norm dropout embedding
_fused_adam_ _fused_adamw_ _fused_sgd_ _fused_adagrad_
"""

_FUNCTIONAL = """
linear layer_norm rms_norm group_norm batch_norm dropout dropout1d dropout2d
gelu silu relu relu6 leaky_relu elu selu mish tanh sigmoid hardtanh softplus
softmax log_softmax embedding scaled_dot_product_attention cross_entropy
nll_loss mse_loss l1_loss smooth_l1_loss binary_cross_entropy
binary_cross_entropy_with_logits conv1d conv2d conv3d conv_transpose2d
max_pool2d avg_pool2d adaptive_avg_pool2d normalize pad
"""


@lru_cache(maxsize=1)
def clean_calls() -> dict[Any, int]:
    """Torch API call -> its kind, for the calls the front lets through."""
    import torch
    from torch.nn import functional

    table: dict[Any, int] = {}

    def add(owner: Any, names: str, kind: int = PLAIN) -> None:
        for name in names.split():
            func = getattr(owner, name, None)
            if func is not None:
                table[func] = kind

    add(torch.Tensor, _TENSOR_METHODS)
    add(torch, _TORCH_FUNCTIONS)
    add(torch.linalg, "vector_norm matrix_norm")
    add(functional, _FUNCTIONAL)
    add(torch._C, "_set_grad_enabled")
    # the foreach ops: lists of tensors in, lists of tensors out, on one device
    for name in dir(torch):
        if name.startswith("_foreach_") and not name.startswith("_foreach_copy"):
            table[getattr(torch, name)] = PLAIN
    add(torch.Tensor, "__getitem__", INDEX)
    add(torch.Tensor, "to cpu", MOVE)
    # torch.optim reads its CPU step counters with .item() once per parameter
    add(torch.Tensor, "item __bool__ __float__ __int__ __index__", READ)
    # no aten op reads a CPU tensor's data for these: the call itself is the read
    add(torch.Tensor, "tolist numpy __array__ __repr__ __format__", HOST)
    # iterating runs Tensor.__iter__, which no mode sees, and then unbind(0)
    add(torch.Tensor, "unbind", UNBIND)
    add(torch.Tensor, "backward")
    add(torch.autograd, "backward grad")
    # property reads and writes: p.grad, x.shape, p.requires_grad = False
    for cls in (torch._C.TensorBase, torch.Tensor):
        for attr in vars(cls).values():
            if type(attr).__name__ == "getset_descriptor":
                table[attr.__get__] = PLAIN
                table[attr.__set__] = PLAIN
    return table


def _basic_index(index: Any) -> bool:
    if type(index) is tuple:
        return all(isinstance(i, _BASIC_INDEX) for i in index)
    return isinstance(index, _BASIC_INDEX)


def _stays(args: tuple[Any, ...], kwargs: Mapping[str, Any], func: Any) -> bool:
    """True when ``t.to(...)`` / ``t.cpu()`` does not cross host and device."""
    import torch

    source_cpu = is_cpu(args[0])
    if getattr(func, "__name__", "") == "cpu":
        return source_cpu
    for a in (*args[1:], *kwargs.values()):
        if isinstance(a, (str, torch.device)):
            if (str(a).partition(":")[0] == "cpu") != source_cpu:
                return False
        elif isinstance(a, int) and not isinstance(a, bool):
            return False  # t.to(0): a device index
    return True


def show_read(
    mode: Any,
    kind: int,
    func: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    caller: types.FrameType | None,
) -> None:
    """Tell ``mode``'s host-read callbacks about a call that may read data back.

    ``unbind`` is shown only when ``Tensor.__iter__`` calls it (``for x in t``),
    as ``Tensor.__iter__``.
    """
    __tracebackhide__ = True
    if kind == UNBIND:
        import torch

        iterate = torch.Tensor.__iter__
        if caller is None or caller.f_code is not iterate.__code__:
            return
        func = iterate
    for read in mode.readers:
        read(func, args, kwargs)


def _is_clean(
    kind: int, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> bool:
    if kind == INDEX and not _basic_index(args[1]):
        return False
    if kind == MOVE and not _stays(args, kwargs, func):
        return False
    one = len(args) < 2 and not kwargs
    if one and (not args or type(args[0]) not in (list, tuple)):
        return True  # one tensor cannot mix devices
    return not mixes_devices(args, kwargs)


@lru_cache(maxsize=1)
def front_class() -> type[Any]:
    """The ``TorchFunctionMode`` subclass, built on first use (torch is lazy)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from pytest_mps.watch.attribution import plugin_running

    table = clean_calls()
    is_compiling = torch.compiler.is_compiling
    getframe = sys._getframe
    enter = TorchDispatchMode.__enter__
    leave = TorchDispatchMode.__exit__
    no_kwargs: Mapping[str, Any] = types.MappingProxyType({})
    sequences = (list, tuple)

    class FrontMode(TorchFunctionMode):
        """Runs clean calls unwatched, every other call inside ``mode``."""

        def __init__(self, mode: Any) -> None:
            super().__init__()
            self.mode = mode

        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            __tracebackhide__ = True
            # Dynamo traces this: keep compiled graphs bare; and the plugin's
            # own work is never watched
            if is_compiling() or plugin_running[0]:
                return func(*args, **(kwargs or no_kwargs))
            kind = table.get(func)
            if kind == PLAIN and not kwargs:  # the common case, inlined
                if len(args) < 2 and (not args or type(args[0]) not in sequences):
                    return func(*args)
                if not mixes_devices(args, no_kwargs):
                    return func(*args)
            elif kind == READ:
                if not self.mode.watches_cpu and is_cpu(args[0]):
                    return func(*args, **(kwargs or no_kwargs))
            elif kind is not None:
                if kind >= HOST or kind == MOVE:
                    if self.mode.readers:
                        caller = getframe(1) if kind == UNBIND else None
                        show_read(
                            self.mode, kind, func, args, kwargs or no_kwargs, caller
                        )
                    if kind == UNBIND:
                        kind = PLAIN
                if kind == HOST:  # as READ: watched op by op unless no concern
                    if not self.mode.watches_cpu and is_cpu(args[0]):
                        return func(*args, **(kwargs or no_kwargs))
                elif _is_clean(kind, func, args, kwargs or no_kwargs):
                    return func(*args, **(kwargs or no_kwargs))
            mode = self.mode
            enter(mode)  # type: ignore[no-untyped-call]
            try:
                return func(*args, **(kwargs or no_kwargs))
            finally:
                leave(mode, None, None, None)  # type: ignore[no-untyped-call]

    return FrontMode


def front(mode: Any) -> Any:
    """A new (not yet entered) front for the watch mode ``mode``."""
    return front_class()(mode)


@lru_cache(maxsize=1)
def _reads_class() -> type[Any]:
    """A ``TorchFunctionMode`` that only shows host reads to ``mode``'s callbacks.

    For a mode watched op by op (no front): its dispatch mode sees every aten
    op, but the CPU runs none that tells ``t.tolist()`` is a read.
    """
    from torch.overrides import TorchFunctionMode

    from pytest_mps.watch.attribution import plugin_running

    table = clean_calls()
    no_kwargs: Mapping[str, Any] = types.MappingProxyType({})

    class ReadsMode(TorchFunctionMode):
        def __init__(self, mode: Any) -> None:
            super().__init__()
            self.mode = mode

        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            __tracebackhide__ = True
            kind = None if plugin_running[0] else table.get(func)
            if (kind == MOVE or (kind is not None and kind >= HOST)) and (
                self.mode.readers
            ):
                caller = sys._getframe(1) if kind == UNBIND else None
                show_read(self.mode, kind, func, args, kwargs or no_kwargs, caller)
            return func(*args, **(kwargs or no_kwargs))

    return ReadsMode


def reads_front(mode: Any) -> Any:
    """A new (not yet entered) mode showing host reads to ``mode``'s callbacks."""
    return _reads_class()(mode)
