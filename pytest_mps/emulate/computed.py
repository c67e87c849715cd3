"""Calls the emulation computes its own way, because the Mac's kernel does.

Most device calls run the CPU's kernel as they are. A few would then differ
from a Mac in a way tests pin down, and are computed here instead (looked up
by the torch call's name in :data:`OWN`, once per device call):

- ``conv_transpose3d`` under ``torch.autocast("mps")`` stays float32: MPS has
  no float16 ``conv_transpose3d`` (``common_mps.py``'s UNIMPLEMENTED_XFAILLIST)
  and its autocast keeps the op in float32, where the CPU's casts it down
  (test_mps.py's ``test_conv_transpose3d_autocast_fp32``).
- ``conv3d`` of a ``channels_last_3d`` input gives a ``channels_last_3d``
  output, equal to the contiguous input's result. The MPS kernel keeps the
  layout (pytorch#184612: NDHWC through MPSGraph, measured bit-exact with
  NCDHW there, #182823); the CPU's float16 kernel returns a contiguous
  output, and its float32 one sums the weight gradient in another order than
  for a contiguous input (2e-5 apart at test_mps.py's shapes, which allow
  1e-5). Computed here from contiguous tensors and laid out as channels-last
  after; the gradient of a channels-last input is channels-last by autograd's
  layout contract.
- ``bincount`` with weights gives the MPS kernel's dtype: the weights' own
  for float32, float16, bfloat16, int32 and int64, int32 for the other
  integers and float64 (the CPU's is float64 for every non-float weight).
  Read from ``Bincount.mm``'s ``dispatch_for_weight_dtype``, which keeps the
  contract of the MPSGraph kernel before it.
- ``nll_loss_backward`` takes a ``total_weight`` of another float dtype than
  its input (MPS casts it; the CPU's kernel refuses "expected scalar type
  Half but found Float").
- ``narrow_copy`` is ``narrow`` then a contiguous ``clone``: MPS has no kernel
  of its own and runs the composite (``narrow_copy_dense_symint``), whose
  errors are ``narrow``'s (an IndexError for a dimension out of range, where
  the CPU's kernel raises an internal RuntimeError).
- ``linalg.householder_product`` (``orgqr``) in float16 and bfloat16 runs the
  Metal kernel's arithmetic (``LinearAlgebra.metal``'s ``orgqr``): each
  reflector ``H_i = I - tau_i v_i v_i^H`` and each product ``H_0 .. H_i``
  computed in the input's dtype, the products' sums accumulated one term at a
  time and rounded after every multiply and add. The CPU has no half kernel,
  and computing wider would give a Mac's answer more exactly than a Mac does
  (test_mps.py's half and bfloat16 comparisons against the float32 reference
  fail on a Mac: ``common_methods_invocations`` marks them).
- ``scaled_dot_product_attention`` with ``dropout_p > 0`` raises
  NotImplementedError where MPS takes its own attention kernel: grad mode
  off, or no input asking for a gradient (pytorch#184126, torch 2.13 on; the
  composite path a gradient takes applies dropout). Users meet it training
  with a frozen encoder or evaluating in train mode under ``no_grad``. Judged
  where the code under test calls ``F.scaled_dot_product_attention`` (as
  transformers' "sdpa" attention does); ``nn.MultiheadAttention`` calls it
  inside ``F.multi_head_attention_forward``, one call to the emulation, and is
  not judged. Before 2.13 that kernel ignored ``dropout_p`` (the same PR's
  reproducer), which is not emulated.
- ``masked_scatter`` takes a uint8 mask as a bool one, without the CPU's
  deprecation warning, and refuses other mask dtypes with MPS's text
  (``Indexing.mm``'s ``masked_scatter__mps``; the CPU refuses uint8 too).
- ``grid_sample`` and ``grid_sampler_2d``/``_3d`` of float16 and bfloat16
  inputs compute in float32 and round once at the end: MPS's kernel computes
  with float32 intermediates (opmath), where the CPU's rounds in half
  precision at every step (``common_mps.py`` skips the half comparison for
  that "unbounded divergence"; test_mps.py compares against a float32
  reference).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pytest_mps.audit import kernels
from pytest_mps.emulate import messages, widen

_CL3D = torch.channels_last_3d


def _channels_last_3d(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 5
        and not value.is_contiguous()
        and value.is_contiguous(memory_format=_CL3D)
    )


def conv3d_keeping_layout(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``conv3d`` as MPS computes it: a channels-last input stays channels-last."""
    if not args or not (
        _channels_last_3d(args[0])
        or _channels_last_3d(args[1] if len(args) > 1 else kwargs.get("weight"))
    ):
        return func(*args, **kwargs)
    plain = [
        a.contiguous() if isinstance(a, torch.Tensor) and a.dim() == 5 else a
        for a in args
    ]
    weight = kwargs.get("weight")
    if isinstance(weight, torch.Tensor):
        kwargs = {**kwargs, "weight": weight.contiguous()}
    out = func(*plain, **kwargs)
    if isinstance(out, torch.Tensor) and out.dim() == 5:
        return out.contiguous(memory_format=_CL3D)
    return out


