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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_plugin_marker(name, *args, **kwargs): apply pytest-mps's marker `name`"
        " when the installed plugin registers it; skip the test otherwise.",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    # Some device-hygiene markers arrive in later pytest-mps releases; a test that
    # needs one runs under it when it exists and is skipped, saying why, until then.
    registered = {
        line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")
    }
    for item in items:
        for mark in item.iter_markers("needs_plugin_marker"):
            name, *args = mark.args
            if name in registered:
                item.add_marker(getattr(pytest.mark, name)(*args, **mark.kwargs))
            else:
                reason = f"the installed pytest-mps has no {name!r} marker yet"
                item.add_marker(pytest.mark.skip(reason=reason))
