"""The CPU op that computes what a device's own kernel computes, to replay it.

The localizer (:mod:`.localize`) replays each device op on the CPU. Some
device ops have no CPU kernel: cuDNN's batch norm, MPS's attention. Each
entry here turns such a call into the CPU op that computes the same from the
same arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _batch_norm(args: Any, kwargs: Any) -> tuple[Any, Any, Any, int]:
    import torch

    return torch.ops.aten.native_batch_norm.default, tuple(args[:8]), {}, 1


def _batch_norm_backward(args: Any, kwargs: Any) -> tuple[Any, Any, Any, int]:
    import torch

    # the argument order of PyTorch's own decomposition of this op
    # (torch/_decomp/decompositions.py): cuDNN saves the batch's mean and
    # inverse standard deviation, as native_batch_norm does
    x, grad, weight, running_mean, running_var, mean, invstd, eps = args[:8]
    return (
        torch.ops.aten.native_batch_norm_backward.default,
        (grad, x, weight, running_mean, running_var, mean, invstd, True, eps),
        {"output_mask": [True, True, True]},
        3,
    )


def _attention(args: Any, kwargs: Any) -> tuple[Any, Any, Any, int]:
    import torch

    math = torch.ops.aten._scaled_dot_product_attention_math.default
    return math, args, kwargs, 1


#: A device's own kernels, which the CPU lacks, and the CPU op that computes
#: the same from the same arguments: (op, arguments, keywords, outputs to
#: compare). MPS's attention runs the math path's own algorithm
#: (aten/src/ATen/native/mps/operations/Attention.mm); its schema is the math
#: op's. Only the first output of each forward is compared: the others are
#: what each backend saves for its backward.
CPU_EQUIVALENTS: dict[str, Callable[[Any, Any], tuple[Any, Any, Any, int]]] = {
    "aten.cudnn_batch_norm.default": _batch_norm,
    "aten.miopen_batch_norm.default": _batch_norm,
    "aten.cudnn_batch_norm_backward.default": _batch_norm_backward,
    "aten._scaled_dot_product_attention_math_for_mps.default": _attention,
}
