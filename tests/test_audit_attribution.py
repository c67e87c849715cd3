"""The audit reports the code under test: not the plugin's work, not the tests' checks.

The plugin's own work (parity's reference and comparison) is never a finding;
reads in the tests' own asserts and ``torch.testing`` checks are listed apart
and never fail ``--mps-audit=error`` (other problems in an assert do);
``mps_audit_ignore`` (marker or ini line) silences findings on purpose, with a
reason; and a real problem of each kind in the code under test still fails.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

# Loaded here, not first inside an in-process run (see tests/test_audit.py).
import torch._dynamo  # noqa: F401
import torchgen.gen  # noqa: F401
from conftest import FALLBACK, REPO

pytest_plugins = ["pytester"]

PARITY_PAGE = REPO / "docs" / "parity.md"


def parity_examples() -> list[str]:
    """The python blocks of the docs' parity page, as a user would paste them."""
    return re.findall(r"```python\n(.*?)```", PARITY_PAGE.read_text(), re.S)


def test_every_docs_parity_example_passes_under_audit_error(
    pytester: pytest.Pytester,
) -> None:
    examples = parity_examples()
    assert examples, f"{PARITY_PAGE} has no python block"
    for index, example in enumerate(examples):
        pytester.makepyfile(**{f"test_docs_parity_{index}": example})
    tests = sum(len(re.findall(r"^def test_", e, re.M)) for e in examples)
    assert tests, "the docs' parity examples hold no test"
    result = pytester.runpytest("--mps-audit=error", "--mps-report=r.json")
    result.assert_outcomes(passed=tests)
    result.stdout.fnmatch_lines([f"{tests} tests audited, {tests} without findings"])
    audit = json.loads((pytester.path / "r.json").read_text())["mps_audit"]
    # not one float64 use or host sync of the plugin's own reference
    assert len(audit["tests"]) == tests
    assert all(rows == [] for rows in audit["tests"].values()), audit["tests"]


