"""Shared fixtures: a small configuration on the test's device, prepared data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package_name }}.config import Config, replace
from {{ cookiecutter.package_name }}.data import prepare


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded corpus prepared once, character-level, for the whole session."""
    folder = tmp_path_factory.mktemp("data")
    prepare(
        replace(Config.for_preset("tiny"), data_dir=str(folder)), log=lambda _: None
    )
    return folder


@pytest.fixture
def small_config(tmp_path: Path, data_dir: Path, device: torch.device) -> Config:
    """A 2-layer, 32-wide model that trains in milliseconds per step on a CPU."""
    return replace(
        Config.for_preset("tiny"),
        data_dir=str(data_dir),
        out_dir=str(tmp_path / "out"),
        n_layer=2,
        n_head=2,
        n_embd=32,
        block_size=32,
        batch_size=8,
        max_iters=8,
        warmup_iters=2,
        eval_interval=1000,
        eval_iters=2,
        log_interval=1,
        device=str(device),
        dtype="float32",
        compile="false",
        plot=False,
    )
