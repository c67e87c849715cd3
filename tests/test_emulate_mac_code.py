"""Correct Mac code runs under ``--mps-emulate``: no false alarms (issue 39).

Each test here is a class of code that a Mac runs and that the emulation once
failed on real suites (kornia, accelerate, nanochat): the user's file is run
under ``--mps-emulate`` and every test in it must pass, with the CPU's numbers
where numbers are compared. The classes a Mac runs that the emulation still
cannot are listed in docs/emulation.md.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

MAC_CODE = """
import pytest
import torch
import torch.nn as nn

DEV = "mps"


def on_device(t):
    return t.device.type == DEV


def test_lazy_conj_bit_is_applied():
    a = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    b = torch.tensor([2 - 1j, 1 + 1j], dtype=torch.complex64)
    got = a.to(DEV) * torch.conj(b.to(DEV))
    assert on_device(got)
    assert torch.equal(got.cpu(), a * torch.conj(b))
    assert torch.equal((-b.to(DEV).conj()).cpu(), -b.conj())


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("unsqueeze_", (0,)),
        ("squeeze_", ()),
        ("t_", ()),
        ("transpose_", (0, 1)),
        ("swapdims_", (0, 1)),
        ("resize_", ((2, 3),)),
        ("as_strided_", ((3, 2), (1, 3))),
    ],
)
def test_in_place_metadata_ops_change_the_shape(op, args):
    host = torch.arange(6.0).reshape(1, 6)
    device = host.to(DEV)
    getattr(host, op)(*args)
    getattr(device, op)(*args)
    assert (device.shape, device.stride()) == (host.shape, host.stride())
    assert torch.equal(device.cpu(), host)


def test_set_takes_the_other_tensors_data():
    x = torch.zeros(4, device=DEV)
    x.set_(torch.ones(2, device=DEV))
    assert x.shape == (2,) and x.sum().item() == 2


def test_storage_pointers_as_safetensors_reads_them():
    t = torch.ones(2, 3, device=DEV)
    view = t[1]
    storage = t.untyped_storage()
    assert storage.nbytes() == 24 and storage.data_ptr() != 0
    assert view.untyped_storage().data_ptr() == storage.data_ptr()
    assert view.data_ptr() == t.data_ptr() + 12


def test_module_moves_while_a_hook_holds_its_parameters():
    m = nn.Linear(2, 2).to(DEV)
    held = [m.weight, m.weight, m.bias]  # an offload hook keeps references
    expected = m.weight.detach().cpu()
    m.to("cpu")
    assert m.weight.device.type == "cpu" and torch.equal(m.weight.detach(), expected)
    m.to(DEV)
    assert on_device(m.weight) and len(held) == 3


def test_data_assignment_while_referenced_keeps_the_parameter():
    p = nn.Parameter(torch.zeros(2, 3, device=DEV))
    refs = [p, p, p]
    p.data = torch.ones(3, 2, device=DEV)
    assert refs[0] is p and p.shape == (3, 2) and p.sum().item() == 6


def test_tensor_built_from_device_scalars():
    one = torch.ones((), device=DEV)
    t = torch.tensor((torch.cos(one), torch.sin(one), 0.0), device=DEV)
    assert on_device(t)
    one = torch.ones(())
    assert torch.equal(t.cpu(), torch.tensor((torch.cos(one), torch.sin(one), 0.0)))


def test_to_meta_leaves_the_device():
    t = torch.ones(3, device=DEV)
    assert t.to("meta").device.type == "meta"
    m = nn.Linear(2, 2).to(DEV).to("meta")
    assert m.weight.device.type == "meta"


def test_a_view_of_a_device_buffer_in_inference_mode():
    cache = torch.arange(16.0, device=DEV).reshape(4, 4)
    with torch.inference_mode():
        window = cache[:, :2]
        out = window * 2
    assert on_device(out)
    assert torch.equal(out.cpu(), torch.arange(16.0).reshape(4, 4)[:, :2] * 2)


