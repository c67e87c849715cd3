"""torch.compile's caches live in the run folder, so a second run starts warm."""

import os
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }} import compile_cache


def test_the_cache_goes_into_out_dir_and_a_second_run_finds_it_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(compile_cache.VARIABLE, raising=False)
    folder, warm = compile_cache.use(str(tmp_path / "out"))
    assert folder == tmp_path / "out" / compile_cache.FOLDER
    assert not warm
    said = compile_cache.describe(folder, warm)
    assert said.endswith("(cold: the first compile here takes a while)")
    assert os.environ[compile_cache.VARIABLE] == str(folder)
    # what inductor leaves there after a compile
    (folder / "fxgraph").mkdir(parents=True)
    monkeypatch.delenv(compile_cache.VARIABLE)
    again, warm = compile_cache.use(str(tmp_path / "out"))
    assert (again, warm) == (folder, True)
    said = compile_cache.describe(again, warm)
    assert said.endswith("(warm: compiled code from an earlier run)")


def test_a_cache_folder_the_user_chose_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "my-cache"
    monkeypatch.setenv(compile_cache.VARIABLE, str(mine))
    folder, warm = compile_cache.use(str(tmp_path / "out"))
    assert (folder, warm) == (mine, False)
    assert os.environ[compile_cache.VARIABLE] == str(mine)
    assert not (tmp_path / "out").exists()


def test_compile_workers_start_before_the_first_compile_where_triton_compiles():
    import importlib.util

    from torch._inductor import async_compile

    # PyTorch keeps a pool of worker processes for Triton's kernels, where
    # Triton is installed (CUDA builds) and it compiles in several processes;
    # elsewhere starting them early starts nothing
    expected = (
        importlib.util.find_spec("triton") is not None
        and async_compile.get_compile_threads() > 1
    )
    assert compile_cache.start_workers()
    assert bool(getattr(async_compile, "_pool_set", ())) == expected


@pytest.mark.parametrize("device_type", ["mps", "cuda", "cpu"])
def test_layout_optimisation_is_off_for_mps_only(
    device_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._inductor.config as inductor_config

    monkeypatch.delenv(compile_cache.LAYOUT_VARIABLE, raising=False)
    # inductor's config module: its own patch() puts the value back after
    with inductor_config.patch(layout_optimization=True):
        turned_off = compile_cache.keep_layouts(device_type)
        assert turned_off == (device_type == "mps")
        assert inductor_config.layout_optimization is (device_type != "mps")


def test_layout_optimisation_the_user_set_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._inductor.config as inductor_config

    monkeypatch.setenv(compile_cache.LAYOUT_VARIABLE, "1")
    with inductor_config.patch(layout_optimization=True):
        assert not compile_cache.keep_layouts("mps")
        assert inductor_config.layout_optimization is True
