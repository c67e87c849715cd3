"""PyTorch's MPS test lists as a source, the new rules, bad input, --mps-audit-macos."""

from __future__ import annotations

import ast
import json
import re
import unittest
from pathlib import Path

import pytest

# Loaded here, not first inside an in-process run (see tests/test_audit.py).
import torch._dynamo  # noqa: F401
import torchgen.gen  # noqa: F401
from conftest import needs_common_mps, needs_op_db

from pytest_mps.audit import expectations

# -- reading common_mps.py --------------------------------------------------------


def _entries(text: str, name: str) -> dict[str, str]:
    """A list's entries as the text has them: key -> ``None`` or ``[...]``."""
    start = re.search(rf"^ {{8}}{name}(: [^=]+)? = {{", text, re.M).start()
    block = text[start : text.index("\n        }", start)]
    return dict(re.findall(r'^ {12}"([^"]+)": (None|\[[^\]]*\])', block, re.M))


@needs_common_mps
def test_the_installed_common_mps_is_read_without_importing_it() -> None:
    # the expectations come from the installed file's own text, read apart
    path = expectations.common_mps_path()
    lists = expectations.read_lists(path)
    text = path.read_text(encoding="utf-8")
    unimplemented = lists.lists["UNIMPLEMENTED_XFAILLIST"]
    written = _entries(text, "UNIMPLEMENTED_XFAILLIST")
    assert len(written) > 20
    for key, dtypes in written.items():
        if dtypes == "None":
            assert unimplemented[key] is None, key
        else:
            assert unimplemented[key] is not None, key
    assert lists.comment(
        "UNIMPLEMENTED_XFAILLIST", "nn.functional.adaptive_avg_pool2d"
    ) == ("MPS: input sizes must be divisible by output sizes")
    assert lists.complex_list in text and lists.checks_off() == []
    assert lists.complex_ok or lists.complex_lacking


def _common_mps_copy(tmp_path: Path, complex_list: str | None) -> Path:
    """The installed common_mps.py with its complex-op set renamed or removed."""
    path = expectations.common_mps_path()
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    (node,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id.endswith("SUPPORTED_COMPLEX_OPS")
    ]
    lines = text.splitlines(keepends=True)
    indent = " " * node.col_offset
    replacement = (
        [f'{indent}{complex_list} = {{"linalg.inv", "addr"}}\n'] if complex_list else []
    )
    lines[node.lineno - 1 : node.end_lineno] = replacement
    copy = tmp_path / "common_mps.py"
    copy.write_text("".join(lines), encoding="utf-8")
    return copy


@needs_common_mps
def test_unsupported_complex_ops_of_newer_torch_flag_the_ops_it_names(
    tmp_path: Path,
) -> None:
    # torch 2.15 replaced SUPPORTED_COMPLEX_OPS by UNSUPPORTED_COMPLEX_OPS
    lists = expectations.read_lists(
        _common_mps_copy(tmp_path, "UNSUPPORTED_COMPLEX_OPS")
    )
    assert lists.complex_list == "UNSUPPORTED_COMPLEX_OPS"
    assert lists.verdict("linalg.inv", "complex64", (99, 0)) == (
        True,
        "UNSUPPORTED_COMPLEX_OPS",
    )
    assert lists.verdict("linalg.inv", "float32", (99, 0)) == (False, "not listed")
    assert lists.verdict("fft.fft", "complex64", (99, 0)) == (False, "not listed")
    older = expectations.read_lists(_common_mps_copy(tmp_path, "SUPPORTED_COMPLEX_OPS"))
    assert older.verdict("fft.fft", "complex64", (99, 0)) == (
        True,
        "SUPPORTED_COMPLEX_OPS (not in it)",
    )
    assert older.verdict("addr", "complex64", (99, 0)) == (False, "not listed")


@needs_common_mps
def test_without_a_complex_list_the_header_names_the_check_that_is_off(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _common_mps_copy(tmp_path, None)
    assert expectations.read_lists(copy).checks_off() == [
        f"complex64 check off: {copy} has neither SUPPORTED_COMPLEX_OPS nor "
        "UNSUPPORTED_COMPLEX_OPS in mps_ops_modifier()"
    ]
    monkeypatch.setenv("PYTEST_MPS_COMMON_MPS", str(copy))
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest("--mps-audit")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            f"mps-audit: complex64 check off: {copy} has neither "
            "SUPPORTED_COMPLEX_OPS nor UNSUPPORTED_COMPLEX_OPS in mps_ops_modifier()"
        ]
    )