def test_compile_gives_a_compiled_module():
    m = nn.Linear(2, 2).to(DEV)
    with pytest.warns(UserWarning, match="runs the function eagerly"):
        compiled = torch.compile(m)
    assert compiled._orig_mod is m
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert list(compiled.state_dict()) == ["_orig_mod.weight", "_orig_mod.bias"]
    x = torch.ones(1, 2, device=DEV)
    assert torch.equal(compiled(x).cpu(), m(x).cpu())


def test_dtype_round_trip_of_a_module():
    m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).to(DEV)
    m.half().float()
    assert m[0].weight.dtype == torch.float32 and on_device(m[0].weight)


def test_torchscript_that_picks_a_dtype_by_the_device():
    # kornia's _torch_solve_cast: float64 except on mps. Under the emulation
    # TorchScript sees the CPU and picks float64, which is not judged there.
    @torch.jit.script
    def total(a: torch.Tensor) -> torch.Tensor:
        dtype = torch.float32 if a.device.type == "mps" else torch.float64
        return a.to(dtype).sum().to(a.dtype)

    assert total(torch.ones(3, device=DEV)).cpu().item() == 3.0


def test_a_bare_device_index_is_the_accelerator():
    assert torch.device(0) == torch.device("mps", 0)
    assert isinstance(torch.device(0), torch.device)
    assert torch.ones(2, device=torch.device(0)).is_mps


def test_devices_pickle_as_pytorchs():
    import pickle

    d = pickle.loads(pickle.dumps(torch.device(DEV, 0)))
    assert d == torch.device(DEV, 0) and type(d) is type(torch.ones(1).device)
    assert pickle.loads(pickle.dumps(torch.device)) is torch.device


def test_a_parameter_rebuilt_from_its_type():
    # accelerate's set_module_tensor_to_device, transformers' loading
    m = nn.Linear(2, 2).to(DEV)
    param_cls = type(m.weight)
    for value in (torch.zeros(2, 2, device="meta"), torch.ones(2, 2, device=DEV)):
        rebuilt = param_cls(value, requires_grad=False)
        assert isinstance(rebuilt, nn.Parameter) and not rebuilt.requires_grad
        assert rebuilt.device.type == value.device.type


def test_a_lazy_module_moves_before_its_first_call():
    import copy

    # a lazy layer before an initialized one: deepcopy's memo then holds the
    # uninitialized parameters while the initialized ones are copied
    m = nn.Sequential(nn.LazyLinear(4), nn.Linear(4, 2)).to(DEV)
    assert m[0].has_uninitialized_params() and m[0].weight.device.type == DEV
    twin = copy.deepcopy(m)
    assert twin[0].weight.device.type == DEV
    x = torch.ones(2, 3, device=DEV)
    assert on_device(m(x)) and m[0].weight.shape == (4, 3) and on_device(m[0].weight)
    assert isinstance(m[0].weight, nn.Parameter) and m[0].weight.requires_grad
    assert on_device(twin(x)) and on_device(twin[0].weight)


def test_torchscript_makes_tensors_on_its_inputs_device():
    # TorchScript's x.device is the C++ device (the CPU) under the emulation:
    # the tensor it makes there is not judged, as a Mac makes it on mps
    @torch.jit.script
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(2, device=x.device) + x

    out = f(torch.ones(2, device=DEV))
    assert on_device(out) and out.cpu().tolist() == [1.0, 1.0]
"""


def test_correct_mac_code_runs_emulated(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mac_code=MAC_CODE)
    result = pytester.runpytest_subprocess("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=23)


def test_the_same_code_runs_on_the_cpu(pytester: pytest.Pytester) -> None:
    # the corpus is correct code: on the CPU (no emulation) it passes too,
    # the device-specific classes aside
    pytester.makepyfile(test_mac_code=MAC_CODE.replace('DEV = "mps"', 'DEV = "cpu"'))
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-k",
        "not compile and not bare_device_index",
    )
    result.assert_outcomes(passed=21, deselected=2)
