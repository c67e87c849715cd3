"""--train_graph: training steps recorded once as a CUDA graph and replayed."""

import pytest
import torch

from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.errors import DeviceError
from {{ cookiecutter.package_name }}.optim import lr_at, make_capturable, set_lr
from {{ cookiecutter.package_name }}.train import train_step
from {{ cookiecutter.package_name }}.train_graph import EAGER_STEPS, refusal
from {{ cookiecutter.package_name }}.trainer import setup


def test_each_reason_a_graph_cannot_run_is_named():
    cuda = torch.device("cuda")
    assert refusal("false", torch.device("cpu"), True, 4, True) is None
    assert refusal("true", cuda, False, 1, False) is None
    assert "needs a CUDA device; this run is on cpu" in refusal(
        "true", torch.device("cpu"), False, 1, False
    )
    assert "--compile=false" in refusal("true", cuda, True, 1, False)
    assert "this run has 2" in refusal("true", cuda, False, 2, False)
    assert "--dtype=bfloat16" in refusal("true", cuda, False, 1, True)


def test_setup_refuses_a_train_graph_it_cannot_run_and_defaults_to_none(
    small_config, device
):
    assert setup(small_config, log=lambda _: None).graphed_step is None
    if device.type != "cuda":
        with pytest.raises(DeviceError, match=r"--train_graph=true needs a CUDA"):
            setup(replace(small_config, train_graph="true"), log=lambda _: None)


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_device_learning_rates_step_as_the_python_numbers_do(
    small_config, device, optimizer
):
    # make_capturable moves the schedule's values onto the device: the same
    # updates, read from tensors a graph can replay
    cfg = replace(small_config, optimizer=optimizer, dropout=0.0)
    plain = setup(cfg, log=lambda _: None)
    tensors = setup(cfg, log=lambda _: None)
    make_capturable(tensors.optimizer, device)
    groups = tensors.optimizer.param_groups
    assert all(isinstance(g["lr"], torch.Tensor) for g in groups)
    # On CUDA, Muon's bfloat16 Newton-Schulz iteration magnifies a last-bit
    # difference in its input (the directions of tiny singular values grow by
    # about 3.4**5): after the first step the two runs drift apart by whole
    # updates, as any two roundings would. The CPU's float32 stays close.
    steps = 5 if device.type == "cpu" else 1
    for it in range(steps):
        for t in (plain, tensors):
            set_lr(t.optimizer, lr_at(cfg, it))
            train_step(t)
    for a, b in zip(plain.model.parameters(), tensors.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    lrs = [float(g["lr"]) for g in tensors.optimizer.param_groups]
    assert lrs == pytest.approx([g["lr"] for g in plain.optimizer.param_groups])


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_graphed_steps_train_as_the_eager_ones(small_config, device, optimizer):
    if device.type != "cuda":
        pytest.skip("CUDA graphs are recorded on CUDA devices only")
    cfg = replace(small_config, optimizer=optimizer, dropout=0.0,
                  gradient_accumulation_steps=2)  # fmt: skip
    eager = setup(cfg, log=lambda _: None)
    make_capturable(eager.optimizer, device)  # the same update, in numbers
    graphed = setup(replace(cfg, train_graph="true"), log=lambda _: None)
    assert graphed.graphed_step is not None
    steps = EAGER_STEPS + 4  # the eager steps, the recording, three replays
    for it in range(steps):
        set_lr(eager.optimizer, lr_at(cfg, it))
        set_lr(graphed.optimizer, lr_at(cfg, it))
        want = train_step(eager).item()
        got = graphed.graphed_step(graphed, train_step).item()
        assert got == pytest.approx(want, rel=1e-4), it
    assert graphed.graphed_step.graph is not None
    for a, b in zip(eager.model.parameters(), graphed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