def test_an_entry_that_depends_on_the_macos_is_read_for_the_target_macos(
    tmp_path: Path,
) -> None:
    # torch 2.11's common_mps.py (line 563), which its reader once refused
    source = tmp_path / "common_mps.py"
    source.write_text(
        """
def mps_ops_modifier(ops):
    UNIMPLEMENTED_XFAILLIST = {
        "scatter_reduceamax": [torch.int32, torch.int64]
        if MACOS_VERSION < 15.0
        else [torch.int64],
        "grid_sampler_3d": None if MACOS_VERSION >= 26.0 else [torch.float32],
    }
    ON_MPS_XFAILLIST = {}
"""
    )
    lists = expectations.read_lists(source)
    assert lists.verdict("scatter_reduceamax", "int32", (14, 4))[0] is True
    assert lists.verdict("scatter_reduceamax", "int32", (15, 0))[0] is False
    assert lists.verdict("scatter_reduceamax", "int64", (99, 0))[0] is True
    assert lists.verdict("grid_sampler_3d", "float16", (99, 0))[0] is True
    assert lists.verdict("grid_sampler_3d", "float16", (15, 5))[0] is False


def test_a_common_mps_of_another_shape_is_a_source_error_naming_the_file(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "common_mps.py"
    broken.write_text("def something_else():\n    pass\n")
    with pytest.raises(expectations.SourceError, match="no mps_ops_modifier"):
        expectations.read_lists(broken)
    broken.write_text("def mps_ops_modifier(:\n")
    with pytest.raises(expectations.SourceError, match=str(broken)):
        expectations.read_lists(broken)


LISTS = """
def mps_ops_modifier(ops):
    UNIMPLEMENTED_XFAILLIST = {
        # no kernel at all
        "put": None,
        # integral convolution
        "conv2d": [torch.int64],
    }
    ON_MPS_XFAILLIST = {}
    MACOS_BEFORE_14_4_XFAILLIST = {"hfft2": [torch.float32]}
"""

TRACES = {
    "opinfos": {
        "put": {
            "mps_dtypes": ["float32"],
            "ops": {"float32": ["aten::clone|float32", "aten::put|float32"]},
            "errors": {},
        },
        "clone": {
            "mps_dtypes": ["float32"],
            "ops": {"float32": ["aten::clone|float32"]},
            "errors": {},
        },
        "conv2d": {
            "mps_dtypes": ["float32", "int64"],
            "ops": {
                "float32": ["aten::convolution|float32"],
                "int64": ["aten::convolution|int64"],
            },
            "errors": {},
        },
        "hfft2": {
            "mps_dtypes": ["float32"],
            "ops": {"float32": ["aten::_fft_r2c|float32"]},
            "errors": {},
        },
        "index_reduce": {
            "mps_dtypes": ["float32"],
            "ops": {"int64": ["aten::index_reduce|int64|prod"]},
            "errors": {},
        },
    }
}


@pytest.fixture
def small_lists(tmp_path: Path) -> expectations.MpsLists:
    path = tmp_path / "common_mps.py"
    path.write_text(LISTS)
    return expectations.read_lists(path)


def test_a_failure_is_blamed_on_the_ops_no_working_opinfo_runs(
    small_lists: expectations.MpsLists,
) -> None:
    found = expectations.attribute(TRACES, small_lists, (15, 0))
    # clone also runs in the working OpInfo "clone": innocent
    assert "aten::clone|float32" not in found.blamed
    put = found.blamed["aten::put|float32"]
    assert (put.opinfo, put.source) == ("put", "common_mps.py UNIMPLEMENTED_XFAILLIST")
    assert put.comment == "no kernel at all"
    assert found.blamed["aten::convolution|int64"].comment == "integral convolution"
    assert "aten::convolution|float32" not in found.blamed
    # a dtype op_db leaves out of dtypesIfMPS
    reduce = found.blamed["aten::index_reduce|int64|prod"]
    assert reduce.source == "op_db dtypesIfMPS leaves it out"
    # the macOS-gated entry applies only before 14.4
    assert "aten::_fft_r2c|float32" not in found.blamed
    older = expectations.attribute(TRACES, small_lists, (14, 2))
    assert older.blamed["aten::_fft_r2c|float32"].opinfo == "hfft2"


def test_a_failure_another_rule_explains_blames_nothing_more(
    small_lists: expectations.MpsLists,
) -> None:
    def explained(key: str) -> bool:
        return key.startswith("aten::convolution|")

    found = expectations.attribute(TRACES, small_lists, (15, 0), explained)
    assert "aten::convolution|int64" not in found.blamed
    assert "aten::put|float32" in found.blamed


def test_an_opinfos_own_decorators_are_pytorchs_word_too(
    small_lists: expectations.MpsLists,
) -> None:
    traces = {
        "opinfos": {
            **TRACES["opinfos"],
            # not in common_mps.py, but decorated expectedFailure for TestConsistency
            "channel_shuffle": {
                "mps_dtypes": ["float32"],
                "ops": {"float32": ["aten::channel_shuffle|float32"]},
                "errors": {},
                "consistency": {"float32": "xfail"},
            },
            # listed, but skipped by its own decorator: PyTorch does not say
            "conv2d": {
                **TRACES["opinfos"]["conv2d"],
                "consistency": {"int64": "skip"},
            },
        }
    }
    found = expectations.attribute(traces, small_lists, (15, 0))
    shuffle = found.blamed["aten::channel_shuffle|float32"]
    assert (shuffle.opinfo, shuffle.source) == (
        "channel_shuffle",
        "op_db DecorateInfo(unittest.expectedFailure, 'TestConsistency')",
    )
    assert "aten::convolution|int64" not in found.blamed
    # put, index_reduce (dtypesIfMPS), channel_shuffle; not the skipped conv2d
    assert found.lacking == 3


# -- in a user's suite --------------------------------------------------------------

RULES_SUITE = """
import torch
import torch.nn.functional as F


def test_pool_divisible():
    F.adaptive_avg_pool2d(torch.randn(1, 2, 8, 8), (4, 4))


def test_pool_not_divisible():
    F.adaptive_avg_pool2d(torch.randn(1, 2, 8, 8), (3, 3))


def test_int_conv():
    F.conv2d(torch.ones(1, 1, 4, 4, dtype=torch.long),
             torch.ones(1, 1, 3, 3, dtype=torch.long))


def test_pinverse_tolerance_is_a_cpu_scalar():
    torch.pinverse(torch.randn(4, 4))


def test_double():
    torch.randn(3).double()


def test_lu_solve_has_a_python_mps_kernel():
    A = torch.randn(3, 3) + 3 * torch.eye(3)
    LU, pivots = torch.linalg.lu_factor(A)
    torch.linalg.lu_solve(LU, pivots, torch.randn(3, 1))


def test_bincount_int64():
    torch.bincount(torch.tensor([0, 1, 1, 3]))
"""


@needs_common_mps
def test_each_rule_says_what_decided_it_and_how_sure_it_is(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_rules=RULES_SUITE)
    result = pytester.runpytest("--mps-audit=error", "--mps-report", "r.json")
    # lu_factor's error check reads its info back: a host sync, which fails too
    result.assert_outcomes(passed=2, failed=5)
    tests = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"]

    def only(name: str) -> dict[str, str]:
        found = [f for f in tests[f"test_rules.py::{name}"] if f["kind"] != "host-sync"]
        assert len(found) == 1, found
        return found[0]

    pool = only("test_pool_not_divisible")
    assert (pool["outcome"], pool["rule"], pool["certainty"]) == (
        "raises",
        "argument rule",
        "certain",  # PyTorch's own TORCH_CHECK (audit/kernels.py)
    )
    assert "pytorch#96056" in pool["source"]
    assert "AdaptivePooling.mm" in pool["source"]
    assert tests["test_rules.py::test_pool_divisible"] == []
    conv = only("test_int_conv")
    assert conv["name"] == "aten::convolution" and conv["outcome"] == "raises"
    assert "Convolution.mm" in conv["source"]
    assert tests["test_rules.py::test_pinverse_tolerance_is_a_cpu_scalar"] == []
    double = only("test_double")
    assert (double["name"], double["rule"]) == ("torch.float64", "dtype")
    lu_solve = tests["test_rules.py::test_lu_solve_has_a_python_mps_kernel"]
    assert [f["kind"] for f in lu_solve] == ["host-sync"]  # lu_factor's check
    bincount = only("test_bincount_int64")
    assert (bincount["kind"], bincount["outcome"], bincount["certainty"]) == (
        "op-dtype",
        "expected to fail",
        "certain",
    )
    assert bincount["rule"] == "PyTorch's MPS test lists"
    assert "OpInfo 'bincount'" in bincount["why"]


def test_a_missing_common_mps_is_one_line_and_the_yaml_still_decides(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "gone" / "common_mps.py"
    monkeypatch.setenv("PYTEST_MPS_COMMON_MPS", str(missing))
    pytester.makepyfile(test_rules=RULES_SUITE)
    result = pytester.runpytest(
        "--mps-audit=error", "-k", "double or bincount", "--mps-report", "r.json"
    )
    result.stdout.fnmatch_lines(
        [
            f"mps-audit: PyTorch's MPS test lists not used: {missing}: *No such "
            "file or directory*; predicting from the yaml alone"
        ]
    )
    tests = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"]
    # float64 still caught; bincount's int64 failure came only from the lists,
    # its host sync (the output size depends on the data) from the audit's own
    double = tests["test_rules.py::test_double"]
    assert [f["name"] for f in double] == ["torch.float64"]
    bincount = tests["test_rules.py::test_bincount_int64"]
    assert [f["kind"] for f in bincount] == ["host-sync"]


@needs_op_db
def test_a_corrupt_opinfo_cache_is_traced_again_and_replaced_whole(
    tmp_path: Path,
) -> None:
    import torch

    path = expectations.traces_file(tmp_path, torch.__version__)
    path.write_text('{"format": 2, "torch": "half a fi')
    lines: list[str] = []
    data, where = expectations.load_traces(tmp_path, torch.__version__, lines.append)
    assert where == f"traced now; corrupt cache file {path} (JSONDecodeError), " + (
        "traced again"
    )
    assert lines and "once per torch version" in lines[0]
    assert json.loads(path.read_text()) == data
    assert "put" in data["opinfos"]
    # every sample is traced: nanmedian.dim without keepdim comes after the
    # first two samples (masked.median, expected to fail, runs it too)
    nanmedian = data["opinfos"]["nanmedian"]["ops"]["float32"]
    assert "aten::nanmedian.dim|float32" in nanmedian
    # an OpInfo's own expectations for test_mps.py's TestConsistency, asked of
    # op_db here as test_mps.py asks them (which ones have any changes between
    # torch releases: channel_shuffle's went in 2.15)
    from torch.testing._internal.common_methods_invocations import op_db

    expected_xfail = {
        op.name + op.variant_test_name
        for op in op_db
        for info in op.decorators
        if hasattr(info, "is_active")
        and unittest.expectedFailure in info.decorators
        and info.is_active(
            "TestConsistency", "test_output_match", "mps", torch.float32, {}
        )
    }
    assert expected_xfail, "op_db has no MPS xfail at float32 to check with"
    traced_xfail = {
        name
        for name, entry in data["opinfos"].items()
        if entry["consistency"].get("float32") == "xfail"
    }
    assert traced_xfail == expected_xfail

    def skips(decorator: object) -> bool:
        try:
            return getattr(decorator(lambda: None), "__unittest_skip__", False)  # type: ignore[operator]
        except Exception:
            return False

    expected_skip = {
        op.name + op.variant_test_name
        for op in op_db
        for info in op.decorators
        if hasattr(info, "is_active")
        and any(skips(d) for d in info.decorators)
        and info.is_active(
            "TestConsistency", "test_output_match", "mps", torch.float32, {}
        )
    } - expected_xfail
    traced_skip = {
        name
        for name, entry in data["opinfos"].items()
        if entry["consistency"].get("float32") == "skip"
    }
    assert traced_skip == expected_skip
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    again, where = expectations.load_traces(tmp_path, torch.__version__)
    assert where == f"cache file {path}" and again == data


# -- --mps-audit-macos --------------------------------------------------------------


BF16 = """
import torch

def test_bf16():
    torch.ones(3, dtype=torch.bfloat16) * 2
"""


def test_bfloat16_is_flagged_only_for_a_macos_before_14(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_bf16=BF16)
    pytester.runpytest("--mps-audit=error").assert_outcomes(passed=1)
    result = pytester.runpytest("--mps-audit=error", "--mps-audit-macos=13.5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*; macOS 13.5",
            "  torch.bfloat16 (in aten::*): MPS bfloat16 type is supported on MacOS "
            "14.0 or newer. [[]dtype: macOS; certain; *]",
        ]
    )


def test_the_ini_twin_sets_the_macos(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_audit = error\nmps_audit_macos = 13.0\n")
    pytester.makepyfile(test_bf16=BF16)
    pytester.runpytest().assert_outcomes(failed=1)
    # the command line wins over the ini
    pytester.runpytest("--mps-audit-macos=14.4").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fourteen", "'fourteen' is not a macOS version (like 14.4 or 15)"),
        ("14.x", "'14.x' is not a macOS version (like 14.4 or 15)"),
        ("17", "'17' is not a macOS version (known: 12, 13, 14, 15, 26)"),
        ("12.1", "'12.1': MPS needs macOS 12.3 or newer"),
    ],
)
def test_a_bad_macos_version_is_a_one_line_error_naming_the_flag(
    pytester: pytest.Pytester, value: str, message: str
) -> None:
    result = pytester.runpytest("--mps-audit", f"--mps-audit-macos={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --mps-audit-macos: {message}"])


def test_a_bad_ini_macos_names_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_audit = report\nmps_audit_macos = sonoma\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*ini option mps_audit_macos in *tox.ini: 'sonoma' is not a macOS version*"]
    )
