"""Does a call mix devices? The device-mix test shared by the guard and the front.

Imports nothing of pytest-mps, so the watch front (:mod:`.front`) and the
mixed-device guard (:mod:`.mixed_devices`) both build on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
        label = f"{t.device}" + (" 0-dim" if t.dim() == 0 else f" {tuple(t.shape)}")
        if label not in seen:
            seen.add(label)
            parts.append(label)
    return ", ".join(parts)


#: Under ``--mps-emulate``: tells whether a CPU tensor is the host's on a Mac
#: too (one the user's call passed) or one PyTorch made inside the call from
#: an emulated tensor's options, which a Mac would have made on the device.
on_host: list[Callable[[Any], bool] | None] = [None]


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
            if not a.is_cpu:
                other = True
            elif host is None or host(a):
                cpu = True
        elif type(a) is list or type(a) is tuple:
            for b in a:
                if isinstance(b, tensor):
                    if not b.is_cpu:
                        other = True
                    elif host is None or host(b):
                        cpu = True
    return cpu and other
