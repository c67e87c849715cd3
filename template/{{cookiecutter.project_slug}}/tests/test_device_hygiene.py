"""Device hygiene of the training step, checked by pytest-mps's watchers.

Run on a Mac with `pytest --mps`: pyproject.toml sets `mps_fallback = "error"`, so
any op that falls back to the CPU fails its test. Each test is skipped, with the
reason, where the installed pytest-mps lacks what it needs.
"""

import pytest
import torch

from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.train import Trainer, setup, train_step


@pytest.fixture
def trainer(small_config) -> Trainer:
    """A Trainer that has taken one step, so later steps run in steady state."""
    t = setup(replace(small_config, gradient_accumulation_steps=2), log=lambda _: None)
    train_step(t)
    return t


def test_a_training_step_keeps_every_op_on_the_device(trainer):
    # With mps_fallback = "error" (pyproject.toml) an op falling back to the CPU
    # fails this test on MPS. (no_mixed_devices is not used: on CUDA it flags
    # the CPU philox seed/offset scalars that PyTorch's memory-efficient
    # attention backward takes by design.)
    pytest.importorskip(
        "pytest_mps.watch.fallback", reason="pytest-mps has no fallback watch"
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    loss = train_step(trainer)
    assert torch.isfinite(loss).item()
    assert all(
        not torch.equal(a, b)
        for a, b in zip(before, trainer.model.parameters(), strict=True)
    )


@pytest.mark.needs_plugin_marker("no_host_sync")
def test_training_steps_never_wait_on_the_device(trainer):
    # No .item(), no printing: the loop reads the loss only at log steps.
    losses = [train_step(trainer) for _ in range(3)]
    assert all(loss.device == trainer.runtime.device for loss in losses)


def test_training_step_benchmark(request, trainer):
    try:
        benchmark = request.getfixturevalue("mps_benchmark")
    except pytest.FixtureLookupError:
        pytest.skip("the installed pytest-mps has no mps_benchmark fixture")
    loss = benchmark(train_step, trainer)
    assert loss.device == trainer.runtime.device
