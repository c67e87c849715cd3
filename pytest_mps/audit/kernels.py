"""Arguments MPS kernels refuse: one table, read from PyTorch's MPS sources.

An op with an MPS kernel can still refuse an argument the CPU takes: a mode
(``grid_sample``'s border padding), a dtype, a size, a dimension count. The
``PYTORCH_ENABLE_MPS_FALLBACK`` variable does not help there, as the op has a
kernel. Each :class:`KernelRule` names the aten op a Mac dispatches, the
argument it refuses, PyTorch's own text and exception (the ``TORCH_CHECK`` calls
of ``aten/src/ATen/native/mps/operations/*.mm``), the source, and the torch
and macOS versions it holds for: ``torch_before`` (the first release that
takes the argument) and ``macos_before`` (the first macOS whose MPS takes it).

``--mps-emulate`` raises the text (:mod:`pytest_mps.emulate.policy`) and
``--mps-audit`` names the rule (:mod:`.recorder`), both through
:func:`pytest_mps.audit.rules.argument_rules`. Rules read off the torch API
call rather than an aten op (``F.linear``, ``torch.lstm``: on the CPU they
decompose before any aten op shows what a Mac would run) are in
:func:`pytest_mps.audit.rules.call_rules`.

The rules are read from PyTorch's public sources (2026); nothing here was
run on a Mac.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: What a rule's test returns: PyTorch's message for a refused argument, or None.
Refusal = Callable[[Sequence[Any], Mapping[str, Any]], "str | None"]

_OPS = "aten/src/ATen/native/mps/operations/"


@dataclasses.dataclass(frozen=True)
class KernelRule:
    """One argument an MPS kernel refuses (see the module doc)."""

    op: str  # the aten op a Mac dispatches, as the op table names it
    refuses: str  # the argument, in words: "padding_mode='border'"
    test: Refusal
    source: str
    error: str = "RuntimeError"
    torch_before: tuple[int, int] | None = None
    macos_before: tuple[int, int] | None = None

    def holds(self, torch_version: tuple[int, int], macos: tuple[int, int]) -> bool:
        """True where this torch and macOS refuse the argument."""
        if self.torch_before is not None and torch_version >= self.torch_before:
            return False
        return self.macos_before is None or macos < self.macos_before


def _arg(args: Sequence[Any], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


# -- grid_sample -------------------------------------------------------------------
# GridSampler.mm grid_sampler_2d_mps_impl switches on the enums of
# GridSamplerUtils.h (padding: zeros 0, border 1, reflection 2; interpolation:
# bilinear 0, nearest 1, bicubic 2). torch 2.9.1 still raises (kornia PR
# #4073, 2026-08); the 2.13.0 wheel's common_mps.py no longer lists
# nn.functional.grid_sample as unimplemented (pytorch#125098, #174343 moved the
# kernel to Metal). Releases 2.10 to 2.12 were not checked: the rule holds below 2.13.
_GRID = f"{_OPS}GridSampler.mm grid_sampler_2d_mps_impl; pytorch#125098"


def _grid_border(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    if _arg(args, kwargs, 3, "padding_mode") == 1:
        return "MPS: Unsupported Border padding mode"
    return None


def _grid_bicubic(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    if _arg(args, kwargs, 2, "interpolation_mode") == 2:
        return "MPS: Unsupported Bicubic interpolation"
    return None


# GridSampler.mm grid_sampler_3d_mps_impl (the generic sampler's, with
# op_name "grid_sampler_3d") switches on the interpolation mode after the
# shared checks: bilinear runs, nearest and bicubic are refused. Bicubic never
# gets there: GridSamplerUtils.h check_grid_sampler_3d refuses it for 5-d
# inputs on every device, the CPU included (until 2.15, pytorch#194738).
# kornia's real Mac (torch 2.9.1) fails its 3-D motion blur on it
# (kornia#4147), and 2.9.1's common_mps.py lists grid_sampler_3d as failing.
# The 2.13.0 wheel's OpInfo samples 5-d nearest and its common_mps.py no
# longer marks float32 grid_sample (2.15.0's marks it for 5-d bicubic only),
# so PyTorch's Mac CI runs 3-d nearest from 2.13: the rule holds below 2.13
# (2.10 to 2.12 were not checked). The op table's fallback stands where the
# yaml gives grid_sampler_3d no MPS kernel (2.6).
_GRID_3D = f"{_OPS}GridSampler.mm grid_sampler_3d_mps_impl"


def _grid_3d_nearest(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    if _arg(args, kwargs, 2, "interpolation_mode") == 1:
        return "grid_sampler_3d: Unsupported Nearest interpolation"
    return None


# -- convolution -------------------------------------------------------------------
_CONV = f"{_OPS}Convolution.mm _mps_convolution_impl"


def _conv_integral(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    tensor = args[0]
    if tensor.is_floating_point() or tensor.is_complex():
        return None
    return "Convolution is supported only for Floating types"


def _conv_sizes(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[int]:
    """The output's sizes, as ConvUtils' conv_output_size computes them."""
    tensor, weight = args[0], args[1]
    stride, padding, dilation = (
        list(_arg(args, kwargs, i, n) or ())
        for i, n in ((3, "stride"), (4, "padding"), (5, "dilation"))
    )
    transposed = bool(_arg(args, kwargs, 6, "transposed"))
    if transposed:
        return []  # the transposed kernel has no such check
    dims = tensor.dim() - 2
    sizes = [int(tensor.shape[0]), int(weight.shape[0])]
    for d in range(dims):
        s = stride[d] if d < len(stride) else stride[-1] if stride else 1
        p = padding[d] if d < len(padding) else padding[-1] if padding else 0
        k = dilation[d] if d < len(dilation) else dilation[-1] if dilation else 1
        span = k * (int(weight.shape[d + 2]) - 1) + 1
        sizes.append((int(tensor.shape[d + 2]) + 2 * p - span) // s + 1)
    return sizes


def _conv_wide(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    # "for (auto elem : output_t.sizes())": any output size, not only channels
    if any(size > 1 << 16 for size in _conv_sizes(args, kwargs)):
        return "Output channels > 65536 not supported at the MPS device. "
    return None


def _conv3d(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    if args[0].dim() == 5 and not _arg(args, kwargs, 6, "transposed"):
        return "Conv3D is only supported on MPS for MacOS_13_2 or newer"
    return None


# -- adaptive pooling ----------------------------------------------------------------
_POOL = f"{_OPS}AdaptivePooling.mm set_kernel_params (pytorch#96056)"
_POOL_ISSUE = (
    " Non-divisible input sizes are not implemented on MPS device yet. For now, "
    "you can manually transfer tensor to cpu in this case. Please refer to [this "
    "issue](https://github.com/pytorch/pytorch/issues/96056)"
)


def _pool_sizes(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    tensor, size = args[0], _arg(args, kwargs, 1, "output_size")
    if size is None or len(size) != 2 or tensor.dim() < 2:
        return None
    have = (int(tensor.shape[-2]), int(tensor.shape[-1]))
    want = tuple(h if w is None else int(w) for h, w in zip(have, size, strict=True))
    return have, (want[0], want[1])


def _pool_mixed(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    sizes = _pool_sizes(args, kwargs)
    if sizes is None:
        return None
    (ih, iw), (oh, ow) = sizes
    if (ih >= oh and iw >= ow) or (ih <= oh and iw <= ow):
        return None
    return (
        "Adaptive pool MPS: Input height and width must both be greater than, or "
        "equal to, or lesser than output height and width"
    )


def _pool_divisible(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    sizes = _pool_sizes(args, kwargs)
    if sizes is None or _pool_mixed(args, kwargs) is not None:
        return None
    (ih, iw), (oh, ow) = sizes
    if ih >= oh:
        if oh and ow and (ih % oh or iw % ow):
            return (
                "Adaptive pool MPS: input sizes must be divisible by output sizes."
                + _POOL_ISSUE
            )
    elif ih and iw and (oh % ih or ow % iw):
        return (
            "Adaptive pool MPS: output sizes must be divisible by input sizes."
            + _POOL_ISSUE
        )
    return None


# -- linear algebra ------------------------------------------------------------------
_LU = f"{_OPS}LinearAlgebra.mm linalg_lu_factor_out_mps_impl"


def _lu_complex(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    if args[0].is_complex():
        return "linalg.lu_factor(): MPS doesn't support complex types."
    return None


def _lu_no_pivot(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    if _arg(args, kwargs, 1, "pivot") is False:
        return "linalg.lu_factor(): MPS doesn't allow pivot == False."
    return None


#: Table ops that may have no MPS kernel in the installed torch while a
#: composite op reaching them has one: torch 2.6's yaml gives
#: ``linalg_lu_factor`` an MPS kernel (``linalg_lu_factor_mps``, making the
#: checks above) and ``linalg_lu_factor_ex`` none, and the CPU's composite
#: ``linalg_lu_factor`` calls ``linalg_lu_factor_ex``. There the op's rules hold
#: for calls through the named torch function (a Mac runs its composite's MPS
#: kernel) and any other call meets the op table's fallback, as on a Mac.
THROUGH: dict[str, tuple[str, str]] = {
    "aten::linalg_lu_factor_ex": ("aten::linalg_lu_factor", "torch.linalg.lu_factor"),
}


#: The table. Ops are the ones both a Mac and the CPU dispatch (checked on the
#: CPU through ``__torch_dispatch__``); order within an op is the kernel's order.
KERNEL_RULES: tuple[KernelRule, ...] = (
    KernelRule(
        "aten::grid_sampler_2d",
        "padding_mode='border'",
        _grid_border,
        _GRID,
        torch_before=(2, 13),
    ),
    KernelRule(
        "aten::grid_sampler_2d",
        "mode='bicubic'",
        _grid_bicubic,
        _GRID,
        torch_before=(2, 13),
    ),
    KernelRule(
        "aten::grid_sampler_3d",
        "mode='nearest'",
        _grid_3d_nearest,
        _GRID_3D,
        torch_before=(2, 13),
    ),
    KernelRule(
        "aten::convolution",
        "5-d input (conv3d) before macOS 13.2",
        _conv3d,
        _CONV,
        macos_before=(13, 2),
    ),
    KernelRule("aten::convolution", "an integer input", _conv_integral, _CONV),
    KernelRule(
        "aten::convolution",
        "an output size over 65536 before macOS 15.1",
        _conv_wide,
        _CONV,
        "NotImplementedError",
        macos_before=(15, 1),
    ),
    KernelRule(
        "aten::_adaptive_avg_pool2d",
        "output height growing while width shrinks, or the reverse",
        _pool_mixed,
        _POOL,
        "NotImplementedError",
    ),
    KernelRule(
        "aten::_adaptive_avg_pool2d",
        "sizes not divisible by each other",
        _pool_divisible,
        _POOL,
        "NotImplementedError",
    ),
    KernelRule(
        "aten::adaptive_max_pool2d",
        "output height growing while width shrinks, or the reverse",
        _pool_mixed,
        _POOL,
        "NotImplementedError",
    ),
    KernelRule("aten::linalg_lu_factor_ex", "a complex matrix", _lu_complex, _LU),
    KernelRule("aten::linalg_lu_factor_ex", "pivot=False", _lu_no_pivot, _LU),
)

#: EmptyTensor.cpp empty_mps: every MPS allocation (c10::metal::max_ndim).
MAX_DIMS = 16
MAX_DIMS_SOURCE = "aten/src/ATen/mps/EmptyTensor.cpp empty_mps (c10::metal::max_ndim)"


def too_many_dims(dims: int) -> str | None:
    """PyTorch's text for an MPS tensor of ``dims`` dimensions, or None."""
    if dims <= MAX_DIMS:
        return None
    return f"MPS supports tensors with dimensions <= {MAX_DIMS}, but got {dims}."


def rules_for(
    torch_version: tuple[int, int], macos: tuple[int, int]
) -> dict[str, tuple[KernelRule, ...]]:
    """The rules that hold for this torch and macOS, by op, in table order."""
    found: dict[str, list[KernelRule]] = {}
    for rule in KERNEL_RULES:
        if rule.holds(torch_version, macos):
            found.setdefault(rule.op, []).append(rule)
    return {op: tuple(rules) for op, rules in found.items()}


def torch_release(version: str) -> tuple[int, int]:
    """``"2.13.0+cpu"`` -> (2, 13)."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"not a torch version: {version!r}") from None
