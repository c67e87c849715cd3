"""Backward on the emulated device: Python that autograd runs sees the device.

A custom ``autograd.Function.backward``, a tensor hook and a module backward
hook each read their gradients as mps, and a float64 cast there fails as on a
Mac; ``torch.autograd.grad`` gives each gradient its input's device; a
backward of host tensors alone (a float64 ``gradcheck``) stays the CPU's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_mps.emulate.install import Emulation

MPS = torch.device("mps", 0)
FLOAT64 = "Cannot convert a MPS Tensor to float64 dtype"


class Doubled(torch.autograd.Function):
    seen: list[Any] = []
    cast = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        Doubled.seen.append((grad.device, x.device, grad.is_mps))
        if Doubled.cast:
            grad = grad.double()
        return grad * 2


def test_a_custom_function_backward_sees_the_device(emulated: Emulation) -> None:
    Doubled.seen, Doubled.cast = [], False
    x = torch.ones(3, device="mps", requires_grad=True)
    Doubled.apply(x).sum().backward()
    assert Doubled.seen == [(MPS, MPS, True)]
    assert x.grad is not None and x.grad.device == MPS
    assert x.grad.cpu().tolist() == [2.0, 2.0, 2.0]
    Doubled.cast = True
    with pytest.raises(TypeError, match=FLOAT64):
        Doubled.apply(x).sum().backward()


def test_a_tensor_hook_sees_the_device(emulated: Emulation) -> None:
    seen = []
    x = torch.ones(3, device="mps", requires_grad=True)
    y = x * 3
    y.register_hook(lambda g: seen.append(g.device))
    y.sum().backward()
    assert seen == [MPS]
    z = x * 3
    z.register_hook(lambda g: g.double())
    with pytest.raises(TypeError, match=FLOAT64):
        z.sum().backward()


def test_a_module_backward_hook_sees_the_device(emulated: Emulation) -> None:
    seen = []
    model = torch.nn.Linear(3, 2).to("mps")

    def hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        seen.append((grad_input[0].device, grad_output[0].device))

    handle = model.register_full_backward_hook(hook)
    x = torch.ones(4, 3, device="mps", requires_grad=True)
    model(x).sum().backward()
    assert seen == [(MPS, MPS)]
    handle.remove()
    model.register_full_backward_pre_hook(lambda m, g: (g[0].double(),))
    with pytest.raises(TypeError, match=FLOAT64):
        model(x).sum().backward()


def test_autograd_grad_follows_its_inputs(emulated: Emulation) -> None:
    x = torch.ones(2, device="mps", requires_grad=True)
    (gx,) = torch.autograd.grad((x * x).sum(), x)
    assert gx.device == MPS
    host = torch.ones(2, requires_grad=True)
    (gh,) = torch.autograd.grad((host * host).sum(), host)
    assert gh.device.type == "cpu"


def test_a_cpu_float64_gradcheck_passes(emulated: Emulation) -> None:
    a = torch.ones(2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: (t * t).sum(), (a,))


def test_a_cpu_backward_is_left_alone(emulated: Emulation) -> None:
    seen = []
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: seen.append((g.device.type, g.double().dtype)))
    y.sum().backward()
    assert seen == [("cpu", torch.float64)]


def test_functorch_transforms_of_device_tensors_run(emulated: Emulation) -> None:
    jacobian = torch.func.jacfwd(torch.sin)(torch.zeros(3, device="mps"))
    assert torch.equal(jacobian.cpu(), torch.eye(3))


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_recomputes_on_the_device(
    emulated: Emulation, reentrant: bool
) -> None:
    from torch.utils.checkpoint import checkpoint

    x = torch.tensor([0.5, 1.5], device="mps", requires_grad=True)
    out = checkpoint(lambda t: t.sin().cos().exp(), x, use_reentrant=reentrant)
    assert out is not None
    out.sum().backward()
    assert x.grad is not None and x.grad.device == MPS
    plain = torch.tensor([0.5, 1.5], requires_grad=True)
    plain.sin().cos().exp().sum().backward()
    assert plain.grad is not None
    torch.testing.assert_close(x.grad.cpu(), plain.grad)


def test_a_dispatch_mode_sees_a_device_backward_through(emulated: Emulation) -> None:
    # FlopCounterMode (and any op logger) runs each aten op from Python: the
    # engine's gradients then meet the device's saved tensors in the mode
    from torch.utils.flop_counter import FlopCounterMode

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    model = model.to("mps")
    x = torch.randn(4, 16, device="mps", requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    # forward addmm 2*4*16*16, backward two mms of the same size
    assert counter.get_total_flops() == 3 * 2 * 4 * 16 * 16
    assert x.grad is not None and x.grad.device == MPS
    assert model[0].weight.grad is not None and model[0].weight.grad.device == MPS
