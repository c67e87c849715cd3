"""Argument- and dtype-dependent verdicts: what the op table alone cannot tell.

An op with an MPS kernel can still refuse some arguments on MPS; a dtype can
be fine for one op and not for another; a float64 tensor matters only if it
would live on MPS. Each rule here names the PyTorch source it rests on and
is ``likely``: it is inferred, not read from a PyTorch table.

:func:`op_key` is the ``(op, dtype, categorical arguments)`` key shared with
:mod:`.opinfo_trace`, under which PyTorch's MPS test lists are attributed to
aten ops (:mod:`.expectations`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from pytest_mps.ops import (
    CERTAIN,
    FALLBACK,
    FORCED_FALLBACK,
    LIKELY,
    MPS_KERNEL,
    RAISES,
)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one rule says of one op call."""

    outcome: str
    rule: str
    source: str
    certainty: str = LIKELY
    #: PyTorch's own error text and exception, where the rule knows them (the
    #: emulated device raises them; ``--mps-audit`` shows ``rule``)
    message: str = ""
    error: str = "RuntimeError"


def op_key(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any], tensor: type
) -> str:
    """``"aten::scatter_reduce.two|int64|prod"``: op, dtype, categorical arguments.

    The dtype is the first tensor argument's (``self`` for most ops), else the
    ``dtype=`` argument (factories), else ``-``. Categorical arguments are the
    bool and str ones (``reduce="prod"``, ``hermitian=True``), which switch
    kernels on and off.
    """
    dtype = _first_dtype(args, tensor)
    if dtype is None:
        value = kwargs.get("dtype")
        dtype = str(value).removeprefix("torch.") if value is not None else "-"
    parts = [str(a) for a in args if isinstance(a, (bool, str))]
    parts += [f"{k}={v}" for k, v in kwargs.items() if isinstance(v, (bool, str))]
    key = f"{name}|{dtype}"
    return f"{key}|{','.join(parts)}" if parts else key


def _first_dtype(values: Sequence[Any], tensor: type) -> str | None:
    for value in values:
        if isinstance(value, tensor):
            return str(getattr(value, "dtype")).removeprefix("torch.")  # noqa: B009
        if isinstance(value, (list, tuple)):
            found = _first_dtype(value, tensor)
            if found is not None:
                return found
    return None


# -- argument rules -------------------------------------------------------------------

#: A torch API call as the audit saw it: the function, its args and kwargs.
Call = tuple[Any, Sequence[Any], Mapping[str, Any]]


# AdaptivePooling.mm, set_kernel_params (TORCH_CHECK_NOT_IMPLEMENTED).
_SVD_FALLBACK_SOURCE = (
    "aten/src/ATen/mps/MPSFallback.mm registers a CPU fallback for linalg_svd "
    "alone; native_functions.yaml gives _linalg_svd no MPS kernel"
)


@lru_cache(maxsize=1)
def _linalg_svd_callers() -> dict[Any, str]:
    """The torch calls that reach ``_linalg_svd`` through ``linalg_svd``.

    MPS runs ``linalg_svd`` on the CPU itself (MPSFallback.mm), so these work
    on MPS, slowly; every other way to ``_linalg_svd`` (svdvals, cond,
    matrix_rank, a nuclear or spectral norm) calls it directly and raises.
    ``torch.svd``, ``linalg.pinv`` and ``pinverse`` call ``at::linalg_svd``
    in C++; ``svd_lowrank`` and ``pca_lowrank`` call ``torch.linalg.svd``.
    """
    import torch

    return {
        torch.linalg.svd: "torch.linalg.svd",
        torch.svd: "torch.svd",
        torch.Tensor.svd: "Tensor.svd",
        torch.linalg.pinv: "torch.linalg.pinv",
        torch.pinverse: "torch.pinverse",
        torch.Tensor.pinverse: "Tensor.pinverse",
        torch.svd_lowrank: "torch.svd_lowrank",
        torch.pca_lowrank: "torch.pca_lowrank",
    }


