"""Calls the emulation computes as the Mac's kernel does (emulate/computed.py)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from pytest_mps.audit import kernels
from pytest_mps.emulate.install import Emulation

CL3D = torch.channels_last_3d
MPS = torch.device("mps", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_conv3d_keeps_channels_last_3d_and_the_contiguous_numbers(
    emulated: Emulation, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(16, 32, (1, 3, 3), padding=(0, 1, 1))
    x = torch.randn(2, 16, 8, 16, 16)
    plain = copy.deepcopy(conv).to("mps", dtype)
    last = copy.deepcopy(conv).to("mps", dtype)
    x_plain = x.to("mps", dtype).requires_grad_()
    x_last = x.to("mps", dtype).contiguous(memory_format=CL3D).requires_grad_()

    y_plain, y_last = plain(x_plain), last(x_last)
    assert y_last.device.type == "mps"
    assert y_last.is_contiguous(memory_format=CL3D) and not y_last.is_contiguous()
    torch.testing.assert_close(y_last, y_plain, rtol=0, atol=0)

    grad = torch.randn_like(y_plain)
    y_plain.backward(grad)
    y_last.backward(grad.contiguous(memory_format=CL3D))
    assert x_last.grad is not None and x_plain.grad is not None
    assert x_last.grad.is_contiguous(memory_format=CL3D)
    torch.testing.assert_close(x_last.grad, x_plain.grad, rtol=0, atol=0)
    assert last.weight.grad is not None and plain.weight.grad is not None
    torch.testing.assert_close(last.weight.grad, plain.weight.grad, rtol=0, atol=0)


def test_conv3d_of_a_contiguous_input_is_the_cpus(emulated: Emulation) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 6, 6, 6)
    expected = conv(x)
    got = conv.to("mps")(x.to("mps"))
    assert got.is_contiguous()
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_a_channels_last_3d_weight_gives_a_channels_last_3d_output(
    emulated: Emulation,
) -> None:
    conv = torch.nn.Conv3d(4, 8, 3).to("mps", memory_format=CL3D)
    y = conv(torch.randn(1, 4, 5, 5, 5, device="mps"))
    assert y.is_contiguous(memory_format=CL3D)


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        (torch.int8, torch.int32),
        (torch.int16, torch.int32),
        (torch.int32, torch.int32),
        (torch.int64, torch.int64),
        (torch.float32, torch.float32),
        (torch.float16, torch.float16),
    ],
)
def test_bincount_with_weights_has_the_mps_kernels_dtype(
    emulated: Emulation, weights: torch.dtype, expected: torch.dtype
) -> None:
    x = torch.tensor([0, 1, 1, 1, 4], device="mps", dtype=torch.int32)
    w = torch.tensor([1, 2, 3, 4, 5], device="mps").to(weights)
    counts = torch.bincount(x, w)
    assert counts.dtype == expected and counts.device == MPS
    assert counts.tolist() == [1, 9, 0, 0, 5]
    assert torch.bincount(x).dtype == torch.int64


def test_normal_of_an_integer_dtype_is_a_type_error(emulated: Emulation) -> None:
    with pytest.raises(TypeError, match="^Unsupported type Int for operation normal$"):
        torch.normal(10.0, 11.0, (3, 3), device="mps", dtype=torch.int32)
    with pytest.raises(TypeError, match="Unsupported type Long for operation normal"):
        torch.zeros(3, device="mps", dtype=torch.int64).normal_()


def test_nll_loss_backward_takes_a_float32_total_weight_with_half_input(
    emulated: Emulation,
) -> None:
    inp = torch.rand(5, 5, device="mps", dtype=torch.half)
    label = torch.tensor([-100, -100, 3, -100, -100], device="mps")
    grad_out = torch.ones((), device="mps", dtype=torch.half)
    total = torch.tensor(1.0, device="mps")
    grad = torch.ops.aten.nll_loss_backward(grad_out, inp, label, None, 1, -100, total)
    assert grad.dtype == torch.half and grad.device == MPS
    assert grad[2, 3].item() == -1.0 and grad.abs().sum().item() == 1.0


def test_narrow_copy_is_narrow_then_clone(emulated: Emulation) -> None:
    x = torch.arange(24.0, device="mps").reshape(2, 3, 4)
    copied = torch.narrow_copy(x, 2, 1, 2)
    assert copied.device == MPS and copied.is_contiguous()
    assert torch.equal(copied.cpu(), torch.arange(24.0).reshape(2, 3, 4)[:, :, 1:3])
    assert copied.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be "):
        x.narrow_copy(3, 0, 0)


def _skip_without_an_mps_householder_product() -> None:
    try:
        torch.linalg.householder_product(
            torch.zeros(2, 1, device="mps"), torch.zeros(1, device="mps")
        )
    except NotImplementedError:
        pytest.skip("this torch has no MPS kernel for linalg_householder_product")


def _orgqr_scalar_loops(a: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Metal's ``orgqr`` kernel statement by statement, one element at a time."""
    m, n = a.shape
    dt = a.dtype

    def h(i: int, r: int, c: int) -> torch.Tensor:
        a_c = a[c, i] if c > i else torch.tensor(float(c == i), dtype=dt)
        a_r = a[r, i] if r > i else torch.tensor(float(r == i), dtype=dt)
        return torch.tensor(float(r == c), dtype=dt) - tau[i] * (a_c * a_r)

    prod = [[h(0, r, c) for c in range(m)] for r in range(m)]
    for i in range(1, tau.shape[0]):
        hi = [[h(i, r, c) for c in range(m)] for r in range(m)]
        new = []
        for r in range(m):
            row = []
            for c in range(m):
                acc = torch.tensor(0.0, dtype=dt)
                for j in range(m):
                    acc = acc + prod[r][j] * hi[j][c]
                row.append(acc)
            new.append(row)
        prod = new
    return torch.stack([torch.stack(prod[r][:n]) for r in range(m)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_householder_product_rounds_as_metals_kernel(
    emulated: Emulation, dtype: torch.dtype
) -> None:
    _skip_without_an_mps_householder_product()
    torch.manual_seed(0)
    a, tau = torch.randn(4, 3), torch.rand(3)
    got = torch.linalg.householder_product(a.to("mps", dtype), tau.to("mps", dtype))
    assert got.device == MPS and got.dtype == dtype and got.shape == (4, 3)
    expected = _orgqr_scalar_loops(a.to(dtype), tau.to(dtype))
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    # not the float32 answer rounded once, which the CPU's widening would give
    wide = torch.linalg.householder_product(a, tau).to(dtype)
    assert not torch.equal(got.cpu(), wide)
    torch.testing.assert_close(got.cpu().float(), wide.float(), rtol=0, atol=5e-2)
    assert torch.equal(torch.orgqr(a.to("mps", dtype), tau.to("mps", dtype)), got)


def test_float32_householder_product_is_the_cpus_and_half_has_a_gradient(
    emulated: Emulation,
) -> None:
    _skip_without_an_mps_householder_product()
    torch.manual_seed(0)
    a, tau = torch.randn(2, 5, 3), torch.rand(2, 3)
    got = torch.linalg.householder_product(a.to("mps"), tau.to("mps"))
    torch.testing.assert_close(
        got.cpu(), torch.linalg.householder_product(a, tau), rtol=0, atol=0
    )
    leaf = a.to("mps", torch.float16).requires_grad_()
    torch.linalg.householder_product(
        leaf, tau.to("mps", torch.float16)
    ).sum().backward()
    assert leaf.grad is not None and leaf.grad.device == MPS
    assert leaf.grad.dtype == torch.float16 and bool(leaf.grad.isfinite().all())


_SDPA_DROPOUT = r"^scaled_dot_product_attention for MPS does not support dropout\.$"
sdpa_refuses_dropout = pytest.mark.skipif(
    kernels.torch_release(torch.__version__) < (2, 13),
    reason="MPS's attention kernel refuses dropout from torch 2.13 (pytorch#184126)",
)


@sdpa_refuses_dropout
def test_attention_with_dropout_and_no_gradient_is_refused(emulated: Emulation) -> None:
    q = torch.randn(1, 2, 4, 8, device="mps")
    F = torch.nn.functional
    assert F.scaled_dot_product_attention(q, q, q, dropout_p=0.0).device == MPS
    with pytest.raises(NotImplementedError, match=_SDPA_DROPOUT):
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.2)
    leaf = q.clone().requires_grad_()
    with torch.no_grad(), pytest.raises(NotImplementedError, match=_SDPA_DROPOUT):
        F.scaled_dot_product_attention(leaf, leaf, leaf, None, 0.2)
    # a gradient takes the composite path, which applies dropout
    out = F.scaled_dot_product_attention(leaf, q, q, dropout_p=0.5)
    assert out.device == MPS
    out.sum().backward()
    assert leaf.grad is not None and leaf.grad.device == MPS


class _SelfAttention(torch.nn.Module):
    """Attention as transformers' "sdpa" implementation calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4)
        p = 0.1 if self.training else 0.0
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)


@sdpa_refuses_dropout
def test_a_frozen_attention_layer_training_is_refused(emulated: Emulation) -> None:
    layer = _SelfAttention().to("mps").train()
    x = torch.randn(2, 5, 8, device="mps")
    layer(x).sum().backward()  # trainable: the composite path, with dropout
    layer.requires_grad_(False)
    with pytest.raises(NotImplementedError, match=_SDPA_DROPOUT):
        layer(x)
    assert layer.eval()(x).device == MPS


def test_attention_with_dropout_on_the_host_is_the_cpus(emulated: Emulation) -> None:
    q = torch.randn(1, 2, 4, 8)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert out.device.type == "cpu"


def test_masked_scatter_takes_a_uint8_mask_and_refuses_a_float_one(
    emulated: Emulation,
) -> None:
    source = torch.arange(1.0, 5.0, device="mps")
    x = torch.zeros(4, device="mps")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warning: MPS's kernel has none
        mask = torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device="mps")
        out = x.masked_scatter(mask, source)
        x.masked_scatter_(mask, source)
    assert out.device == MPS and out.tolist() == [1.0, 0.0, 2.0, 0.0]
    assert x.tolist() == out.tolist()
    with pytest.raises(
        RuntimeError,
        match="^masked_scatter: expected BoolTensor or ByteTensor for mask$",
    ):
        x.masked_scatter(torch.ones(4, device="mps"), source)
    # on the host the CPU's rules hold
    with (
        pytest.warns(UserWarning, match="uint8, this behavior is now deprecated"),
        pytest.raises(RuntimeError, match="only supports boolean masks"),
    ):
        torch.zeros(4).masked_scatter(torch.ones(4, dtype=torch.uint8), source.cpu())


@pytest.mark.skipif(
    kernels.torch_release(torch.__version__) < (2, 13),
    reason="torch 2.6's MPS has no grid_sampler_3d and no grid_sampler_2d_backward "
    "(its native_functions.yaml): the emulation refuses them as a Mac does",
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dims", [2, 3])
def test_half_grid_sampling_computes_in_float32(
    emulated: Emulation, dtype: torch.dtype, dims: int
) -> None:
    # test_mps.py's reference: the float32 result rounded once, as MPS's
    # float32 intermediates give it; the CPU's half kernel rounds every step
    torch.manual_seed(0)
    size = (2, 3) + (5,) * dims
    image = torch.randn(size).to(dtype).requires_grad_(True)
    grid = (torch.rand((2,) + (4,) * dims + (dims,)) * 2 - 1).to(dtype)
    on_cpu = torch.nn.functional.grid_sample(image, grid, align_corners=False)
    device_image = image.detach().to("mps").requires_grad_(True)
    out = torch.nn.functional.grid_sample(
        device_image, grid.to("mps"), align_corners=False
    )
    wide = torch.nn.functional.grid_sample(
        image.detach().float(), grid.float(), align_corners=False
    )
    assert out.device.type == "mps" and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), wide.to(dtype), atol=0, rtol=0)
    assert not torch.equal(on_cpu.detach(), out.detach().cpu())
    out.sum().backward()
    assert device_image.grad is not None and device_image.grad.dtype == dtype
