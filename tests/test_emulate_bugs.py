"""The classic Mac bugs, each failing under --mps-emulate with PyTorch's own message.

Each test of the user's file below passes on a plain CPU run, as it does in a
Linux CI without pytest-mps, and fails on a Mac. The messages are PyTorch's:
TensorIterator.cpp (two devices), EmptyTensor.cpp (float64), MPSFallback.mm
(missing op), tensor_numpy.cpp (numpy), Generator.h (generator device).
"""

from __future__ import annotations

import pytest
import torch

pytest_plugins = ["pytester"]

BUGS = """
import numpy as np
import pytest
import torch


def test_a_tensor_made_without_device(device):
    scores = torch.ones(4, device=device)
    positions = torch.arange(4)               # forgot device=
    assert (scores + positions).sum() == 10


def test_a_model_left_on_the_cpu(device):
    model = torch.nn.Linear(4, 2)             # forgot .to(device)
    assert model(torch.ones(3, 4, device=device)).shape == (3, 2)


def test_a_numpy_array_of_float64(device):
    weights = torch.from_numpy(np.linspace(0.0, 1.0, 4)).to(device)
    assert weights.shape == (4,)


def test_an_op_without_an_mps_kernel(device):
    x = torch.full((4,), 0.5, device=device)
    assert torch.special.ndtri(x).abs().max() < 1e-6


def test_numpy_of_a_device_tensor(device):
    logits = torch.ones(2, device=device)
    assert logits.numpy().sum() == 2


def test_a_cpu_generator_for_a_device_factory(device):
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(3, device=device, generator=generator)
    assert noise.shape == (3,)


def test_optimizer_state_loaded_before_the_model_moves(device, tmp_path):
    # a checkpoint written by a CPU run, resumed on the device: the state is
    # loaded (onto the parameters' device, the CPU) before the model moves;
    # map_location would not help: load_state_dict casts to the parameters
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")

    resumed = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(resumed.parameters())
    optimizer.load_state_dict(torch.load(tmp_path / "optimizer.pt"))
    resumed.to(device)
    resumed(torch.ones(1, 4, device=device)).sum().backward()
    optimizer.step()


def test_a_saved_tensor_loaded_without_map_location(device, tmp_path):
    torch.save({"scale": torch.full((4,), 2.0)}, tmp_path / "stats.pt")
    stats = torch.load(tmp_path / "stats.pt")  # forgot map_location=device
    assert (torch.ones(4, device=device) * stats["scale"]).sum() == 8
"""


def test_each_classic_bug_passes_on_a_plain_cpu_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bugs=BUGS)
    result = pytester.runpytest()
    result.assert_outcomes(passed=8)
    assert torch.backends.mps.is_available() is False


def test_each_classic_bug_fails_under_emulation_with_pytorchs_message(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_bugs=BUGS)
    result = pytester.runpytest("--mps-emulate", "--tb=short")
    result.assert_outcomes(failed=8)
    result.stdout.fnmatch_lines(
        [
            "*test_bugs.py:9: in test_a_tensor_made_without_device",
            "E   RuntimeError: Expected all tensors to be on the same device, but "
            "found at least two devices, mps:0 and cpu!",
            "*test_bugs.py:14: in test_a_model_left_on_the_cpu",
            "*",
            "E   RuntimeError: Tensor for argument weight is on cpu but expected on "
            "mps",
            "*test_bugs.py:18: in test_a_numpy_array_of_float64",
            "E   TypeError: Cannot convert a MPS Tensor to float64 dtype as the MPS "
            "framework doesn't support float64. Please use float32 instead.",
            "*test_bugs.py:24: in test_an_op_without_an_mps_kernel",
            "E   NotImplementedError: The operator 'aten::special_ndtri' is not "
            "currently implemented for the MPS device. If you want this op to be "
            "considered for addition please comment on "
            "https://github.com/pytorch/pytorch/issues/141287 *"
            f"commit hash {torch.version.git_version}. As a temporary fix, you can "
            "set the environment variable `PYTORCH_ENABLE_MPS_FALLBACK=1` *",
            "*test_bugs.py:29: in test_numpy_of_a_device_tensor",
            "E   TypeError: can't convert mps:0 device type tensor to numpy. Use "
            "Tensor.cpu() to copy the tensor to host memory first.",
            "*test_bugs.py:34: in test_a_cpu_generator_for_a_device_factory",
            "E   RuntimeError: Expected a 'mps' device type for generator but found "
            "'cpu'",
            "*test_bugs.py:53: in test_optimizer_state_loaded_before_the_model_moves",
            "*optimizer.step()",
            "*",
            "E   RuntimeError: Expected all tensors to be on the same device, but "
            "found at least two devices, cpu and mps:0!",
            "*test_bugs.py:59: in test_a_saved_tensor_loaded_without_map_location",
            "E   RuntimeError: Expected all tensors to be on the same device, but "
            "found at least two devices, mps:0 and cpu!",
        ]
    )
    # the emulation is gone with its session
    assert torch.backends.mps.is_available() is False


def test_the_fallback_variable_lets_a_missing_op_run_as_on_a_mac(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_bugs=BUGS)
    result = pytester.runpytest(
        "--mps-emulate", "--mps-fallback=warn", "-k", "without_an_mps_kernel"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "ops that fell back to the CPU (no MPS kernel):",
            "  aten::special_ndtri: 1 call(s) in 1 test(s)",
        ]
    )