def test_the_parity_reference_never_trips_the_host_sync_watcher(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.no_host_sync
        def test_parity(device_parity):
            device_parity(torch.nn.Linear(4, 4), torch.randn(2, 4), steps=1,
                          reference_dtype=torch.float64)
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


CHECKS = """
import unittest

import numpy as np
import pytest
import torch


def test_asserts():
    a, b = torch.ones(3), torch.ones(3)
    assert torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in zip([a], [b]))
    assert (
        a.sum().item()
        == 3
    ), "a multi-line assert"
    assert torch.allclose(a, b)


def test_torch_testing():
    torch.testing.assert_close(torch.ones(3), torch.ones(3))


def test_numpy_testing():
    np.testing.assert_allclose(torch.ones(3).numpy(), np.ones(3))


class TestCaseStyle(unittest.TestCase):
    def test_assert_methods(self):
        self.assertTrue(torch.equal(torch.ones(2), torch.ones(2)))
        self.assertEqual(torch.ones(1).item(), 1.0)
"""


@pytest.mark.parametrize("assertions", ["rewrite", "plain"])
def test_the_tests_own_checks_are_listed_apart_and_never_fail(
    pytester: pytest.Pytester, assertions: str
) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    result = pytester.runpytest(
        "--mps-audit=error", f"--assert={assertions}", "--mps-report=r.json"
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "4 tests audited, 4 without findings (3 with the tests' own checks only)",
            "the tests' own checks (asserts, torch.testing), counted against nothing:",
            "  aten::equal  host sync  x3 in 2 test(s), first at test_checks.py:10",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  aten::allclose  host sync  x1 in 1 test(s), first at test_checks.py:16"]
    )
    tests = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"]
    rows = [row for found in tests.values() for row in found]
    assert rows and {row["side"] for row in rows} == {"test"}


EDGES = """
import torch
from torch import nn

from pytest_mps import assert_device_parity


def reads(t):
    return t.sum().item()


class Double(nn.Module):
    def forward(self, x):
        return x.double()


def test_a_helper_called_from_an_assert_is_code_under_test():
    assert reads(torch.ones(2)) == 2


def test_a_module_called_in_an_assert_is_code_under_test():
    assert Double()(torch.ones(2)).shape == (2,)


def test_a_read_outside_an_assert_is_the_tests_code():
    total = torch.ones(2).sum().item()
    assert total == 2


def test_a_lambda_handed_to_an_assert_helper_is_code_under_test():
    assert_device_parity(lambda x: x.double(), torch.ones(2), device="cpu")
"""


def test_only_the_assert_itself_is_test_side_not_the_code_it_calls(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_edges=EDGES)
    result = pytester.runpytest("--mps-audit=error")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(
        [
            "*test_a_helper_called_from_an_assert_is_code_under_test*",
            "  aten::_local_scalar_dense: makes the host wait for the device *",
            "    first at */test_edges.py:8",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  torch.float64 (in aten::_to_copy): *", "    first at */test_edges.py:13"]
    )
    result.stdout.fnmatch_lines(
        [
            "*test_a_lambda_handed_to_an_assert_helper_is_code_under_test*",
            "  torch.float64 (in aten::_to_copy): *",
            "    first at */test_edges.py:30",
        ]
    )


def test_torch_testing_is_the_tests_check_under_any_name(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_alias="""
        import torch

        def test_alias():
            compare = torch.testing.assert_close  # no assert in sight
            compare(torch.ones(3), torch.ones(3) + 0)
        """
    )
    result = pytester.runpytest("--mps-audit=error", "--mps-report=r.json")
    result.assert_outcomes(passed=1)
    (row,) = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"][
        "test_alias.py::test_alias"
    ]
    assert (row["name"], row["side"]) == ("aten::_local_scalar_dense", "test")


SEEDED = {
    "mylib.py": """
import numpy as np
import torch


def fallback(x):
    return FALLBACK_SOURCE


def float64(x):
    return x.double() * 2


def host_sync(x):
    return x * x.sum().item()


def mixed(x):
    return torch.ones(3, device="meta").lerp(torch.ones(3, device="meta"), x.sum())


def numpy_weights(x):
    # np.linspace is float64: the weights come to torch as float64
    return x * torch.from_numpy(np.linspace(0.0, 1.0, 3))
""",
    "test_seeded.py": """
import torch
import mylib


def test_fallback():
    mylib.fallback(torch.randn(3))


def test_float64():
    mylib.float64(torch.randn(3))


def test_host_sync():
    mylib.host_sync(torch.randn(3))


def test_mixed_devices():
    mylib.mixed(torch.randn(3))


def test_float64_from_numpy():
    mylib.numpy_weights(torch.randn(3))
""",
}


def test_a_real_problem_of_each_kind_in_the_code_under_test_still_fails(
    pytester: pytest.Pytester,
) -> None:
    files = {k.removesuffix(".py"): v for k, v in SEEDED.items()}
    files["mylib"] = files["mylib"].replace("FALLBACK_SOURCE", FALLBACK.source)
    pytester.makepyfile(**files)
    result = pytester.runpytest("--mps-audit=error")
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines(
        [
            f"  {FALLBACK.name}: falls back to CPU *",
            "    first at */mylib.py:6",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  torch.float64 (in aten::_to_copy): *", "    first at */mylib.py:10"]
    )
    result.stdout.fnmatch_lines(
        [
            "  aten::_local_scalar_dense: makes the host wait for the device *",
            "    first at */mylib.py:14",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "  aten::lerp.Tensor: mixes tensors of several devices (raises or "
            "crashes on MPS) (meta (3,), cpu 0-dim) [[]mixed-devices; certain]",
            "    first at */mylib.py:18",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_float64_from_numpy _*",
            "  torch.float64 (in aten::*): Cannot convert a MPS Tensor to float64 *",
            "    first at */mylib.py:23",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  (on purpose? @pytest.mark.mps_audit_ignore(name, reason=...))"]
    )


def test_the_marker_silences_a_float64_put_on_the_cpu_on_purpose(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.mps_audit_ignore("float64", reason="a CPU float64 reference")
        def test_reference():
            reference = torch.linspace(0, 1, 5, dtype=torch.float64, device="cpu")
            torch.testing.assert_close(reference.float(), torch.linspace(0, 1, 5))

        def test_unmarked():
            torch.zeros(2, dtype=torch.float64)

        @pytest.mark.mps_audit_ignore("float64", reason="a CPU float64 reference")
        def test_reference_and_a_read():
            torch.zeros(2, dtype=torch.float64)
            torch.ones(3).sum().item()
        """
    )
    result = pytester.runpytest("--mps-audit=error", "--strict-markers")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "test_*.py::test_reference",
            "  torch.float64  unsupported dtype (ignored)  x*  at test_*.py:6",
            "    ignored: a CPU float64 reference",
        ]
    )
    # the marker silences what it names only: the read still fails the test
    failure = result.stdout.str().split("_ test_reference_and_a_read _")[1]
    failure = failure.split("MPS audit")[0]
    assert "aten::_local_scalar_dense: makes the host wait" in failure
    assert "torch.float64" not in failure
    result.stdout.fnmatch_lines(
        [
            "test_*.py::test_reference_and_a_read",
            "  aten::_local_scalar_dense  host sync  x1  at test_*.py:15",
            "  torch.float64  unsupported dtype (ignored)  x*  at test_*.py:14",
            "    ignored: a CPU float64 reference",
        ]
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('"float64"', "give reason='why these findings are fine'"),
        ('reason="r"', "name what to ignore (float64, host-sync, ...)"),
        (
            '"flaot64", reason="r"',
            "'flaot64' is neither a kind (op, op-dtype, dtype, host-sync, "
            "mixed-devices), a torch dtype (float64) nor an op (aten::equal)",
        ),
        ('"float64", reason="r", strict=True', "unknown argument strict"),
    ],
    ids=["no-reason", "no-name", "unknown-name", "unknown-argument"],
)
def test_a_bad_ignore_marker_fails_at_setup_naming_marker_and_test(
    pytester: pytest.Pytester, arguments: str, message: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.mps_audit_ignore({arguments})
        def test_marked():
            pass
        """
    )
    result = pytester.runpytest("--mps-audit")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.mps_audit_ignore on test_*.py::test_marked: "
            + message.replace("[", "[[]")
        ]
    )


def test_the_marker_is_listed_with_its_signature(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.mps_audit_ignore(*names, reason): *"])


def test_an_ini_line_silences_findings_in_one_file_only(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini(
        """
        [pytest]
        mps_audit_ignore =
            legacy.py: float64, host-sync  # old checkpoints are float64
        """
    )
    pytester.makepyfile(
        legacy=(
            "import torch\n\ndef load():\n    return torch.ones(2).double()\n"
            f"\ndef step(x):\n    return {FALLBACK.source}\n"
        ),
        fresh="import torch\n\ndef load():\n    return torch.ones(2).double()\n",
        test_files="""
        import torch
        import legacy, fresh

        def test_legacy():
            legacy.load()

        def test_fresh():
            fresh.load()

        def test_legacy_step():
            legacy.load()
            legacy.step(torch.ones(2))
        """,
    )
    result = pytester.runpytest("--mps-audit=error")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*FAILED test_files.py::test_fresh*"])
    # the ini line names float64 and host-sync: legacy.py's fallback still fails
    failure = result.stdout.str().split("_ test_legacy_step _")[1]
    failure = failure.split("MPS audit")[0]
    assert f"{FALLBACK.name}: falls back to CPU" in failure
    assert "torch.float64" not in failure
    result.stdout.fnmatch_lines(["    ignored: old checkpoints are float64 (tox.ini)"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("legacy.py float64  # why", "is not 'path: name, name  # reason'"),
        ("legacy.py: float64", "has no reason: end it with '# why'"),
        ("legacy.py: float46  # why", "'float46' is neither a kind"),
    ],
)
def test_a_bad_ini_line_is_a_usage_error_naming_the_ini_file(
    pytester: pytest.Pytester, line: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\nmps_audit_ignore =\n    {line}\n")
    result = pytester.runpytest("--mps-audit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*ini option mps_audit_ignore in *tox.ini: {line!r}*{message}*"]
    )


@pytest.mark.parametrize(
    "args",
    [["--mps-audit=eror"], ["--mps-audit", "error"], ["--mps-audit=Error"]],
    ids=["typo", "space", "capital"],
)
def test_a_mistyped_level_says_what_was_meant_in_one_line(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    given = " ".join(args)
    expected = (
        f"ERROR: {given}: did you mean `--mps-audit=error`? the audit's levels are "
        "off, report, error, given as --mps-audit=LEVEL"
    )
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == [expected]
    assert len(expected) <= 130


def test_op_db_running_an_op_is_the_code_under_test_not_a_check() -> None:
    # torch.testing's comparisons are the test's own checks; op_db's OpInfos
    # (torch.testing._internal.common_methods_invocations) run the op under
    # test, as the accuracy harness does with every sample
    from types import SimpleNamespace

    from pytest_mps.watch.attribution import _in_testing_module

    def frame(module: str) -> Any:
        return SimpleNamespace(f_globals={"__name__": module})

    assert _in_testing_module(frame("torch.testing._comparison"))
    assert _in_testing_module(frame("torch.testing"))
    assert _in_testing_module(frame("unittest.case"))
    assert not _in_testing_module(
        frame("torch.testing._internal.common_methods_invocations")
    )
    assert not _in_testing_module(frame("torch.testing._internal.opinfo.core"))


ASSERTED_PROBLEMS = """
import torch


def test_float64_in_an_assert(device):
    out = torch.ones(3, device=device)
    assert (out.double() - 1).abs().max() < 1e-5


def test_a_fallback_in_an_assert(device):
    x = torch.ones(3, device=device)
    assert (FALLBACK_SOURCE).sum() != 0
"""


def test_only_reads_in_an_assert_are_the_tests_own_other_problems_fail(
    pytester: pytest.Pytester,
) -> None:
    # float64 and a missing kernel break an assert on MPS as anywhere else:
    # only the assert's read (bool of a tensor) is the test's own check
    source = ASSERTED_PROBLEMS.replace("FALLBACK_SOURCE", FALLBACK.source)
    pytester.makepyfile(test_asserted=source)
    result = pytester.runpytest("--mps-audit=error", "--mps-report=r.json")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["  torch.float64 (in aten::_to_copy): *", "    first at */test_asserted.py:6"]
    )
    result.stdout.fnmatch_lines(
        [
            f"  {FALLBACK.name}: falls back to CPU *",
            "    first at */test_asserted.py:11",
        ]
    )
    tests = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"]
    sides = {(r["kind"], r["side"]) for rows in tests.values() for r in rows}
    assert ("host-sync", "test") in sides
    assert ("dtype", "code") in sides and ("op", "code") in sides


TORCH_UNDER_PARITY = """
import pytest
import torch
from torch import nn

from pytest_mps import assert_device_parity


def test_a_torch_module_that_falls_back():
    x = torch.randn(1, 2, 2, 2, 2)
    assert_device_parity(nn.AdaptiveMaxPool3d(1), x, device="cpu")


def test_a_torch_function_that_falls_back():
    assert_device_parity(FALLBACK_FUNCTION, torch.randn(3), device="cpu", grads=False)


@pytest.mark.no_host_sync
def test_a_torch_function_that_syncs():
    x = torch.tensor([0.0, 1.0, 2.0])
    assert_device_parity(torch.nonzero, x, device="cpu", grads=False)
"""


def test_the_device_side_of_parity_is_the_code_under_test_even_when_torchs_own(
    pytester: pytest.Pytester,
) -> None:
    # no user frame lies between the assert_device_parity call and torch: the
    # device side still runs the code under test, not the test's own check
    source = TORCH_UNDER_PARITY.replace("FALLBACK_FUNCTION", FALLBACK.function)
    pytester.makepyfile(test_torch_parity=source)
    result = pytester.runpytest("--mps-audit=error")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_a_torch_module_that_falls_back*",
            "  aten::adaptive_max_pool3d: falls back to CPU *",
            "    first at */test_torch_parity.py:10",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            f"  {FALLBACK.name}: falls back to CPU *",
            "    first at */test_torch_parity.py:14",
        ]
    )
    result.stdout.fnmatch_lines(
        ["E   *HostSyncError: aten::nonzero makes the host wait for the device *"]
    )


def test_the_marker_silences_an_op_named_with_namespace_and_no_overload(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.mps_audit_ignore("aten::lerp", reason="meta tensors on purpose")
        def test_mixed():
            meta = torch.ones(3, device="meta")
            meta.lerp(meta, torch.randn(3).sum())
        """
    )
    result = pytester.runpytest("--mps-audit=error")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "  aten::lerp.Tensor  mixed devices (ignored)  x1  at test_*.py:7",
            "    ignored: meta tensors on purpose",
        ]
    )


def test_a_mistyped_level_in_pytest_addopts_says_where_and_what_was_meant(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-q --mps-audit=eror")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == [
        "ERROR: --mps-audit=eror (in PYTEST_ADDOPTS): did you mean "
        "`--mps-audit=error`? the audit's levels are off, report, error, given as "
        "--mps-audit=LEVEL"
    ]


def test_a_mistyped_level_in_ini_addopts_says_where_and_what_was_meant(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\naddopts = --mps-audit error\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == [
        "ERROR: --mps-audit error (in addopts of tox.ini): did you mean "
        "`--mps-audit=error`? the audit's levels are off, report, error, given as "
        "--mps-audit=LEVEL"
    ]
