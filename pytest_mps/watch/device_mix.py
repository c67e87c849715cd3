"""Does a call mix devices? The device-mix test shared by the guard and the front.

Imports nothing of pytest-mps, so the watch front (:mod:`.front`) and the
mixed-device guard (:mod:`.mixed_devices`) both build on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def exempt_ops() -> frozenset[Any]:
    """Ops that move data between devices on purpose."""
    import torch

    aten = torch.ops.aten
    ops = {
        aten._to_copy.default,
        aten.copy_.default,
        aten._copy_from.default,
        aten._copy_from_and_resize.default,
        aten.lift_fresh.default,
        aten.set_.source_Tensor,
    }
    # The fused attention backwards take the forward's philox seed and offset as
    # CPU tensors by design (native_functions.yaml: `Tensor philox_seed, Tensor
    # philox_offset`; attention_backward.cu reads them on the host). Not every
    # build has every one, so look them up by name.
    for name in (
        "_scaled_dot_product_efficient_attention_backward",
        "_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_flash_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    ):
        packet = getattr(aten, name, None)
        if packet is not None:
            ops.update(getattr(packet, o) for o in packet.overloads())
    return frozenset(ops)


def describe_tensors(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    import torch

    parts: list[str] = []
    seen: set[str] = set()
    values = [*args, *kwargs.values()]
    flat = [b for a in values for b in (a if isinstance(a, (list, tuple)) else [a])]
    for t in flat:
        if not isinstance(t, torch.Tensor):
            continue
        label = f"{device_of(t)}" + (" 0-dim" if t.dim() == 0 else f" {tuple(t.shape)}")
        if label not in seen:
            seen.add(label)
            parts.append(label)
    return ", ".join(parts)


#: Under ``--mps-emulate``: tells whether a CPU tensor is the host's on a Mac
#: too (one the user's call passed) or one PyTorch made inside the call from
#: an emulated tensor's options, which a Mac would have made on the device.
on_host: list[Callable[[Any], bool] | None] = [None]
#: Under ``--mps-emulate``'s tags design: True for a tensor on the emulated
#: device, whose C++ device is the CPU (its storage is tagged).
on_device: list[Callable[[Any], bool] | None] = [None]


#: Under ``--mps-emulate``'s tags design the emulation judges each device
#: call's placement itself, before it runs: it raises where a Mac raises, and
#: shows each call given a 0-dim host tensor, which a Mac reads as a scalar,
#: to this callback (the mixed-device guard's note) with the op's aten-style
#: name and the call's arguments. The guard then needs no per-op watch.
scalar_seen: list[Callable[[str, Sequence[Any], Mapping[str, Any]], None] | None] = [
    None
]
#: True while an emulation judges placements per call (:data:`scalar_seen`).
judged = [False]


def is_cpu(tensor: Any) -> bool:
    """``tensor.is_cpu``, as a Mac would answer it under the emulation."""
    if not tensor.is_cpu:
        return False
    tagged = on_device[0]
    return tagged is None or not tagged(tensor)


def device_of(tensor: Any) -> Any:
    """``tensor.device``, as a Mac would answer it under the emulation."""
    tagged = on_device[0]
    if tagged is not None and tagged(tensor):
        import torch

        return torch.device("mps", 0)
    return tensor.device


def mixes_devices(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """True when some tensor arguments are on the CPU and others are not.

    Looks at positional and keyword arguments and into lists and tuples of
    them (``torch.cat``, the foreach ops). Under ``--mps-emulate`` a CPU
    tensor that :data:`on_host` disowns counts for neither side.
    """
    import torch

    tensor = torch.Tensor
    host = on_host[0]
    cpu = other = False
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, tensor):
            if not is_cpu(a):
                other = True
            elif host is None or host(a):
                cpu = True
        elif type(a) is list or type(a) is tuple:
            for b in a:
                if isinstance(b, tensor):
                    if not is_cpu(b):
                        other = True
                    elif host is None or host(b):
                        cpu = True
    return cpu and other


#: What :func:`mix_kind` finds.
CLEAN, SCALAR, MIXED = 0, 1, 2

#: MPS kernels that take a 0-dim CPU tensor as a Metal buffer, not as a
#: scalar: on a Mac such a tensor is a crash or a wrong read, never a scalar.
#: Op packet name -> PyTorch's source that shows it.
BUFFER_KERNELS = {
    # native/mps/operations/Lerp.mm: older torches check every argument with
    # checkAllSameGPU ("Tensor for argument #4 'weight' is on CPU, but expected
    # it to be on GPU"); newer ones bind every input of a Metal kernel as a
    # buffer and crash in eager mode (nanochat PR #145 moved its optimizer's
    # 0-dim CPU lr and beta scalars to the device for exactly this).
    "lerp": "native/mps/operations/Lerp.mm (lerp_Tensor_mps)",
}


def buffer_kernel(func: Any) -> str | None:
    """The source line of :data:`BUFFER_KERNELS` for ``func`` (``lerp_`` too)."""
    name = func._schema.name.removeprefix("aten::")
    return BUFFER_KERNELS.get(name.removesuffix("_"))


@lru_cache(maxsize=1)
def host_positions() -> dict[Any, frozenset[int]]:
    """Ops whose arguments at these positions may stay on the host.

    Advanced indexing moves CPU index tensors to the indexed tensor's device
    (TensorAdvancedIndexing.cpp, ``make_info``), on MPS as everywhere;
    ``fill_`` reads a 0-dim CPU value on the host (``fill_tensor_``).
    """
    import torch

    aten = torch.ops.aten
    found: dict[Any, frozenset[int]] = {}
    for op in (
        aten.index.Tensor,
        aten.index_put.default,
        aten.index_put_.default,
        aten._index_put_impl_.default,
        aten.fill_.Tensor,
        aten.fill.Tensor,
    ):
        found[op] = frozenset({1})
    return found


_written: dict[Any, frozenset[int]] = {}


def written_positions(func: Any) -> frozenset[int]:
    """The positions of the arguments ``func`` writes to (``self`` of ``add_``)."""
    found = _written.get(func)
    if found is None:
        schema = getattr(func, "_schema", None)
        arguments = schema.arguments if schema is not None else ()
        found = _written[func] = frozenset(
            i
            for i, argument in enumerate(arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
        )
    return found


def mix_kind(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """How ``func``'s tensors mix the host and a device, as a Mac judges it.

    :data:`MIXED` when a CPU tensor that is not 0-dim sits beside device
    tensors (a Mac raises), or a 0-dim one reaches a kernel of
    :data:`BUFFER_KERNELS`; :data:`SCALAR` when the only CPU tensors are 0-dim
    inputs, which a Mac's kernels read as scalars (TensorIterator.cpp admits
    them); :data:`CLEAN` otherwise, and for the host positions of
    :func:`host_positions`.
    """
    import torch

    tensor = torch.Tensor
    host = on_host[0]
    skip = host_positions().get(func, frozenset())
    written = written_positions(func)
    scalars = full = other = False
    values = [*args, *kwargs.values()] if kwargs else list(args)
    for position, a in enumerate(values):
        if position in skip:
            continue
        output = position in written or (
            position >= len(args) and list(kwargs)[position - len(args)] == "out"
        )
        items = a if type(a) is list or type(a) is tuple else (a,)
        for b in items:
            if not isinstance(b, tensor):
                continue
            if not is_cpu(b):
                other = True
            elif host is None or host(b):
                # a CPU output is never a scalar: the result cannot land there
                if b.dim() == 0 and not output:
                    scalars = True
                else:
                    full = True
    if not other:
        return CLEAN
    if full:
        return MIXED
    if scalars:
        return MIXED if buffer_kernel(func) is not None else SCALAR
    return CLEAN
