"""Fallback-leak detection, driven by PyTorch's exact MPS warning text.

No op falls back on Linux (no MPS), so the user's test files below raise, with
``warnings.warn``, the exact text PyTorch emits. The frame that warns is the
user's line, as it is for a C++ ``TORCH_WARN``, which warns at the Python frame
that called the op. Sources (PyTorch main):

- aten/src/ATen/mps/MPSFallback.mm, ``mps_fallback``: ``TORCH_WARN_ONCE("The
  operator '", op.schema().operator_name(), "' is not currently supported ",
  "on the MPS backend and will fall back to run on the CPU.", " This may have
  performance implications.")``; torch/csrc/Exceptions.cpp appends
  `` (Triggered internally at <file>:<line>.)``.
- the same file, ``mps_error_fallback``: ``TORCH_CHECK_NOT_IMPLEMENTED(false,
  "The operator '", ..., "' is not currently implemented for the MPS device. ...")``
- aten/src/ATen/native/mps/operations/Indexing.mm: ``"MPS: nonzero op is not
  supported for complex datatypes. Falling back on CPU. This may have performance
  implications."``
- aten/src/ATen/native/mps/operations/ReduceOps.mm: ``"MPS: no support for int64
  reduction ops, casting it to int32"``
"""

from __future__ import annotations

import json
import os

import pytest
import torch

# Import torch._dynamo here, in the outer process: pytester's in-process runs
# drop the modules first imported inside them, and a second import of it
# re-registers torch's test op libraries and fails (the watch mode imports it on
# torch versions without the C-level Dynamo skip, see pytest_mps/watch.py).
import torch._dynamo  # noqa: E402, F401

MESSAGES = """
import warnings

SUFFIX = (
    " (Triggered internally at "
    "/Users/runner/work/pytorch/pytorch/pytorch/aten/src/ATen/mps/MPSFallback.mm:14.)"
)

def fallback_text(op):
    return (
        f"The operator '{op}' is not currently supported on the MPS backend and "
        "will fall back to run on the CPU. This may have performance implications."
        + SUFFIX
    )

COMPLEX_NONZERO = (
    "MPS: nonzero op is not supported for complex datatypes. Falling back on CPU. "
    "This may have performance implications. (Triggered internally at "
    "/Users/runner/work/pytorch/pytorch/pytorch/aten/src/ATen/native/mps/"
    "operations/Indexing.mm:340.)"
)
INT64_REDUCTION = (
    "MPS: no support for int64 reduction ops, casting it to int32 (Triggered "
    "internally at /Users/runner/work/pytorch/pytorch/pytorch/aten/src/ATen/native/"
    "mps/operations/ReduceOps.mm:126.)"
)

def not_implemented_text(op):
    return (
        f"The operator '{op}' is not currently implemented for the MPS device. If "
        "you want this op to be considered for addition please comment on "
        "https://github.com/pytorch/pytorch/issues/141287 and mention use-case, "
        "that resulted in missing op as well as commit hash 2236df1770800ffea5697b11b"
        "0bb0d910b2e59e1. As a temporary fix, you can set the environment variable "
        "`PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback for this op. "
        "WARNING: this will be slower than running natively on MPS."
    )
"""

USER_TESTS = """
import warnings
import pytest
from messages import fallback_text, COMPLEX_NONZERO, INT64_REDUCTION

def test_many_ops():
    for _ in range(3):
        warnings.warn(fallback_text("aten::nonzero"), UserWarning)
    warnings.warn(fallback_text("aten::_linalg_svd.U"), UserWarning)

def test_kernel_falls_back_itself():
    warnings.warn(COMPLEX_NONZERO, UserWarning)
    warnings.warn(INT64_REDUCTION, UserWarning)

def test_clean():
    assert True
"""


@pytest.fixture
def user_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(messages=MESSAGES, test_user=USER_TESTS)
    return pytester


def test_warn_mode_lists_every_op_with_counts_tests_and_first_line(
    user_suite: pytest.Pytester,
) -> None:
    result = user_suite.runpytest("--mps-fallback=warn")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*= pytest-mps: what tests did on the device =*",
            "ops that fell back to the CPU (no MPS kernel):",
            "  aten::nonzero: 3 call(s) in 1 test(s)",
            "    test_user.py::test_many_ops x3 (first at test_user.py:7)",
            "  aten::_linalg_svd.U: 1 call(s) in 1 test(s)",
            "    test_user.py::test_many_ops x1 (first at test_user.py:8)",
            "MPS kernels that fell back to the CPU:",
            "  aten::nonzero: 1 call(s) in 1 test(s)",
            "    test_user.py::test_kernel_falls_back_itself x1 (first at "
            "test_user.py:11)",
            "int64 computed as int32 on MPS:",
            "  int64 reduction ops: 1 call(s) in 1 test(s)",
        ]
    )
    # captured by pytest-mps, not repeated in pytest's warnings summary
    result.stdout.no_fnmatch_line("*warnings summary*")


