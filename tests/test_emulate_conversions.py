"""Conversions of device tensors behave as on a Mac under --mps-emulate.

``as_tensor``/``asarray``/``tensor`` with ``device="cpu"`` copy to the host;
``type_as`` takes the other tensor's device; ``new_*`` take the device of
self; a ``__torch_function__`` class that holds device tensors (kornia's
``TensorWrapper``) gets results on the device, and prints them as such.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = """
import torch, pytest
D="mps"
def test_as_tensor_cpu():
    t = torch.ones(2, device=D)
    for f in (torch.as_tensor, torch.asarray, torch.tensor):
        c = f(t, device="cpu"); assert c.device.type == "cpu", f
        c + torch.ones(2)
    assert torch.as_tensor(t).device.type == "mps"
    assert torch.asarray(t, device="cpu", copy=False).device.type == "cpu"
    assert torch.as_tensor(t, dtype=torch.float16).device.type == "mps"
def test_type_as():
    c = torch.ones(2); m = torch.ones(2, device=D, dtype=torch.float16)
    assert c.type_as(m).device.type == "mps" and c.type_as(m).dtype == torch.float16
    assert m.type_as(c).device.type == "cpu"
    assert c.type(m.type()).device.type == "mps"
def test_new():
    c = torch.ones(2); m = torch.ones(2, device=D)
    assert c.new_tensor(m).device.type == "cpu"
    assert m.new_tensor([1.0]).device.type == "mps"
    assert m.new_zeros(3).device.type == "mps"
    assert c.new_zeros(3).device.type == "cpu"
    assert c.new_tensor(m, device=D).device.type == "mps"
class W:
    def __init__(s,d): s._data=d
    def __repr__(s): return f"W({s._data})"
    @classmethod
    def __torch_function__(c,f,types,a=(),k=None):
        out = f(*[x._data if isinstance(x,W) else x for x in a], **(k or {}))
        return W(out) if isinstance(out, torch.Tensor) else out
def test_wrapper():
    w = W(torch.ones(2, device=D))
    r = torch.add(w, 1)
    assert r._data.device.type == "mps"
    assert "device='mps:0'" in repr(w)
    assert f"{torch.ones(2, device=D)}".endswith("device='mps:0')")
def test_wrapper_beside_device_tensors():
    # kornia's Se3: a device tensor (an nn.Parameter) + a TensorWrapper
    p = torch.nn.Parameter(torch.ones(2, device=D))
    for r in (torch.add(p, W(torch.ones(2, device=D))), torch.mul(W(p), p)):
        assert r._data.device.type == "mps"
"""


def test_conversions_and_tensor_likes_follow_the_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(USER_TESTS)
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)
