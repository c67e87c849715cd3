"""--train_graph: training steps recorded once as a CUDA graph and replayed."""

import pytest
import torch

from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.errors import DeviceError
from {{ cookiecutter.package_name }}.optim import (
    MuonAdamW,
    lr_at,
    make_capturable,
    portable_state,
    set_lr,
)
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


def test_setup_graphs_steps_where_it_can(small_config, device):
    # small_config is uncompiled, one process, float32: auto graphs on CUDA only
    auto = setup(small_config, log=lambda _: None).graphed_step
    assert (auto is not None) == (device.type == "cuda")
    off = replace(small_config, train_graph="false")
    assert setup(off, log=lambda _: None).graphed_step is None


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_device_learning_rates_step_as_the_python_numbers_do(
    small_config, device, optimizer
):
    # make_capturable moves the schedule's values onto the device: the same
    # updates, read from tensors a graph can replay
    cfg = replace(small_config, optimizer=optimizer, dropout=0.0, train_graph="false")
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
    want = [g["lr"] for g in plain.optimizer.param_groups]
    assert [float(g["lr"]) for g in groups] == pytest.approx(want)


def test_a_checkpoint_holds_numbers_where_the_run_kept_tensors(small_config, device):
    cfg = replace(small_config, optimizer="muon")
    t = setup(cfg, log=lambda _: None)
    make_capturable(t.optimizer, device)
    set_lr(t.optimizer, 0.01)
    train_step(t)
    saved = portable_state(t.optimizer)
    assert [g["lr"] for g in saved["param_groups"]] == pytest.approx(
        [0.01 * g["lr_scale"] for g in t.optimizer.param_groups]
    )
    assert all(isinstance(g["lr"], float) for g in saved["param_groups"])
    # a run without graphs (here, on the CPU) takes it up and steps on
    again = setup(replace(cfg, device="cpu", train_graph="false"), log=lambda _: None)
    assert isinstance(again.optimizer, MuonAdamW)
    again.optimizer.load_state_dict(saved)
    set_lr(again.optimizer, 0.01)
    before = [p.detach().clone() for p in again.model.parameters()]
    train_step(again)
    after = again.model.parameters()
    assert all(not torch.equal(a, p) for a, p in zip(before, after, strict=True))


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_graphed_steps_train_as_the_eager_ones_where_graphs_run(
    small_config, device, optimizer
):
    if device.type != "cuda":
        # no graphs to record: true is refused by name, before any training
        with pytest.raises(DeviceError, match=r"--train_graph=true needs a CUDA"):
            setup(replace(small_config, train_graph="true"), log=lambda _: None)
        return
    cfg = replace(small_config, optimizer=optimizer, dropout=0.0,
                  gradient_accumulation_steps=2, train_graph="false")  # fmt: skip
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