def test_error_mode_fails_the_test_listing_its_fallback_ops(
    user_suite: pytest.Pytester,
) -> None:
    result = user_suite.runpytest("--mps-fallback=error")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*2 op(s) fell back from MPS to the CPU (--mps-fallback=error):",
            "  aten::nonzero x3, first at test_user.py:7",
            "  aten::_linalg_svd.U once, first at test_user.py:8",
            "allow known ones with @pytest.mark.mps_allow_fallback*",
        ]
    )


def test_int64_downcasts_are_reported_but_do_not_fail_in_error_mode(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        messages=MESSAGES,
        test_user="""
        import warnings
        from messages import INT64_REDUCTION

        def test_downcast():
            warnings.warn(INT64_REDUCTION, UserWarning)
        """,
    )
    result = pytester.runpytest("--mps-fallback=error")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["int64 computed as int32 on MPS:"])


def test_marker_and_ini_list_allow_known_fallbacks(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nmps_fallback = error\nmps_allow_fallback =\n  nonzero\n"
    )
    pytester.makepyfile(
        messages=MESSAGES,
        test_user="""
        import warnings
        import pytest
        from messages import fallback_text

        @pytest.mark.mps_allow_fallback("aten::_linalg_svd")
        def test_allowed_by_marker_and_ini():
            warnings.warn(fallback_text("aten::nonzero"), UserWarning)
            warnings.warn(fallback_text("aten::_linalg_svd.U"), UserWarning)

        @pytest.mark.mps_allow_fallback
        def test_allows_everything():
            warnings.warn(fallback_text("aten::col2im"), UserWarning)

        def test_not_allowed():
            warnings.warn(fallback_text("aten::col2im"), UserWarning)
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "  aten::col2im: 2 call(s) in 2 test(s), allowed in 1",
            "FAILED test_user.py::test_not_allowed - Failed: 1 op(s) fell back*",
        ]
    )


def test_warnings_as_errors_do_not_turn_captured_fallbacks_into_errors(
    user_suite: pytest.Pytester,
) -> None:
    # the filter names PyTorch's fallback warning alone: other plugins' own
    # UserWarnings (pytest-benchmark 5.2 warns inside an xdist worker) are not
    # what this test is about
    user_suite.runpytest(
        "--mps-fallback=warn", "-W", "error:The operator:UserWarning"
    ).assert_outcomes(passed=3)


def test_off_mode_leaves_the_variable_and_warnings_alone(
    user_suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    user_suite.makeconftest(
        "import os\nVALUE = os.environ.get('PYTORCH_ENABLE_MPS_FALLBACK')\n"
        "def pytest_report_header():\n    return f'variable at conftest: {VALUE}'\n"
    )
    result = user_suite.runpytest("--mps-fallback=off")
    without = user_suite.runpytest("-p", "no:mps").parseoutcomes()
    assert without["warnings"] >= 4  # one per line at least: nothing swallowed
    result.assert_outcomes(passed=3, warnings=without["warnings"])
    result.stdout.fnmatch_lines(["variable at conftest: None", "*warnings summary*"])
    result.stdout.no_fnmatch_line("*pytest-mps: what tests did*")


def test_not_implemented_error_names_the_op_and_how_to_collect_them_all(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        messages=MESSAGES,
        test_user="""
        from messages import not_implemented_text

        def test_missing_kernel():
            raise NotImplementedError(not_implemented_text("aten::_fft_r2c"))
        """,
    )
    result = pytester.runpytest("--mps-fallback=warn")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- pytest-mps fallback -*",
            "aten::_fft_r2c has no MPS kernel: run with --mps-fallback=warn, or set "
            "PYTORCH_ENABLE_MPS_FALLBACK=1, to run on and list every op that falls "
            "back to the CPU",
            "(ask for the kernel on PyTorch's MPS op tracker, "
            "https://github.com/pytorch/pytorch/issues/141287)",
            "ops with no MPS kernel (fallback disabled):",
            "  aten::_fft_r2c: 1 call(s) in 1 test(s)",
        ]
    )


def test_json_report_lists_fallback_ops_per_test(user_suite: pytest.Pytester) -> None:
    user_suite.runpytest(
        "--mps-fallback=warn", "--mps-report=report.json"
    ).assert_outcomes(passed=3)
    data = json.loads((user_suite.path / "report.json").read_text())
    nonzero = data["watch"]["fallback"][0]
    assert nonzero == {
        "op": "aten::nonzero",
        "count": 3,
        "tests": [
            {
                "nodeid": "test_user.py::test_many_ops",
                "count": 3,
                "location": "test_user.py:7",
                "allowed": False,
            }
        ],
    }
    assert [e["op"] for e in data["watch"]["int64-downcast"]] == ["int64 reduction ops"]


def test_session_restores_warn_always_the_variable_and_the_mode_stack(
    user_suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "0")
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(False)
    try:
        user_suite.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
        assert torch.is_warn_always_enabled() is False
        assert os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] == "0"
        assert _get_current_dispatch_mode_stack() == []
    finally:
        torch.set_warn_always(before)


def test_other_torch_warn_once_warnings_are_not_repeated_by_warn_always(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import warnings
        import pytest

        TEXT = (
            "TypedStorage is deprecated. (Triggered internally at "
            "/pytorch/torch/csrc/tensor/python_tensor.cpp:78.)"
        )

        @pytest.mark.parametrize("n", range(3))
        def test_warns(n):
            warnings.warn(TEXT, UserWarning)
        """
    )
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(False)
    try:
        result = pytester.runpytest("--mps-fallback=warn")
    finally:
        torch.set_warn_always(before)
    result.assert_outcomes(passed=3, warnings=1)