def call_name(func: Any) -> str:
    """``torch.linalg.svdvals``, ``Tensor.sort``: a torch API function's name."""
    name = getattr(func, "__name__", repr(func))
    owner = getattr(func, "__objclass__", None)
    if owner is not None:
        return f"{owner.__name__.removesuffix('Base')}.{name}"
    module = getattr(func, "__module__", None) or "torch"
    if module == "torch._C._linalg":
        return f"torch.linalg.{name.removeprefix('linalg_')}"
    if module == "torch._C._nn" or module.startswith("torch.nn.functional"):
        return f"F.{name}"
    if module.startswith("torch._") or module == "torch.functional":
        module = "torch"
    return f"{module}.{name}"


def _compute_uv(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """``compute_uv``, third in both ``_linalg_svd`` and ``torch.svd``."""
    return bool(args[2] if len(args) > 2 else kwargs.get("compute_uv", True))


def _svd(
    args: Sequence[Any], kwargs: Mapping[str, Any], call: Call | None = None
) -> Verdict:
    # svdvals passes compute_uv=False, but not under a dispatch mode (it then
    # counts as a tensor subclass and asks for U and V too). The torch call
    # the op runs under (``call``) tells which way it came.
    compute_uv = _compute_uv(args, kwargs)
    if call is not None:
        func, call_args, call_kwargs = call
        name = _linalg_svd_callers().get(func)
        if name in ("torch.svd", "Tensor.svd") and not _compute_uv(
            call_args, call_kwargs
        ):
            name = None  # singular values only: _linalg_svd directly
        if name is not None:
            return Verdict(
                FORCED_FALLBACK,
                f"{name} reaches linalg_svd, which MPS runs on the CPU without "
                "PYTORCH_ENABLE_MPS_FALLBACK (works, slowly)",
                _SVD_FALLBACK_SOURCE,
            )
        return Verdict(
            FALLBACK,
            f"{call_name(func)} calls _linalg_svd directly, not through "
            "linalg_svd, and _linalg_svd has no MPS kernel",
            _SVD_FALLBACK_SOURCE,
        )
    if not compute_uv:
        return Verdict(
            FALLBACK,
            "singular values only (svdvals, matrix_rank, cond, nuclear norm) "
            "call _linalg_svd directly, which has no MPS kernel",
            "native_functions.yaml (_linalg_svd.U: CPU, CUDA) and MPSFallback.mm",
        )
    return Verdict(
        FORCED_FALLBACK,
        "through svd/linalg.svd: MPS runs linalg_svd on the CPU without "
        "PYTORCH_ENABLE_MPS_FALLBACK (works, slowly); through svdvals, "
        "matrix_rank, cond or a nuclear norm it would raise instead",
        "MPSFallback.mm registers mps_fallback for linalg_svd",
    )


_CONV_SOURCE = "torch/testing/_internal/common_mps.py UNIMPLEMENTED_XFAILLIST"


def _convolution(
    args: Sequence[Any], kwargs: Mapping[str, Any], call: Call | None = None
) -> Verdict | None:
    # integer inputs, conv3d on old macOS and wide outputs: kernels.KERNEL_RULES
    tensor = args[0]
    dtype = str(tensor.dtype).removeprefix("torch.")
    transposed = args[6] if len(args) > 6 else kwargs.get("transposed", False)
    dims = tensor.dim() - 2
    if transposed and (
        (dtype == "bfloat16" and dims in (2, 3)) or (dtype == "float16" and dims == 3)
    ):
        return Verdict(
            RAISES,
            f"conv_transpose{dims}d of {dtype} fails on MPS",
            f"{_CONV_SOURCE} nn.functional.conv_transpose{dims}d",
        )
    return None


#: aten op name -> rule(args, kwargs, call) deciding it from its arguments and
#: ``call``, the torch API call the op runs under when the audit saw one (None:
#: leave it to the op table). Their ops are never blamed from PyTorch's lists:
#: whether they fail depends on the arguments.
ARGUMENT_RULES: dict[
    str, Callable[[Sequence[Any], Mapping[str, Any], Call | None], Verdict | None]
] = {
    "aten::_linalg_svd": _svd,
    "aten::convolution": _convolution,
}

#: Rules about an op MPS has no kernel for, which hold only while the installed
#: torch's yaml says so. The svd rule describes MPSFallback.mm's way around a
#: missing ``_linalg_svd.U`` kernel; torch 2.14's yaml gives it one
#: (``CPU, CUDA, MPS: _linalg_svd_out``, native MPS SVD, pytorch PR #185954),
#: and from then on svdvals, cond and the nuclear norm run on MPS.
WHILE_NO_KERNEL = frozenset({"aten::_linalg_svd"})


Rule = Callable[[Sequence[Any], Mapping[str, Any], Call | None], Verdict | None]


def argument_rules(
    outcome_of: Callable[[str], str],
    macos: tuple[int, int] = (99, 0),
    torch_version: str | None = None,
) -> dict[str, Rule]:
    """The argument rules that hold for the installed torch and ``macos``.

    :data:`ARGUMENT_RULES` and the kernel table (:mod:`.kernels`), one rule
    per op: the table's rules for an op are tried first, in order.
    ``outcome_of(op)`` is the op table's outcome for an op; a rule of
    :data:`WHILE_NO_KERNEL` is left out once it is not a fallback there, and
    the kernel table's rules for an op are left out while it is one.
    ``torch_version`` defaults to the installed torch's.
    """
    from pytest_mps.audit import kernels

    if torch_version is None:
        import torch

        torch_version = torch.__version__
    found: dict[str, Rule] = {
        op: rule
        for op, rule in ARGUMENT_RULES.items()
        if op not in WHILE_NO_KERNEL or outcome_of(op) == FALLBACK
    }
    table = kernels.rules_for(kernels.torch_release(torch_version), macos)
    for op, listed in table.items():
        # a kernel rule is an MPS kernel's own check: where this torch's yaml
        # gives the op no MPS kernel, the op table's fallback stands, but for
        # calls through a composite op with an MPS kernel of its own
        if outcome_of(op) != FALLBACK:
            found[op] = _kernel_rule(listed, found.get(op))
        elif op in kernels.THROUGH:
            owner, through = kernels.THROUGH[op]
            if outcome_of(owner) == MPS_KERNEL:
                found[op] = _kernel_rule(listed, found.get(op), (owner, through))
    return found


def _kernel_rule(
    listed: tuple[Any, ...],
    then: Rule | None,
    through: tuple[str, str] | None = None,
) -> Rule:
    """One rule trying the kernel table's ``listed`` rules, then ``then``.

    With ``through`` (the composite op and its torch function), the rules
    hold only for calls through that function, which then run on MPS; other
    calls go on to ``then``.
    """

    def rule(
        args: Sequence[Any], kwargs: Mapping[str, Any], call: Call | None = None
    ) -> Verdict | None:
        if through is not None and (call is None or call_name(call[0]) != through[1]):
            return then(args, kwargs, call) if then is not None else None
        for entry in listed:
            message = entry.test(args, kwargs)
            if message is not None:
                return Verdict(
                    RAISES,
                    f"MPS refuses {entry.refuses}: {message.strip()}",
                    entry.source,
                    CERTAIN,
                    message,
                    entry.error,
                )
        if through is not None:
            return Verdict(
                MPS_KERNEL,
                f"{through[1]} runs {through[0]}'s own MPS kernel",
                "native_functions.yaml",
                CERTAIN,
            )
        return then(args, kwargs, call) if then is not None else None

    return rule


# -- call rules: what the aten ops on the CPU do not show ------------------------------

_LINEAR_SOURCE = (
    "aten/src/ATen/native/mps/operations/Linear.mm _mps_linear: 'MPS device does "
    "not support linear for non-float inputs' (and weights); common_mps.py "
    "UNIMPLEMENTED_XFAILLIST nn.functional.linear: GEMM on MPS is not supported "
    "for integral types"
)


_LINEAR_PLACEMENT = (
    "aten/src/ATen/native/mps/operations/Linear.mm _mps_linear: 'Tensor for "
    "argument ... is on ... but expected on mps'"
)


def _device_type(value: Any) -> str | None:
    device = getattr(value, "device", None)
    return getattr(device, "type", None)


def _linear(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Verdict | None:
    # On the CPU linear decomposes into addmm/matmul, which MPS has for
    # integers too; on MPS linear has a kernel of its own (_mps_linear) that
    # refuses them and checks each tensor's device, in this order.
    named = (
        ("input", "inputs", args[0] if args else kwargs.get("input")),
        ("weight", "weights", args[1] if len(args) > 1 else kwargs.get("weight")),
        ("bias", "bias", args[2] if len(args) > 2 else kwargs.get("bias")),
    )
    on_mps = any(_device_type(value) == "mps" for _, _, value in named)
    for name, role, value in named:
        dtype = getattr(value, "dtype", None)
        if dtype is None:
            continue
        floating = dtype.is_floating_point or dtype.is_complex
        checks = [("dtype", floating), ("device", _device_type(value) == "mps")]
        if name == "bias":
            checks.reverse()
        for check, fine in checks:
            if fine or (check == "device" and not on_mps):
                continue
            if check == "dtype":
                kind = str(dtype).removeprefix("torch.")
                return Verdict(
                    RAISES,
                    f"linear of {kind} {role}: MPS device does not support linear "
                    f"for non-float {role}",
                    _LINEAR_SOURCE,
                    CERTAIN,
                    f"MPS device does not support linear for non-float {role}",
                )
            where = getattr(value, "device", "cpu")
            message = f"Tensor for argument {name} is on {where} but expected on mps"
            return Verdict(
                RAISES, f"linear: {message}", _LINEAR_PLACEMENT, CERTAIN, message
            )
    return None


_LSTM_SOURCE = (
    "aten/src/ATen/native/mps/operations/RnnOps.mm _lstm_mps: 'LSTM with "
    "projections is not currently supported with MPS.'"
)


def _lstm(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Verdict | None:
    # torch.lstm(input, (h0, c0), ...): nn.LSTM(proj_size=p) gives h0 a last
    # size of p and c0 one of hidden_size; _lstm_mps compares the two.
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    if not isinstance(hx, (list, tuple)) or len(hx) != 2:
        return None
    h0, c0 = hx
    if getattr(h0, "dim", lambda: 0)() < 3 or h0.shape[2] == c0.shape[2]:
        return None
    message = "LSTM with projections is not currently supported with MPS."
    return Verdict(
        RAISES, f"nn.LSTM(proj_size=...): {message}", _LSTM_SOURCE, CERTAIN, message
    )


def call_rules() -> dict[Any, tuple[str, Callable[..., Verdict | None]]]:
    """Rules read off torch API calls: function -> (the aten op on MPS, rule)."""
    import torch

    return {
        torch.nn.functional.linear: ("aten::linear", _linear),
        torch.lstm: ("aten::_lstm_mps", _lstm),
    }


# -- dtypes ----------------------------------------------------------------------------

#: OperationUtils.mm getMPSDataType: checkSupportsBFloat16 / checkSupportsComplex.
MACOS_14_DTYPES = {
    "torch.bfloat16": "MPS bfloat16 type is supported on MacOS 14.0 or newer.",
    "torch.complex64": "MPS complex types are only supported on MacOS 14.0 or newer.",
    "torch.complex32": "MPS complex types are only supported on MacOS 14.0 or newer.",
}


def makes_scalar(args: Sequence[Any], tensor: type) -> bool:
    """True when an op call is a factory making a 0-dim tensor (size ``[]``).

    PyTorch's own code makes such float64 scalars for tolerances
    (``pinverse``'s ``rcond`` is ``full([], 1e-15, dtype=float64)`` on the
    CPU) and MPS ops take 0-dim CPU tensors as scalars, so they need not live
    on MPS. A conversion of a tensor (``x.double()``) is never one: its result
    lives where ``x`` does.
    """
    if any(isinstance(a, tensor) for a in args):
        return False
    sizes = [a for a in args if isinstance(a, (list, tuple))]
    return bool(sizes) and all(len(s) == 0 for s in sizes)
