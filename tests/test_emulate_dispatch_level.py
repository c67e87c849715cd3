"""An op is judged where a Mac dispatches it, never inside the CPU's kernel.

``torch.linalg.solve`` reaches ``aten::_linalg_solve_ex``; the CPU's kernel
for it calls ``linalg_lu_factor_ex`` and ``linalg_lu_solve``, a Mac's MPS
kernel (where the installed torch has one) calls neither. So the emulation
must refuse ``_linalg_solve_ex`` where its MPS kernel is missing, and never
``linalg_lu_solve`` on the way. Backward formulas call ops as a Mac's
autograd does (``linalg_solve``'s backward calls ``linalg_lu_solve``). The
expectations come from the installed torch's ``native_functions.yaml`` (the
op table), so the same tests hold on every torch the project allows.
"""

from __future__ import annotations

import pytest

from pytest_mps import ops

pytest_plugins = ["pytester"]


def _has_kernel(name: str) -> bool:
    return ops.load_table().predict(name).outcome not in (
        ops.FALLBACK,
        ops.FORCED_FALLBACK,
    )


HEADER = """
import pytest
import torch

D = "mps"


def well_posed(n=3):
    return torch.randn(n, n, device=D) + 3 * torch.eye(n, device=D)


def refused(op):
    return pytest.raises(
        NotImplementedError,
        match=rf"^The operator 'aten::{op}' is not currently implemented",
    )
"""


def _expect(op: str) -> str:
    """The test line: the call runs where MPS has ``op``, else it is refused."""
    return "" if _has_kernel(f"aten::{op}") else f"with refused({op!r}):"


@pytest.mark.parametrize(
    ("call", "op"),
    [
        (
            "torch.linalg.solve(well_posed(), torch.randn(3, 2, device=D))",
            "_linalg_solve_ex",
        ),
        (
            "torch.linalg.solve_ex(well_posed(), torch.randn(3, device=D))",
            "_linalg_solve_ex",
        ),
        ("torch.linalg.inv(well_posed())", "linalg_inv_ex"),
        ("torch.linalg.inv_ex(well_posed())", "linalg_inv_ex"),
        ("torch.inverse(well_posed())", "linalg_inv_ex"),
        ("well_posed().inverse()", "linalg_inv_ex"),
        # a functional op: its autograd kernel skips ADInplaceOrView, so
        # only a mark at the autograd key tells that it came from the top
        ("torch.linalg.eigvals(well_posed())", "_linalg_eigvals"),
    ],
)
def test_an_op_is_judged_by_its_own_kernel_not_by_what_the_cpu_kernel_calls(
    pytester: pytest.Pytester, call: str, op: str
) -> None:
    expect = _expect(op)
    body = (
        f"{expect}\n        {call}"
        if expect
        else f"out = {call}\n    assert torch.as_tensor(out[0]).device.type == 'mps'"
    )
    pytester.makepyfile(HEADER + f"\n\ndef test_it():\n    {body}\n")
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*linalg_lu_solve*")