def test_header_says_when_torch_was_imported_before_the_variable_was_set(
    user_suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # this process imported torch long ago, as a plugin loaded first would have
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    result = user_suite.runpytest("--mps-fallback=warn")
    result.stdout.fnmatch_lines(
        [
            "pytest-mps fallback: warn (PYTORCH_ENABLE_MPS_FALLBACK=1 set by "
            "pytest-mps)*",
            "pytest-mps WARNING: torch was imported before pytest-mps could set "
            "PYTORCH_ENABLE_MPS_FALLBACK=1*NotImplementedError*",
        ]
    )


def test_variable_is_set_before_conftests_import_torch(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import os, sys
        VALUE = os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK")
        AT_IMPORT = (VALUE, "torch" in sys.modules)
        import torch

        def pytest_report_header():
            return f"at conftest import: {AT_IMPORT}"
        """
    )
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_subprocess("--mps-fallback=warn")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["at conftest import: ('1', False)"])
    result.stdout.no_fnmatch_line("*torch was imported before*")


def test_findings_reach_the_controller_under_xdist(user_suite: pytest.Pytester) -> None:
    result = user_suite.runpytest(
        "-n", "2", "--mps-fallback=warn", "--mps-report=r.json"
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["  aten::nonzero: 3 call(s) in 1 test(s)", "int64 computed as int32 on MPS:"]
    )
    data = json.loads((user_suite.path / "r.json").read_text())
    assert data["watch"]["fallback"][0]["count"] == 3


def test_bad_mode_is_a_usage_error_naming_the_flag(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--mps-fallback=loud")
    result.stderr.fnmatch_lines(
        ["*--mps-fallback: 'loud' is not a mode; choose from error, warn, off*"]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_markers_are_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.mps_allow_fallback(*ops):*"])


def test_no_mps_plugin_turns_fallback_detection_off(
    user_suite: pytest.Pytester,
) -> None:
    result = user_suite.runpytest("-p", "no:mps")
    result.assert_outcomes(passed=3)
    assert result.parseoutcomes()["warnings"] >= 4
    result.stdout.no_fnmatch_line("*pytest-mps*")


def test_bad_allow_marker_fails_that_test_naming_marker_and_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps_allow_fallback(3)
        def test_bad():
            pass

        def test_ok():
            pass
        """
    )
    result = pytester.runpytest("--mps-fallback=warn")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.mps_allow_fallback on test_bad_allow_marker_fails_that_test"
            "_naming_marker_and_test.py::test_bad: 3 is not an op name such as "
            "'aten::_linalg_svd'"
        ]
    )


def test_the_header_says_a_run_off_mps_cannot_fall_back(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--mps-fallback=error")
    result.stdout.fnmatch_lines(
        [
            "pytest-mps fallback: error (PYTORCH_ENABLE_MPS_FALLBACK=1 set by "
            "pytest-mps); no test runs on MPS, so nothing can fall back "
            "(--mps-emulate)"
        ]
    )
    emulated = pytester.runpytest("--mps-fallback=error", "--mps-emulate")
    emulated.stdout.no_fnmatch_line("*nothing can fall back*")
