"""Dtypes an MPS kernel has and the CPU kernel lacks, computed as a Mac would.

Many MPS kernels take float16 and bfloat16 where the CPU's stop at float32
(the ``torch.special`` polynomials and Bessel functions, ``cdist``,
``avg_pool3d``, ``polar``, complex32 ``sqrt``): the emulated device would fail
there with the CPU's ``"bessel_j0_cpu" not implemented for 'Half'``, a false
alarm. A device call that fails so is computed again with those inputs widened
(float16 and bfloat16 to float32, complex32 to complex64) and its outputs of
the wider dtype narrowed back, as the Mac's kernel gives them in the input's
dtype (in place for ``op_``). Numbers may differ in the last bits from a Mac's,
which computes in half precision on the GPU.

Not where PyTorch says the MPS kernel fails at that dtype too: an op listed
for it in ``common_mps.py``'s lists of ops expected to fail on MPS
(:mod:`pytest_mps.audit.expectations`, read once) keeps the CPU's error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

#: The CPU's dispatch error for a dtype its kernel lacks (AT_DISPATCH).
NOT_IMPLEMENTED = re.compile(
    r"not implemented for '(Half|BFloat16|ComplexHalf|Float8_e4m3fn)'"
)
_NAMED = {
    "Half": torch.float16,
    "BFloat16": torch.bfloat16,
    "ComplexHalf": torch.complex32,
    "Float8_e4m3fn": torch.float8_e4m3fn,
}
WIDER = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.complex32: torch.complex64,
    torch.float8_e4m3fn: torch.float32,
}
#: The ops whose MPS kernels take float8_e4m3fn where the CPU's do not: torch
#: 2.15's OpInfo ``dtypesIfMPS`` list it for them (pytorch#194074), and the
#: CPU's ``scatter_gather_tensor_cpu`` lacks it. Any other op keeps the CPU's
#: error for float8, as most MPS kernels refuse it too (``add``). Before 2.15
#: no float8 tensor reaches the device (ops.mps_dtypes).
#: ``benchmarks/torch_facts.py`` checks each against the installed wheel.
FLOAT8_MPS_OPS = frozenset({"gather", "scatter"})
#: ``torch.special.bessel_j0`` is ``special_bessel_j0`` in C++: the OpInfo's name.
_MODULES = (
    ("torch.special", "special."),
    ("torch._C._special", "special."),
    ("torch.nn.functional", "nn.functional."),
    ("torch._C._nn", "nn.functional."),
    ("torch.linalg", "linalg."),
    ("torch._C._linalg", "linalg."),
    ("torch.fft", "fft."),
    ("torch._C._fft", "fft."),
)
_lists: list[Any] = []


def opinfo_key(func: Any) -> str:
    """The OpInfo name PyTorch's MPS lists use for a torch call."""
    name = getattr(func, "__name__", "") or ""
    module = getattr(func, "__module__", "") or ""
    for prefix, key in _MODULES:
        if module == prefix:
            short = key.split(".")[0] + "_"
            return key + name.removeprefix(short)
    if name.startswith("special_"):
        return "special." + name.removeprefix("special_")
    return name.removesuffix("_")


def fails_on_mps(func: Any, dtype: torch.dtype, macos: tuple[int, int]) -> bool:
    """True when PyTorch's MPS lists expect ``func`` to fail at ``dtype``."""
    if not _lists:
        from pytest_mps.audit import expectations

        try:
            _lists.append(expectations.read_lists(expectations.common_mps_path()))
        except expectations.SourceError:
            _lists.append(None)
    lists = _lists[0]
    if lists is None:
        return False
    found = lists.verdict(opinfo_key(func), str(dtype).removeprefix("torch."), macos)
    return found is not None and found[0]


def narrow_dtype(error: BaseException, func: Any = None) -> torch.dtype | None:
    """The dtype a CPU kernel said it lacks, or None for another error.

    float8_e4m3fn only for ``func`` in :data:`FLOAT8_MPS_OPS`.
    """
    found = NOT_IMPLEMENTED.search(str(error))
    if found is None:
        return None
    dtype = _NAMED[found.group(1)]
    if dtype == torch.float8_e4m3fn and opinfo_key(func) not in FLOAT8_MPS_OPS:
        return None
    return dtype


def _widen(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == dtype:
        return value.to(WIDER[dtype])
    if type(value) is list or type(value) is tuple:
        return type(value)(_widen(v, dtype) for v in value)
    return value


#: What an output of the wider dtype was on the Mac, per narrow input dtype
#: (``polar`` of float16 gives complex32).
_NARROWED = {
    torch.float8_e4m3fn: {torch.float32: torch.float8_e4m3fn},
    torch.float16: {torch.float32: torch.float16, torch.complex64: torch.complex32},
    torch.bfloat16: {torch.float32: torch.bfloat16},
    torch.complex32: {torch.complex64: torch.complex32, torch.float32: torch.float16},
}


def _narrow(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        narrow = _NARROWED[dtype].get(value.dtype)
        return value if narrow is None else value.to(narrow)
    if type(value) is list or type(value) is tuple:
        return type(value)(_narrow(v, dtype) for v in value)
    return value


def computed_wider(
    func: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    dtype: torch.dtype,
) -> Any:
    """``func`` run with ``dtype`` tensors widened, its outputs narrowed back."""
    wide_args = [_widen(a, dtype) for a in args]
    wide_kwargs = {k: _widen(v, dtype) for k, v in kwargs.items()}
    out = func(*wide_args, **wide_kwargs)
    given = kwargs.get("out")
    if isinstance(given, torch.Tensor):
        given.copy_(wide_kwargs["out"])
        return given
    name = getattr(func, "__name__", "") or ""
    if name.endswith("_") and not name.endswith("__") and args:
        first = args[0]
        if isinstance(first, torch.Tensor) and first.dtype == dtype:
            first.copy_(wide_args[0])
            return first
    return _narrow(out, dtype)


#: Open ``torch.autocast("mps")`` blocks in this process (install's patch).
autocast_blocks = [0]


def in_float32(func: Callable[..., Any], args: Sequence[Any], kwargs: Any) -> Any:
    """``func`` with the CPU's autocast off and low-precision inputs widened."""
    with torch.autocast("cpu", enabled=False):
        wide_args = [_widen(_widen(a, torch.float16), torch.bfloat16) for a in args]
        wide_kwargs = {
            k: _widen(_widen(v, torch.float16), torch.bfloat16)
            for k, v in kwargs.items()
        }
        return func(*wide_args, **wide_kwargs)
