"""PyTorch's own texts for what a Mac refuses, each with the source it comes from.

The emulation raises with these words, so a test fails under ``--mps-emulate``
with the message it fails with on a Mac.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class NotEmulatedError(RuntimeError):
    """What the emulated device cannot do, where a Mac can (Metal, MPS-only ops).

    A test that meets one fails with one line naming what is not emulated
    (the emulation's plugin shortens its report), never with an error that
    names the CPU or says MPS is not available while ``is_available()`` is true.
    """


# No text of PyTorch's: the emulation's own, for what only a real Mac can run.
NOT_EMULATED = "not emulated by pytest-mps (--mps-emulate computes on the CPU): {what}"


def not_emulated(what: str) -> NotEmulatedError:
    """The error for ``what``, which the emulated device cannot do."""
    return NotEmulatedError(NOT_EMULATED.format(what=what))


def refuses(what: str) -> Callable[..., Any]:
    """A function that raises :func:`not_emulated` for ``what`` when called."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        raise not_emulated(what)

    return refuse


# aten/src/ATen/mps/MPSFallback.mm, mps_error_fallback (TORCH_CHECK_NOT_IMPLEMENTED).
NOT_IMPLEMENTED = (
    "The operator '{op}' is not currently implemented for the MPS device. If you "
    "want this op to be considered for addition please comment on "
    "https://github.com/pytorch/pytorch/issues/141287 and mention use-case, that "
    "resulted in missing op as well as commit hash {sha}. As a temporary fix, you "
    "can set the environment variable `PYTORCH_ENABLE_MPS_FALLBACK=1` to use the "
    "CPU as a fallback for this op. WARNING: this will be slower than running "
    "natively on MPS."
)


# pytorch#184126 (merged 2026-05-18, in torch 2.13 on), TORCH_CHECK_NOT_IMPLEMENTED
# where MPS's own attention kernel is given dropout_p > 0; the text as test_mps.py's
# test_dropout_raises_not_implemented and users' reports give it.
SDPA_DROPOUT = "scaled_dot_product_attention for MPS does not support dropout."


# native/mps/operations/Indexing.mm, masked_scatter__mps (TORCH_CHECK): MPS takes
# bool and uint8 masks (without the CPU's deprecation warning for uint8).
MASKED_SCATTER_MASK = "masked_scatter: expected BoolTensor or ByteTensor for mask"


# MPSFallback.mm, mps_fallback (TORCH_WARN_ONCE). A Mac's warning also ends in
# " (Triggered internally at <build path>/MPSFallback.mm:<line>.)", which is
# the build's and not reproduced.
FALLBACK_WARNING = (
    "The operator '{op}' is not currently supported on the MPS backend and will "
    "fall back to run on the CPU. This may have performance implications."
)


# aten/src/ATen/TensorIterator.cpp, TensorIteratorBase::compute_types.
TWO_DEVICES = (
    "Expected all tensors to be on the same device, but found at least two "
    "devices, {first} and {second}!"
)


# aten/src/ATen/TensorUtils.cpp checkSameGPU, as checkAllSameGPU calls it from
# native/mps/operations/LinearAlgebra.mm: mm_out_mps_impl checks ("mm", out #0,
# mat1 #1, mat2 #2), addmm_out_mps_impl (its __func__; out #0, self #1, mat1 #2,
# mat2 #3). matmul reaches mm; bmm and baddbmm check nothing of the kind and
# meet the Placeholder's text; F.linear has a kernel of its own (audit.rules).
SAME_GPU = {
    "mm": ("mm", ("mat1", "mat2")),
    "addmm": ("addmm_out_mps_impl", ("self", "mat1", "mat2")),
}


# aten/src/ATen/native/mps/operations/ (dot_check for dot and vdot;
# isin_Tensor_Tensor_out_mps in TensorCompare.mm): kernels that check devices
# in their own words before any placeholder.
OWN_PLACEMENT = {
    "dot": "Expected all tensors to be on the same device. Found: {0}, {1}",
    "vdot": "Expected all tensors to be on the same device. Found: {0}, {1}",
    "isin": "Expected elements.is_mps() && test_elements.is_mps(), got {0} and {1}",
}


# aten/src/ATen/native/ReduceOps.cpp, pre_check_gradient (every backend).
GRADIENT = (
    "torch.gradient expected each tensor to be on the same device, but got "
    "devices {} and {}!"
)

# aten/src/ATen/native/mps/OperationUtils.mm, Placeholder::Placeholder.
PLACEHOLDER = "Placeholder storage has not been allocated on MPS device!"


# No text of PyTorch's: on a Mac the process crashes or the kernel reads a
# wrong buffer (see pytest_mps.watch.device_mix.BUFFER_KERNELS).
BUFFER_SCALAR = (
    "MPS (emulated by pytest-mps): {op} binds its tensor inputs as Metal "
    "buffers, and the 0-dim CPU tensor {argument} cannot be one: on a Mac this "
    "crashes or reads a wrong buffer instead of raising [{source}]. Move it to "
    "the device ({argument}.to(device)) or pass a Python number."
)


# aten/src/ATen/mps/EmptyTensor.cpp, empty_mps (TORCH_CHECK_TYPE).
BFLOAT16_MACOS = "MPS BFloat16 is only supported on MacOS 14 or newer"


# torch/csrc/utils/tensor_numpy.cpp, tensor_to_numpy (TypeError).
TO_NUMPY = (
    "can't convert mps:0 device type tensor to numpy. Use Tensor.cpu() to copy "
    "the tensor to host memory first."
)


# aten/src/ATen/core/Generator.h, check_generator.
GENERATOR = "Expected a '{want}' device type for generator but found '{found}'"


def same_gpu(where: str, arguments: Sequence[tuple[str, bool]]) -> str:
    """CheckAllSameGPU's text: the first argument against each other one.

    ``arguments`` are (label, on the CPU) pairs, in the kernel's order
    (``argument #2 'mat2'``); with none on the CPU the kernel gets as far as
    the Placeholder, whose text is returned. checkSameGPU says "it" whichever
    of the two is on the CPU.
    """
    first, first_cpu = arguments[0]
    for other, other_cpu in arguments[1:]:
        if first_cpu or other_cpu:
            text = "".join(
                f"Tensor for {label} is on CPU, "
                for label, cpu in ((first, first_cpu), (other, other_cpu))
                if cpu
            )
            return (
                f"{text}but expected it to be on GPU (while checking arguments "
                f"for {where})"
            )
    return PLACEHOLDER
