"""What a device call the CPU refused becomes.

The function mode (:mod:`.tagged`) runs each device call on the CPU. Where the
CPU refuses one, a Mac may not have: :func:`after_error` computes it as the
Mac would (a dtype only the MPS kernel has, :mod:`.widen`), raises what a Mac
raises (a device-side assert as ``torch.AcceleratorError``; an op without a
CPU kernel in the Mac's words) or names it not emulated (an op whose only
kernel besides MPS's is missing here). And the placement texts of kernels
that speak for themselves (``dot``, ``isin``, the mm family's
``checkAllSameGPU``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pytest_mps.emulate import messages, policy, tags, widen

#: The calls whose MPS kernels check indices and values on the device (a
#: Mac raises torch.AcceleratorError when it next synchronizes), and the
#: CPU's texts for those checks. Indexing with integers and empty dimensions
#: is checked on the host, on a Mac too (IndexError).
DEVICE_ASSERT_CALLS = frozenset(
    {"gather", "scatter", "scatter_", "scatter_add", "scatter_add_"}
    | {"scatter_reduce", "scatter_reduce_", "index_put", "index_put_"}
    | {"one_hot", "embedding_bag", "bernoulli", "bernoulli_", "getitem"}
)
_DEVICE_ASSERT = re.compile(
    r"out of bounds|not in the valid range|Class values must be|"
    r"Expected p_in >= 0 && p_in <= 1"
)
# EmbeddingBag.cpp's CPU text, and the Metal kernel's for the same check
# (the words test_mps.py expects: "Index 2 is out of bounds: 6, range 0 to 4")
_EMBEDDING_BAG = re.compile(
    r"Index (\d+) of input takes value (-?\d+) which is not in the valid range "
    r"\[(-?\d+), (-?\d+)\)"
)


def device_assert(name: str, args: Sequence[Any], text: str) -> str | None:
    """The text of a device-side assert a Mac raises for this refusal, or None."""
    if name == "_assert_async":
        return None if "Boolean value" in text else text
    if name not in DEVICE_ASSERT_CALLS or not _DEVICE_ASSERT.search(text):
        return None
    if name == "getitem":
        index = args[1] if len(args) > 1 else None
        items = index if isinstance(index, tuple) else (index,)
        advanced = any(isinstance(i, (torch.Tensor, list)) for i in items)
        if not advanced or "with size 0" in text:
            return None
    if "p_in" in text:  # the Metal kernel's words (Distributions.mm)
        return "bernoulli expects p to be in [0, 1]"
    found = _EMBEDDING_BAG.search(text)
    if found is not None:
        index, value, low, high = found.groups()
        return f"Index {index} is out of bounds: {value}, range {low} to {high}"
    if "out of bounds" not in text:
        text = f"{text} (out of bounds)"
    return text


_ACCELERATOR_ERROR: type[RuntimeError] = getattr(
    torch, "AcceleratorError", RuntimeError
)
_NO_CPU_KERNEL = re.compile(
    r"Could not run '(aten::[\w.]+)' with arguments from the 'CPU' backend"
)


#: The CPU's normal kernel refusing a dtype, which MPS's refuses as a TypeError.
_NORMAL_DTYPE = re.compile(r'"normal_kernel_cpu" not implemented for \'(\w+)\'')


def mps_only(error: RuntimeError, rules: policy.Policy) -> Exception:
    """The error for a device call whose op has no CPU kernel.

    The dispatcher's text names the CPU, which a Mac would not: an op with an
    MPS kernel (``_convert_weight_to_int4pack``, MPS's own attention) is not
    emulated; one without runs nowhere here or on a Mac, in the Mac's words.
    """
    drawn = _NORMAL_DTYPE.search(str(error))
    if drawn is not None:
        # random_mps_impl (Distributions.mm) takes Half, Float and BFloat16
        return TypeError(f"Unsupported type {drawn.group(1)} for operation normal")
    found = _NO_CPU_KERNEL.search(str(error))
    if found is None:
        return error
    op = found.group(1)
    if rules.table.predict(op).outcome == "mps":
        return messages.not_emulated(
            f"{op}, which has an MPS kernel and no CPU kernel to compute it with"
        )
    return NotImplementedError(str(error).replace("'CPU' backend", "'MPS' backend"))


def after_error(
    func: Any,
    name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    error: RuntimeError | IndexError,
    rules: policy.Policy,
) -> Any:
    """A device call the CPU refused: computed as a Mac would, or an error.

    A dtype the CPU kernel lacks and the MPS kernel has is computed wider
    (:mod:`.widen`); a device-side assert raises ``torch.AcceleratorError``;
    an op with no CPU kernel is named not emulated.
    """
    __tracebackhide__ = True
    dtype = widen.narrow_dtype(error, func)
    if dtype is not None and not widen.fails_on_mps(func, dtype, rules.macos):
        return widen.computed_wider(func, args, kwargs, dtype)
    if not isinstance(error, NotImplementedError):
        asserted = device_assert(name, args, str(error))
        if asserted is not None:
            raise _ACCELERATOR_ERROR(
                f"{asserted} (a device-side assert on MPS, which a Mac raises "
                "as torch.AcceleratorError at the next synchronization; "
                "emulated: raised at once)"
            ) from None
    if isinstance(error, NotImplementedError) or (
        isinstance(error, RuntimeError) and _NORMAL_DTYPE.search(str(error))
    ):
        # torch 2.6's CPU raises RuntimeError where later ones NotImplementedError
        raise mps_only(error, rules) from None
    raise error


def own_placement(base: str, args: Sequence[Any]) -> str | None:
    """The text of a kernel that checks devices in its own words, or None."""
    own = messages.OWN_PLACEMENT.get(base)
    if own is None or len(args) < 2:
        return None
    devices = [
        policy.MPS if tags.tagged(a) else getattr(a, "device", policy.CPU)
        for a in args[:2]
    ]
    return own.format(*devices)


def argument_name(
    func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], value: torch.Tensor
) -> str:
    """The name the user gave ``value`` in the call (``weight`` of lerp)."""
    for name, given in kwargs.items():
        if given is value:
            return name
    names = ("self", "end", "weight")  # lerp(self, end, weight), its only case now
    for position, given in enumerate(args):
        if given is value:
            return names[position] if position < len(names) else f"#{position}"
    return "?"


def same_gpu_text(base: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The mm family's checkAllSameGPU text (:data:`.messages.SAME_GPU`)."""
    where, names = messages.SAME_GPU["mm" if base == "matmul" else base]
    labelled = []
    for position, name in enumerate(names):
        value = args[position] if position < len(args) else kwargs.get(name)
        host = (
            isinstance(value, torch.Tensor)
            and not tags.tagged(value)
            and value.device.type == "cpu"
        )
        labelled.append((f"argument #{position + 1} '{name}'", host))
    return messages.same_gpu(where, labelled)