def float32_under_autocast(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """The call in float32 inside ``torch.autocast("mps")``, as MPS keeps it."""
    if widen.autocast_blocks[0]:
        return widen.in_float32(func, args, kwargs)
    return func(*args, **kwargs)


#: Bincount.mm's output dtype per weight dtype; the rest keep their own.
_BINCOUNT_INT32 = frozenset({torch.int8, torch.int16, torch.uint8, torch.float64})


def bincount_as_mps(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``bincount`` whose output has the dtype MPS's kernel gives it."""
    out = func(*args, **kwargs)
    weights = args[1] if len(args) > 1 else kwargs.get("weights")
    if not isinstance(weights, torch.Tensor) or not isinstance(out, torch.Tensor):
        return out
    dtype = torch.int32 if weights.dtype in _BINCOUNT_INT32 else weights.dtype
    return out if out.dtype == dtype else out.to(dtype)


def nll_loss_backward_cast(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``nll_loss_backward`` with ``total_weight`` cast to the input's dtype."""
    if len(args) == 7:
        given, total = args[1], args[6]
        if (
            isinstance(given, torch.Tensor)
            and isinstance(total, torch.Tensor)
            and total.dtype != given.dtype
            and total.is_floating_point()
        ):
            args = (*args[:6], total.to(given.dtype))
    return func(*args, **kwargs)


def narrow_copy_composite(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``narrow_copy`` as the composite MPS runs: ``narrow``, then ``clone``."""
    if "out" in kwargs:
        return func(*args, **kwargs)
    view = torch.narrow(*args, **kwargs)
    return view.clone(memory_format=torch.contiguous_format)


_HALVES = frozenset({torch.float16, torch.bfloat16})


def _reflector(a: torch.Tensor, tau: torch.Tensor, i: int) -> torch.Tensor:
    """``H_i = I - tau_i v v^H`` in ``a``'s dtype, as the kernel's ``calc_H_irc``."""
    m = a.shape[-2]
    rows = torch.arange(m)
    v = torch.where(rows > i, a[..., :, i], (rows == i).to(a.dtype))
    outer = v.unsqueeze(-1) * v.conj().unsqueeze(-2)  # [r, c] = v_r * conj(v_c)
    eye = torch.eye(m, dtype=a.dtype)
    return eye - tau[..., i, None, None] * outer


def householder_product_as_metal(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``householder_product`` of half inputs, rounded as Metal's kernel rounds."""
    a = args[0] if args else kwargs.get("input")
    tau = args[1] if len(args) > 1 else kwargs.get("tau")
    if (
        "out" in kwargs
        or not isinstance(a, torch.Tensor)
        or not isinstance(tau, torch.Tensor)
        or a.dtype not in _HALVES
        or tau.dtype != a.dtype
        or a.dim() < 2
        or a.numel() == 0
        or tau.shape[-1] > a.shape[-1]
        or a.shape[-1] > a.shape[-2]
    ):
        return func(*args, **kwargs)  # the CPU's checks and texts
    try:  # the op's own refusal first (torch 2.6 has no MPS kernel for it)
        return func(*args, **kwargs)
    except NotImplementedError as error:
        if not widen.NOT_IMPLEMENTED.search(str(error)):
            raise
    m, n = a.shape[-2], a.shape[-1]
    if tau.numel() == 0:
        return torch.eye(m, dtype=a.dtype)[:, :n].expand(a.shape).clone()
    product = _reflector(a, tau, 0)
    for i in range(1, tau.shape[-1]):
        h = _reflector(a, tau, i)
        total = torch.zeros_like(product)
        for j in range(m):  # AB_rc += A[r, j] * B[j, c], in the dtype
            total = total + product[..., :, j, None] * h[..., None, j, :]
        product = total
    return product[..., :, :n].contiguous()


#: pytorch#184126 landed before torch 2.13's branch cut (2026-06-10).
_SDPA_REFUSES_DROPOUT = kernels.torch_release(torch.__version__) >= (2, 13)


def attention_refusing_dropout(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``scaled_dot_product_attention``: MPS's own kernel refuses dropout."""
    dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    if _SDPA_REFUSES_DROPOUT and dropout:
        qkv = [a for a in args[:3] if isinstance(a, torch.Tensor)]
        wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in qkv)
        if not wants_grad and not any(t.is_nested for t in qkv):
            raise NotImplementedError(messages.SDPA_DROPOUT)
    return func(*args, **kwargs)


def masked_scatter_as_mps(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``masked_scatter(_)`` with the mask dtypes MPS's kernel takes."""
    values = [*args, *kwargs.values()]
    if len(values) != 3 or not all(isinstance(v, torch.Tensor) for v in values):
        return func(*args, **kwargs)
    self, mask, source = values
    if self.numel() == 0 or self.dtype != source.dtype or mask.dtype == torch.bool:
        return func(*args, **kwargs)  # the CPU's checks and texts
    if mask.dtype != torch.uint8:
        raise RuntimeError(messages.MASKED_SCATTER_MASK)
    if args and len(args) == 3:
        return func(self, mask.bool(), source)
    return func(*args[:1], mask=mask.bool(), source=source)


_HALF = (torch.float16, torch.bfloat16)


def grid_sampler_in_float32(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """A half-precision grid sampler through float32, as MPS's kernel computes it."""
    first = args[0] if args else kwargs.get("input")
    if isinstance(first, torch.Tensor) and first.dtype in _HALF:
        return widen.computed_wider(func, args, kwargs, first.dtype)
    return func(*args, **kwargs)


#: The torch calls computed here, by name (:func:`..tagged._op_name`).
OWN: dict[
    str, Callable[[Callable[..., Any], Sequence[Any], Mapping[str, Any]], Any]
] = {
    "conv3d": conv3d_keeping_layout,
    "conv_transpose3d": float32_under_autocast,
    "bincount": bincount_as_mps,
    "nll_loss_backward": nll_loss_backward_cast,
    "narrow_copy": narrow_copy_composite,
    "linalg_householder_product": householder_product_as_metal,
    "orgqr": householder_product_as_metal,
    "scaled_dot_product_attention": attention_refusing_dropout,
    "masked_scatter": masked_scatter_as_mps,
    "masked_scatter_": masked_scatter_as_mps,
    "grid_sample": grid_sampler_in_float32,
    "grid_sampler": grid_sampler_in_float32,
    "grid_sampler_2d": grid_sampler_in_float32,
    "grid_sampler_3d": grid_sampler_in_float32,
}
