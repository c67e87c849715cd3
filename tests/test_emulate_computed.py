"""Calls the emulation computes as the Mac's kernel does (emulate/computed.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from pytest_mps.emulate.install import Emulation

CL3D = torch.channels_last_3d


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
