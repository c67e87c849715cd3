"""Device hygiene of the training step, checked by pytest-mps's watchers.

Run on a Mac with `pytest --mps`: pyproject.toml sets `mps_fallback = "error"`, so
any op that falls back to the CPU fails its test.
"""

import pytest
import torch
from pytest_mps import assert_on_device

from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.train import train_step
from {{ cookiecutter.package_name }}.trainer import Trainer, setup


@pytest.fixture
def trainer(small_config) -> Trainer:
    """A Trainer that has taken one step, so later steps run in steady state."""
    t = setup(replace(small_config, gradient_accumulation_steps=2), log=lambda _: None)
    train_step(t)
    return t


@pytest.mark.no_mixed_devices
def test_a_training_step_keeps_every_op_on_the_device(trainer):
    # no_mixed_devices fails the test at any op that mixes devices, such as a CPU
    # tensor left in GPU math; with mps_fallback = "error" an op falling back to
    # the CPU fails it on MPS. (The CPU seed and offset that the fused attention
    # backward takes on CUDA are expected, and pytest-mps exempts them.)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    loss = train_step(trainer)
    assert torch.isfinite(loss).item()
    assert all(
        not torch.equal(a, b)
        for a, b in zip(before, trainer.model.parameters(), strict=True)
    )


@pytest.mark.no_host_sync
def test_training_steps_never_wait_on_the_device(trainer):
    # No .item(), no printing: the loop reads the loss only at log steps.
    losses = [train_step(trainer) for _ in range(3)]
    # not `loss.device == runtime.device`: a Mac's tensors say mps:0, and
    # torch.device("mps:0") != torch.device("mps") (found by --mps-emulate)
    assert_on_device(losses, trainer.runtime.device)


def test_a_training_step_is_timed_on_the_device(mps_benchmark, trainer):
    loss = mps_benchmark(train_step, trainer)
    assert_on_device(loss, trainer.runtime.device)
