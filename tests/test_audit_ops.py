"""The MPS op table: each rule on real entries of the installed torch's yaml."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import yaml_gives_mps_kernel
from torchgen.gen import parse_native_yaml

from pytest_mps import ops as mps_ops


@pytest.fixture(scope="module")
def parsed() -> Any:
    yaml_path, tags_path = mps_ops.yaml_paths()
    return parse_native_yaml(str(yaml_path), str(tags_path))


@pytest.fixture(scope="module")
def table() -> mps_ops.OpTable:
    return mps_ops.load_table()


def test_an_op_with_an_explicit_mps_key_has_an_mps_kernel(
    table: mps_ops.OpTable,
) -> None:
    # native_functions.yaml: `add.out` ... dispatch: CPU, CUDA, MPS, ...: add_out
    assert table.codes["add.out"] == "explicit"
    assert table.predict("aten::add.out").outcome == mps_ops.MPS_KERNEL


def test_a_structured_delegate_inherits_the_out_variants_mps_kernel(
    table: mps_ops.OpTable,
) -> None:
    for op in ("aten::add.Tensor", "aten::add_.Tensor", "aten::mm"):
        prediction = table.predict(op)
        assert prediction.outcome == mps_ops.MPS_KERNEL, prediction
        assert "structured_delegate" in prediction.rule
    assert table.predict("aten::add.Tensor").rule == (
        "structured_delegate add.out has an MPS kernel"
    )


def _kernels(parsed: Any, key: str) -> set[str]:
    """Overloads the installed yaml gives a kernel for dispatch key ``key``."""
    from torchgen.model import DispatchKey

    return {str(name) for name in parsed.backend_indices[DispatchKey[key]].index}


def test_linalg_svd_falls_back_exactly_while_its_delegate_has_no_mps_kernel(
    parsed: Any, table: mps_ops.OpTable
) -> None:
    # `_linalg_svd` delegates to `_linalg_svd.U`: CPU, CUDA up to torch 2.13;
    # CPU, CUDA, MPS from 2.14 (native MPS SVD, pytorch PR #185954). The
    # expectation comes from torchgen's own reading of the installed yaml.
    prediction = table.predict("aten::_linalg_svd")
    if "_linalg_svd.U" in _kernels(parsed, "MPS"):
        assert table.codes["_linalg_svd"] == "structured:_linalg_svd.U"
        assert prediction.outcome == mps_ops.MPS_KERNEL
        assert not table.predict("aten::linalg_svd").outcome.endswith("fallback")
        assert any("linalg_svd" in why for why in table.contradictions())
    else:
        assert table.codes["_linalg_svd"] == "none:_linalg_svd.U"
        assert prediction.outcome == mps_ops.FALLBACK
        assert prediction.problem
        assert prediction.rule == (
            "structured_delegate _linalg_svd.U has no MPS kernel"
        )
        assert table.predict("aten::linalg_svd").outcome == mps_ops.FORCED_FALLBACK
        assert table.contradictions() == []


def test_a_structured_delegate_without_mps_makes_its_op_fall_back(
    parsed: Any, table: mps_ops.OpTable
) -> None:
    mps = _kernels(parsed, "MPS")
    # all.dims: a composite kernel beside the delegate, which MPS gets
    composite = set().union(
        *(_kernels(parsed, k) for k in mps_ops.yaml_rules._COMPOSITE_KEYS)
    )
    delegating = {
        str(f.func.name): str(f.structured_delegate)
        for f in parsed.native_functions
        if f.structured_delegate is not None
    }
    lacking = sorted(
        (name, delegate)
        for name, delegate in delegating.items()
        if delegate not in mps and name not in mps and name not in composite
    )
    assert len(lacking) >= 10  # heaviside, adaptive_max_pool3d, ... on 2.13-2.14
    for name, delegate in lacking:
        assert table.codes[name] == f"none:{delegate}"
        prediction = table.predict(f"aten::{name}")
        if prediction.outcome == mps_ops.FALLBACK:
            assert prediction.rule == (
                f"structured_delegate {delegate} has no MPS kernel"
            )
        else:  # routed by device, or an MPS kernel registered from Python
            assert prediction.outcome in (mps_ops.ROUTED, mps_ops.MPS_KERNEL)


def test_a_composite_kernel_beside_a_delegate_without_mps_runs(
    table: mps_ops.OpTable,
) -> None:
    # all.dims delegates to all.dims_out (CPU, CUDA) and also lists
    # CompositeExplicitAutograd all_dims_default: MPS gets the composite
    # (the all and any OpInfos reach it, and PyTorch expects them to work on MPS)
    for op in ("all.dims", "any.dims"):
        assert table.codes[op] == "composite:CompositeExplicitAutograd"
        assert table.predict(f"aten::{op}").outcome == mps_ops.COMPOSITE


def _cpu_and_cuda_only(parsed: Any) -> list[str]:
    """Overloads the installed yaml gives CPU and CUDA kernels and nothing else."""
    others = set().union(
        *(_kernels(parsed, key) for key in ("MPS", *mps_ops.yaml_rules._COMPOSITE_KEYS))
    )
    fixed = {fix.op for fix in mps_ops.CORRECTIONS}
    both = _kernels(parsed, "CPU") & _kernels(parsed, "CUDA")
    return sorted(both - others - fixed)


def test_an_op_with_only_cpu_and_cuda_keys_falls_back(
    parsed: Any, table: mps_ops.OpTable
) -> None:
    only = _cpu_and_cuda_only(parsed)
    assert len(only) > 20
    for name in only:
        assert table.codes[name] == "none", name
    predicted = {table.predict(f"aten::{name}").outcome for name in only}
    assert mps_ops.FALLBACK in predicted
    assert predicted <= {mps_ops.FALLBACK, mps_ops.ROUTED, mps_ops.MPS_KERNEL}


def test_composite_ops_of_all_three_kinds_run_on_any_backend(
    table: mps_ops.OpTable,
) -> None:
    kinds = {
        "aten::dropout": "CompositeImplicitAutograd",
        "aten::_to_copy": "CompositeExplicitAutograd",
        "aten::select_backward": "CompositeExplicitAutogradNonFunctional",
    }
    for op, key in kinds.items():
        prediction = table.predict(op)
        assert prediction.outcome == mps_ops.COMPOSITE
        assert prediction.rule.startswith(key)


def test_an_explicit_mps_key_wins_over_a_composite_one(
    table: mps_ops.OpTable,
) -> None:
    # `linear` lists CompositeImplicitAutograd and MPS (MPS has its own kernel).
    assert table.predict("aten::linear").outcome == mps_ops.MPS_KERNEL


def test_embedding_renorm_is_corrected_to_always_fall_back(
    table: mps_ops.OpTable,
) -> None:
    assert table.codes["embedding_renorm_"] == "none"
    prediction = table.predict("aten::embedding_renorm_")
    assert prediction.outcome == mps_ops.FORCED_FALLBACK
    assert prediction.outcome not in mps_ops.PROBLEMS  # it works, slowly
    assert "MPSFallback.mm" in prediction.source
    assert prediction.certainty == mps_ops.CERTAIN


def test_linalg_svd_composite_in_the_yaml_is_corrected_to_fall_back(
    parsed: Any, table: mps_ops.OpTable
) -> None:
    # MPSFallback.mm's svd fallback stands in for a missing _linalg_svd.U
    # kernel: the correction holds exactly while the installed yaml lacks it
    assert table.codes["linalg_svd"] == "composite:CompositeImplicitAutograd"
    expected = (
        mps_ops.COMPOSITE
        if "_linalg_svd.U" in _kernels(parsed, "MPS")
        else mps_ops.FORCED_FALLBACK
    )
    assert table.predict("aten::linalg_svd").outcome == expected
    assert table.predict("aten::linalg_svd.U").outcome == expected


def test_a_correction_the_installed_yaml_contradicts_is_named_and_not_applied(
    table: mps_ops.OpTable,
) -> None:
    # the yaml of torch 2.14: _linalg_svd.U has an MPS kernel
    codes = {**table.codes, "_linalg_svd.U": "explicit"}
    codes["_linalg_svd"] = "structured:_linalg_svd.U"
    newer = dataclasses.replace(table, codes=codes, _predictions={})
    assert newer.predict("aten::linalg_svd").outcome == mps_ops.COMPOSITE
    assert newer.predict("aten::_linalg_svd").outcome == mps_ops.MPS_KERNEL
    assert newer.contradictions() == [
        f"{op}: the correction (MPSFallback.mm) works around _linalg_svd.U having "
        "no MPS kernel, and this torch's native_functions.yaml gives it one: "
        "not applied"
        for op in ("linalg_svd", "linalg_svd.U")
    ]
    older = {**table.codes, "_linalg_svd.U": "none"}
    older["_linalg_svd"] = "none:_linalg_svd.U"
    older_table = dataclasses.replace(table, codes=older, _predictions={})
    assert older_table.predict("aten::linalg_svd").outcome == mps_ops.FORCED_FALLBACK
    assert older_table.contradictions() == []


def test_corrections_apply_only_to_their_versions(table: mps_ops.OpTable) -> None:
    old = dataclasses.replace(table, version=(2, 5), _predictions={})
    new = dataclasses.replace(table, version=(2, 13), _predictions={})
    assert old.predict("aten::col2im").outcome == mps_ops.FORCED_FALLBACK
    assert old.predict("aten::im2col").outcome == mps_ops.FORCED_FALLBACK
    # past the corrections' versions the installed yaml decides (col2im's MPS
    # kernel arrived in 2.8: pytorch#152282)
    for op in ("col2im", "im2col"):
        expected = mps_ops.MPS_KERNEL if yaml_gives_mps_kernel(op) else mps_ops.FALLBACK
        assert new.predict(f"aten::{op}").outcome == expected


def test_mvlgamma_is_composite_where_its_out_sibling_lacks_mps(
    table: mps_ops.OpTable,
) -> None:
    # torch 2.11's yaml: mvlgamma.out is CPU, CUDA only, and mvlgamma is a
    # CompositeExplicitAutograd functional; the composite-out rule alone would
    # call it a fallback (its kernel never calls mvlgamma.out: UnaryOps.cpp)
    codes = {**table.codes, "mvlgamma.out": "none", "frexp.Tensor_out": "none"}
    codes["mvlgamma"] = "composite-out:mvlgamma.out"
    codes["frexp.Tensor"] = "composite-out:frexp.Tensor_out"
    older = dataclasses.replace(table, codes=codes, version=(2, 11), _predictions={})
    mvlgamma = older.predict("aten::mvlgamma")
    assert mvlgamma.outcome == mps_ops.COMPOSITE
    assert not mvlgamma.problem
    assert "UnaryOps.cpp" in mvlgamma.source
    # the rule still holds where the kernel does call its sibling
    assert older.predict("aten::frexp.Tensor").outcome == mps_ops.FALLBACK


def test_every_correction_names_an_op_of_the_installed_yaml(
    table: mps_ops.OpTable,
) -> None:
    missing = [fix.op for fix in mps_ops.CORRECTIONS if fix.op not in table.codes]
    assert missing == []


def test_the_cpu_attention_kernel_is_routed_not_a_fallback(
    table: mps_ops.OpTable,
) -> None:
    for op in (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    ):
        prediction = table.predict(op)
        assert prediction.outcome == mps_ops.ROUTED
        assert not prediction.problem


def test_ops_outside_aten_are_unknown_and_profiler_markers_are_ignored(
    table: mps_ops.OpTable,
) -> None:
    assert table.predict("torchvision::nms").outcome == mps_ops.UNKNOWN
    marker = table.predict("profiler::_record_function_enter_new")
    assert marker.outcome == mps_ops.COMPOSITE
    assert not marker.problem


def test_default_overload_names_are_accepted_with_and_without_suffix(
    table: mps_ops.OpTable,
) -> None:
    assert table.predict("aten::mm.default") == table.predict("aten::mm")
    assert table.predict("mm").op == "aten::mm"


def test_the_rules_agree_with_the_cpu_dispatcher_for_every_overload(
    parsed: Any,
) -> None:
    # The same rules, run for the CPU key, must match the registrations the
    # dispatcher of this very torch holds; on a Mac --mps-audit-check does the
    # same for MPS with the ops a suite ran.
    codes = mps_ops.classify(parsed, "CPU")
    table = mps_ops.OpTable(
        codes, torch.__version__, "", 0.0, "parsed", (2, 13), backend="CPU"
    )
    assert len(codes) > 3000
    assert (
        mps_ops.compare_with_dispatcher(table, (f"aten::{n}" for n in codes), "CPU")
        == []
    )
    assert table.predict("aten::_linalg_svd").outcome == mps_ops.MPS_KERNEL


def test_the_check_names_each_op_where_prediction_and_dispatcher_differ(
    parsed: Any, table: mps_ops.OpTable
) -> None:
    # The MPS prediction asked of the CPU dispatcher: an op with a CPU kernel
    # but no MPS one (per the installed yaml) must be reported, with the rule.
    name = next(
        name
        for name in _cpu_and_cuda_only(parsed)
        if table.predict(f"aten::{name}").outcome == mps_ops.FALLBACK
    )
    ops = [f"aten::{name}", "aten::add.Tensor", "torchvision::nms"]
    assert mps_ops.compare_with_dispatcher(table, ops, "CPU") == [
        {
            "op": f"aten::{name}",
            "predicted": "fallback",
            "rule": "no MPS, structured or composite kernel in native_functions.yaml",
            "dispatcher": "mps",
        }
    ]


def test_float64_gets_pytorchs_empty_mps_message() -> None:
    assert mps_ops.dtype_problem(torch.float64) == (
        "Cannot convert a MPS Tensor to float64 dtype as the MPS framework "
        "doesn't support float64. Please use float32 instead."
    )


def test_complex128_and_float8_get_the_message_of_get_mps_data_type() -> None:
    assert mps_ops.dtype_problem(torch.complex128) == (
        "Trying to convert ComplexDouble to the MPS backend but it does not have "
        "support for that dtype."
    )
    # c10's name, as ScalarType's operator<< prints it in the message
    assert mps_ops.dtype_problem(torch.float8_e5m2) == (
        "Trying to convert Float8_e5m2 to the MPS backend but it does not have "
        "support for that dtype."
    )
    assert mps_ops.dtype_problem(torch.qint8) == (
        "Trying to convert QInt8 to the MPS backend but it does not have "
        "support for that dtype."
    )


def test_float8_e4m3fn_is_held_from_torch_2_15() -> None:
    problem = mps_ops.dtype_problem(torch.float8_e4m3fn)
    if mps_ops.torch_version() >= (2, 15):
        assert problem is None
    else:
        assert problem == (
            "Trying to convert Float8_e4m3fn to the MPS backend but it does not "
            "have support for that dtype."
        )
    assert "torch.float8_e4m3fn" in mps_ops.mps_dtypes((2, 15))
    assert "torch.float8_e4m3fn" not in mps_ops.mps_dtypes((2, 14))


def test_dtypes_mps_holds_have_no_problem() -> None:
    held = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool)
    assert [mps_ops.dtype_problem(dtype) for dtype in held] == [None] * len(held)


def test_the_table_is_cached_in_a_file_keyed_by_version_and_yaml_sha(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mps_ops.table, "_memory", {})
    first = mps_ops.load_table(tmp_path)
    assert first.source == "parsed"
    (cache_file,) = tmp_path.iterdir()
    assert first.yaml_sha256[:16] in cache_file.name
    assert torch.__version__.replace("+", "_") in cache_file.name
    stored = json.loads(cache_file.read_text())
    assert stored["codes"] == first.codes

    monkeypatch.setattr(mps_ops.table, "_memory", {})
    second = mps_ops.load_table(tmp_path)
    assert second.source == "cache file"
    assert second.codes == first.codes
    assert mps_ops.load_table(tmp_path).source == "memory"


def test_a_corrupt_cache_file_is_parsed_again_and_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: mps_ops.OpTable
) -> None:
    monkeypatch.setattr(mps_ops.table, "_memory", {})
    path = mps_ops.cache_file(tmp_path, torch.__version__, table.yaml_sha256)
    path.write_text("{not json")
    reloaded = mps_ops.load_table(tmp_path)
    assert reloaded.source == "parsed"
    assert json.loads(path.read_text())["codes"] == table.codes


def test_an_unwritable_cache_directory_still_gives_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mps_ops.table, "_memory", {})
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = mps_ops.load_table(blocker)
    assert result.source == "parsed"
    monkeypatch.setattr(mps_ops.table, "_memory", {})
    assert result.codes == mps_ops.load_table(tmp_path / "cache").codes


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS uses ~/Library/Caches")
def test_the_cache_directory_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_MPS_CACHE_DIR", str(tmp_path))
    assert mps_ops.cache_dir() == tmp_path
    monkeypatch.delenv("PYTEST_MPS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mps_ops.cache_dir() == tmp_path / "xdg" / "pytest-mps"


def test_the_backward_of_a_forward_mps_runs_as_a_composite_is_not_predicted() -> None:
    # torch 2.11's yaml: native_group_norm is CPU/CUDA and a composite
    # math_group_norm (MPS's path); its backward is CPU/CUDA only, and only a
    # CPU or CUDA run ever calls it
    table = mps_ops.OpTable(
        {
            "native_group_norm": "composite:CompositeExplicitAutograd",
            "native_group_norm_backward": "none",
            "native_layer_norm": "explicit",
            "native_layer_norm_backward": "none",
        },
        "2.11.0",
        "0" * 64,
        0.0,
        "memory",
    )
    assert table.predict("aten::native_group_norm_backward").outcome == mps_ops.ROUTED
    # a forward with an MPS kernel of its own: its missing backward is real
    assert table.predict("aten::native_layer_norm_backward").outcome == mps_ops.FALLBACK