@pytest.mark.parametrize(
    ("call", "op"),
    [
        # logspace's CompositeExplicitAutograd kernel calls logspace.out
        ("torch.logspace(0, 1, 5, device=D)", "logspace.out"),
        ("torch.logspace(torch.tensor(0.0, device=D), 1, 5, device=D)", "logspace.out"),
        # linalg_pinv.atol_rtol_tensor's shared kernel calls linalg_eigh
        (
            "torch.linalg.pinv(well_posed() @ well_posed().mT, hermitian=True)",
            "_linalg_eigh",
        ),
    ],
)
def test_what_a_kernel_shared_by_every_backend_calls_is_judged(
    pytester: pytest.Pytester, call: str, op: str
) -> None:
    """A CompositeExplicitAutograd kernel runs on a Mac too, and so do its calls."""
    expect = _expect(op)
    body = (
        f"{expect}\n        {call}"
        if expect
        else f"out = {call}\n    assert out.device.type == 'mps'"
    )
    pytester.makepyfile(HEADER + f"\n\ndef test_it():\n    {body}\n")
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_an_op_called_directly_is_judged_and_so_is_a_backward_formula_calling_it(
    pytester: pytest.Pytester,
) -> None:
    lu_solve = _expect("linalg_lu_solve")
    solve = _expect("_linalg_solve_ex")
    if solve:
        backward = f"{solve}\n        torch.linalg.solve(A, B)"
    elif lu_solve:
        backward = (
            f"x = torch.linalg.solve(A, B)\n    {lu_solve}\n        x.sum().backward()"
        )
    else:
        backward = (
            "torch.linalg.solve(A, B).sum().backward()\n"
            "    assert A.grad.device.type == D"
        )
    pytester.makepyfile(
        HEADER
        + f"""

def test_direct():
    LU, pivots = torch.linalg.lu_factor(torch.randn(3, 3, device=D))
    {lu_solve or "if True:"}
        torch.linalg.lu_solve(LU, pivots, torch.randn(3, 2, device=D))


def test_backward():
    A = well_posed().requires_grad_()
    B = torch.randn(3, 2, device=D)
    {backward}
"""
    )
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_an_out_argument_keeps_its_version_counter_once_the_rules_are_registered(
    pytester: pytest.Pytester,
) -> None:
    """The rules' marker takes the place of PyTorch's autograd kernel for the
    CPU for the whole process: an out= call must still bump the version, or
    autograd would miss an in-place change to a saved tensor."""
    pytester.makepyfile(
        HEADER
        + """

def test_device_first():
    torch.linalg.lu_factor(torch.randn(3, 3, device=D))


def test_then_the_cpu():
    LU, pivots = torch.linalg.lu_factor(torch.randn(3, 3))
    out = torch.empty(3, 2)
    before = out._version
    torch.linalg.lu_solve(LU, pivots, torch.randn(3, 2), out=out)
    assert out._version == before + 1
    w = torch.randn(3, 2, requires_grad=True)
    saved = out * 1.0
    y = (w * saved).sum()  # saves `saved`
    torch.linalg.lu_solve(LU, pivots, torch.randn(3, 2), out=saved)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
"""
    )
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_a_convolution_is_judged_as_a_convolution_not_by_the_cpus_lowering(
    pytester: pytest.Pytester,
) -> None:
    """The CPU lowers ``convolution`` to ``_slow_conv2d_forward``,
    ``slow_conv_transpose2d``, ``slow_conv_dilated2d``, mkldnn kernels; a Mac
    calls ``_mps_convolution``. No list of lowerings: the marker alone."""
    pytester.makepyfile(
        HEADER
        + """

@pytest.mark.parametrize("module", [
    torch.nn.Conv2d(2, 3, 3),
    torch.nn.Conv2d(2, 2, 3, dilation=2),
    torch.nn.Conv2d(2, 2, 3, groups=2),
    torch.nn.ConvTranspose2d(2, 2, 3, dilation=2),
    torch.nn.Conv1d(2, 2, 3),
])
def test_it(module):
    module = module.to(D)
    x = torch.randn(1, 2, 7, 7, device=D, requires_grad=True)
    if isinstance(module, torch.nn.Conv1d):
        x = torch.randn(1, 2, 7, device=D, requires_grad=True)
    module(x).sum().backward()
    assert x.grad.device.type == "mps"
"""
    )
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)


def test_in_inference_mode_what_a_judged_kernel_calls_is_not_judged(
    pytester: pytest.Pytester,
) -> None:
    """Inference mode skips the autograd keys, so the marker cannot tell a
    nested call there: a convolution's CPU lowering (``_slow_conv2d_forward``,
    no MPS kernel) ran under ``convolution``'s own kernel and was refused, so
    every model evaluated under ``torch.inference_mode()`` failed (kornia's
    XFeat). What a judged op's kernel calls is its own work."""
    pytester.makepyfile(
        HEADER
        + """

@pytest.mark.parametrize("module", [
    torch.nn.Conv2d(3, 4, 3, padding=1),
    torch.nn.Conv2d(8, 2, 1),
    torch.nn.Conv2d(2, 2, 3, dilation=2),
    torch.nn.ConvTranspose2d(2, 2, 3),
])
@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad])
def test_it(module, mode):
    module = module.to(D)
    with mode():
        out = module(torch.randn(1, module.in_channels, 9, 9, device=D))
    assert out.device.type == "mps"


def test_a_refusal_still_holds_in_inference_mode():
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="Convolution is supported only"):
            torch.nn.functional.conv2d(
                torch.ones(1, 1, 3, 3, dtype=torch.int32, device=D),
                torch.ones(1, 1, 1, 1, dtype=torch.int32, device=D),
            )
"""
    )
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
