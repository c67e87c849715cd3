"""``--mps-audit``: a suite run here, predicted for MPS, with the user's lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# Entering a dispatch mode imports torch._dynamo lazily. Imported first inside an
# in-process pytester run, pytester would drop it from sys.modules afterwards
# and the next import would register its TORCH_LIBRARY twice and fail; loaded
# here, it stays loaded (as tests/conftest.py does for torch itself).
import torch._dynamo  # noqa: F401

# Likewise torchgen and yaml, which an in-process run parsing the op table
# imports: imported again, yaml's loaders no longer match its constructors.
import torchgen.gen  # noqa: F401
from conftest import FALLBACK, HAS_COMMON_MPS, needs_svd_fallback

# A small nanoGPT-shaped model: embeddings, causal self-attention through
# scaled_dot_product_attention, GELU MLP, LayerNorm, tied head, cross-entropy.
GPT_MODULE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=65, block=32, layers=2, width=64, heads=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.wte.weight = self.head.weight

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
"""

USER_SUITE = """
import torch
from gpt import GPT


def test_svd():
    a = torch.randn(4, 3)
    u, s, vh = torch.linalg.svd(a)
    assert s.shape == (3,)


def test_float64():
    x = torch.zeros(3, dtype=torch.float64)
    assert (x + 1).sum() == 3


def test_item_in_a_loop():
    t = torch.arange(5.0)
    total = 0.0
    for i in range(5):
        total += t[i].item()
    assert total == 10


def test_gpt_step():
    torch.manual_seed(0)
    model = GPT()
    idx = torch.randint(0, 65, (2, 32))
    loss = model(idx, idx)
    loss.backward()
    assert model.head.weight.grad is not None
"""


@pytest.fixture
def user_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(gpt=GPT_MODULE, test_user=USER_SUITE)
    return pytester


@needs_svd_fallback
def test_audit_predicts_svd_fallback_and_float64_and_a_clean_gpt_step(
    user_suite: pytest.Pytester,
) -> None:
    result = user_suite.runpytest("--mps-audit", "--mps-report", "report.json")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*MPS audit: predicted from torch *",
            "4 tests audited, 1 without findings",
            "test_user.py::test_svd",
            "  aten::_linalg_svd  forced_fallback  x1  at test_user.py:7",
            "test_user.py::test_float64",
            # the assert on line 13 adds float64 ops: those are the code's too
            "  torch.float64  unsupported dtype  x3  at test_user.py:12",
            "test_user.py::test_item_in_a_loop",
            "  aten::_local_scalar_dense  host sync  x5  at test_user.py:20",
            "op or dtype*predicted*count*tests*first at",
            "torch.float64 *unsupported dtype * 3 * 1  test_user.py:12",
            "aten::_local_scalar_dense *host sync * 5 * 1  test_user.py:20",
            "aten::_linalg_svd *forced_fallback * 1 * 1  test_user.py:7",
            "",
            "forced_fallback: runs on the CPU even on MPS (MPSFallback.mm): "
            "works, slowly",
            "torch.float64 (unsupported dtype): Cannot convert a MPS Tensor to "
            "float64 dtype as the MPS framework doesn't support float64. Please use "
            "float32 instead.",
            "aten::_local_scalar_dense (host sync): reads a value back (.item(), *",
            "",
            # the assert on line 13 reads back: the test's own check
            "the tests' own checks (asserts, torch.testing), counted against nothing:",
            "  aten::_local_scalar_dense  host sync  x1 in 1 test(s), first at "
            "test_user.py:13",
        ]
    )
    result.stdout.no_fnmatch_line("test_user.py::test_gpt_step")
    audit = json.loads((user_suite.path / "report.json").read_text())["mps_audit"]
    assert audit["tests"]["test_user.py::test_gpt_step"] == []
    svd = audit["tests"]["test_user.py::test_svd"]
    assert [(f["name"], f["outcome"]) for f in svd] == [
        ("aten::_linalg_svd", "forced_fallback")
    ]
    assert svd[0]["first"].endswith("test_user.py:7")
    # the CPU run shows _linalg_svd; on MPS linalg_svd itself goes to the CPU
    assert svd[0]["why"].startswith("torch.linalg.svd reaches linalg_svd, which MPS")
    assert (svd[0]["rule"], svd[0]["certainty"]) == ("argument rule", "likely")
    assert svd[0]["source"].startswith("aten/src/ATen/mps/MPSFallback.mm registers")
    svd_fix = [c for c in audit["corrections"] if c["op"] == "linalg_svd"]
    assert svd_fix[0]["applies"] is True
    assert svd_fix[0]["source"].startswith("MPSFallback.mm @035290b")
    dtype = audit["tests"]["test_user.py::test_float64"][0]
    assert (dtype["kind"], dtype["name"], dtype["op"]) == (
        "dtype",
        "torch.float64",
        "aten::zeros",
    )
    assert (dtype["rule"], dtype["certainty"]) == ("dtype", "certain")


def test_the_header_says_where_the_op_table_came_from(
    user_suite: pytest.Pytester,
) -> None:
    result = user_suite.runpytest("--mps-audit", "-k", "svd")
    result.stdout.fnmatch_lines(
        [
            "mps-audit: report; op table of torch * (* overloads: * MPS, * "
            "composite, * fall back) from * in * ms; macOS newest",
            "mps-audit: PyTorch's MPS test lists: * (OpInfo, dtype) failures, * "
            "attributed (op, dtype) keys, * left to the argument rules"
            if HAS_COMMON_MPS
            else "mps-audit: PyTorch's MPS test lists not used: *; predicting "
            "from the yaml alone",
        ]
    )


def test_the_headers_counts_are_the_op_table_this_run_used(
    user_suite: pytest.Pytester,
) -> None:
    import re

    from pytest_mps import ops

    result = user_suite.runpytest("--mps-audit", "-k", "svd")
    header = re.search(
        r"op table of torch (\S+) \((\d+) overloads: (\d+) MPS, (\d+) composite, "
        r"(\d+) fall back\)",
        result.stdout.str(),
    )
    assert header is not None, result.stdout.str()
    table = ops.load_table()
    counts = table.counts()
    fallback = counts.get(ops.FALLBACK, 0) + counts.get(ops.FORCED_FALLBACK, 0)
    assert header.groups() == (
        table.torch_version,
        str(len(table.codes)),
        str(counts.get(ops.MPS_KERNEL, 0)),
        str(counts.get(ops.COMPOSITE, 0)),
        str(fallback),
    )
    # every overload is one of the three, or raises, or is left unknown
    assert int(header[3]) + int(header[4]) + int(header[5]) <= int(header[2])
    assert int(header[3]) > 500  # torch has hundreds of MPS kernels


def test_without_the_option_nothing_is_audited(user_suite: pytest.Pytester) -> None:
    result = user_suite.runpytest()
    result.assert_outcomes(passed=4)
    result.stdout.no_fnmatch_line("*MPS audit*")
    result.stdout.no_fnmatch_line("mps-audit:*")


def test_error_level_fails_each_test_with_findings_naming_op_and_line(
    user_suite: pytest.Pytester,
) -> None:
    user_suite.makepyfile(
        test_fallback=f"""
        import torch

        def test_fallback():
            x = torch.randn(3)
            {FALLBACK.source}
        """
    )
    result = user_suite.runpytest("--mps-audit=error")
    # svd runs on MPS (on the CPU, slowly): listed, not failed; the host syncs
    # of test_item_in_a_loop fail it, the one in test_float64's assert does not
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*--mps-audit=error: this test would not run cleanly on MPS:",
            f"  {FALLBACK.name}: falls back to CPU * [[]op table; *]",
            "    first at */test_fallback.py:5",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "  torch.float64 (in aten::zeros): Cannot convert a MPS Tensor to "
            "float64*[[]dtype; certain; *]"
        ]
    )


def test_allow_fallback_marker_lets_a_known_fallback_pass_at_error_level(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.mps_allow_fallback("aten::special_ndtri")
        def test_allowed():
            torch.special.ndtri(torch.rand(3))

        @pytest.mark.mps_allow_fallback("special_ndtri")
        def test_allowed_without_namespace():
            torch.special.ndtri(torch.rand(3))
        """
    )
    result = pytester.runpytest("--mps-audit=error", "--strict-markers")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["aten::special_ndtri *fallback (allowed) * 2 * 2  *"])


def test_ini_option_turns_the_audit_on(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_audit = error\n")
    pytester.makepyfile(
        f"""
        import torch

        def test_fallback():
            x = torch.zeros(4)
            {FALLBACK.source}
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"  {FALLBACK.name}: falls back to CPU *"])


def test_command_line_level_overrides_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_audit = error\n")
    pytester.makepyfile(
        """
        import torch

        def test_ndtri():
            torch.special.ndtri(torch.rand(3))
        """
    )
    result = pytester.runpytest("--mps-audit=report")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["aten::special_ndtri *fallback *"])


def test_a_bad_level_is_an_error_naming_the_flag(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--mps-audit=loud")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --mps-audit=loud: the audit's levels are off, report, error, "
            "given as --mps-audit=LEVEL"
        ]
    )


def test_a_bare_audit_flag_never_takes_the_following_path_as_its_level(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_first="def test_one():\n    pass\n",
        test_second="def test_two():\n    pass\n",
    )
    result = pytester.runpytest("--mps-audit", "test_second.py")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*MPS audit*", "1 tests audited, 1 without findings"])


def test_a_bad_ini_level_is_an_error_naming_the_ini_file(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmps_audit = sometimes\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*ini option mps_audit in *tox.ini: 'sometimes' is not a level; "
            "choose from off, *"
        ]
    )


@needs_svd_fallback
def test_svd_under_inference_mode_is_still_predicted_to_run_on_the_cpu(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_svd_inference():
            with torch.inference_mode():
                torch.linalg.svd(torch.randn(3, 3))
        """
    )
    result = pytester.runpytest("--mps-audit")
    result.stdout.fnmatch_lines(["  aten::_linalg_svd  forced_fallback  x1  at *:5"])


def test_check_off_a_mac_is_a_usage_error_with_the_reason(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest("--mps-audit-check")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--mps-audit-check needs a torch built with MPS (a Mac)*"]
    )


def test_findings_reach_the_controller_under_xdist(
    user_suite: pytest.Pytester,
) -> None:
    # One worker is enough: its reports reach the controller as under -n 8.
    result = user_suite.runpytest_subprocess("--mps-audit", "-n", "1", "-k", "float64")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "1 tests audited, 0 without findings",
            "torch.float64 *unsupported dtype * 3 * 1  test_user.py:12",
        ]
    )


@pytest.mark.mps
def test_check_on_a_mac_compares_every_op_with_the_dispatcher(
    user_suite: pytest.Pytester, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = user_suite.runpytest("--mps-audit-check", "--mps-report", str(report))
    result.stdout.fnmatch_lines(["--mps-audit-check: * ops compared, * differ"])
    check = json.loads(report.read_text())["mps_audit"]["check"]
    assert check["ops"] > 10
    for difference in check["differences"]:
        assert difference["predicted"] != difference["dispatcher"]


def test_recorder_flags_ops_mixing_cpu_and_meta_tensors_with_the_line() -> None:
    import torch

    from pytest_mps import ops as mps_ops
    from pytest_mps.audit.recorder import Recorder
    from pytest_mps.watch import mode as watch

    recorder = Recorder(mps_ops.load_table(), keep_ops=False, mixed=True)
    with watch.watch_mode([recorder]):
        meta = torch.ones(3, device="meta")
        line = sys._getframe().f_lineno + 1
        meta.lerp_(torch.ones(3, device="meta"), torch.tensor(2.0))
        meta.add_(torch.tensor(2.0))  # a scalar on a Mac
    (row,) = [r for r in recorder.results(frozenset()) if r["kind"] == "mixed-devices"]
    assert (row["name"], row["count"]) == ("aten::lerp_.Tensor", 1)
    assert row["why"] == "meta (3,), cpu 0-dim"
    assert row["first"] == f"{__file__}:{line}"


def test_help_lists_both_options_in_the_mps_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "pytest-mps*",
            "*--mps-audit *predict what the suite would do on MPS*",
            "*--mps-audit-check*on a Mac (torch built with MPS)*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  mps_audit (string):*", "  mps_audit_check (bool):*"]
    )


def test_plugin_off_leaves_no_audit_behind(user_suite: pytest.Pytester) -> None:
    result = user_suite.runpytest("-p", "no:mps", "-k", "svd")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*MPS audit*")
    refused = user_suite.runpytest("-p", "no:mps", "--mps-audit")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR


def test_the_op_table_is_loaded_only_when_auditing(
    user_suite: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_mps import ops as mps_ops

    cache = tmp_path / "cache"
    monkeypatch.setenv("PYTEST_MPS_CACHE_DIR", str(cache))
    # without PyTorch's lists: no OpInfo map traced into the fresh cache
    monkeypatch.setenv("PYTEST_MPS_COMMON_MPS", str(tmp_path / "absent.py"))
    monkeypatch.setattr(mps_ops.table, "_memory", {})
    user_suite.runpytest("-k", "svd").assert_outcomes(passed=1)
    assert not cache.exists()
    result = user_suite.runpytest("--mps-audit", "-k", "svd")
    result.stdout.fnmatch_lines(
        ["mps-audit: report; * from parsed in * ms; macOS newest"]
    )
    assert [p.name.startswith("mps-ops-") for p in cache.iterdir()] == [True]


def test_the_audit_leaves_out_host_syncs_in_expected_functions(
    expected_syncs_project: pytest.Pytester,
) -> None:
    pytester = expected_syncs_project
    pytester.makepyfile(
        test_loop="""
        import torch
        from evaluation import mean_loss, sloppy

        def test_loop():
            assert mean_loss(torch.ones(3)) == 1.0
            sloppy(torch.ones(3))
        """,
    )
    result = pytester.runpytest("--mps-audit", "--mps-report=r.json")
    result.assert_outcomes(passed=1)
    found = json.loads((pytester.path / "r.json").read_text())["mps_audit"]
    syncs = [
        r for r in found["tests"]["test_loop.py::test_loop"] if r["kind"] == "host-sync"
    ]
    assert [(r["count"], r["first"].rsplit(":", 1)[1]) for r in syncs] == [(1, "5")]


CALLS_SUITE = """
import torch
import torch.nn.functional as F


def test_svd():
    torch.linalg.svd(torch.randn(4, 3))


def test_svd_method():
    torch.randn(4, 3).svd()


def test_svdvals():
    torch.linalg.svdvals(torch.randn(4, 3))


def test_nuclear_norm():
    torch.linalg.matrix_norm(torch.randn(3, 3), ord="nuc")


def test_svd_values_only():
    torch.svd(torch.randn(4, 3), compute_uv=False)


def test_linear_of_integers():
    F.linear(torch.ones(2, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long))


def test_linear_layer_of_floats():
    torch.nn.Linear(3, 4)(torch.ones(2, 3))
"""


@needs_svd_fallback
def test_audit_tells_the_torch_call_an_op_came_from(pytester: pytest.Pytester) -> None:
    # On the CPU svd and svdvals both run _linalg_svd, and F.linear runs addmm;
    # on MPS only linalg_svd goes to the CPU by itself, and linear has a kernel
    # of its own that refuses integers. The audit sees the torch call.
    pytester.makepyfile(test_calls=CALLS_SUITE)
    result = pytester.runpytest("--mps-audit=error", "--mps-report", "report.json")
    result.assert_outcomes(passed=3, failed=4)
    tests = json.loads((pytester.path / "report.json").read_text())["mps_audit"][
        "tests"
    ]

    def only(name: str) -> dict[str, str]:
        (finding,) = tests[f"test_calls.py::{name}"]
        return finding

    for name, call in (
        ("test_svd", "torch.linalg.svd"),
        ("test_svd_method", "Tensor.svd"),
    ):
        finding = only(name)
        assert finding["outcome"] == "forced_fallback"
        assert finding["why"].startswith(f"{call} reaches linalg_svd")
    for name, call in (
        ("test_svdvals", "torch.linalg.svdvals"),
        ("test_nuclear_norm", "torch.linalg.matrix_norm"),
        ("test_svd_values_only", "torch.svd"),
    ):
        finding = only(name)
        assert (finding["name"], finding["outcome"]) == (
            "aten::_linalg_svd",
            "fallback",
        )
        assert finding["why"].startswith(f"{call} calls _linalg_svd directly")
    linear = only("test_linear_of_integers")
    assert (linear["name"], linear["outcome"], linear["rule"]) == (
        "aten::linear",
        "raises",
        "call rule",
    )
    assert "non-float inputs" in linear["why"]
    assert "Linear.mm" in linear["source"]
    assert tests["test_calls.py::test_linear_layer_of_floats"] == []
    result.stdout.fnmatch_lines(
        ["*aten::linear: raises on MPS for these arguments (linear of int64 inputs*"]
    )


def test_a_fallback_points_at_pytorchs_current_mps_op_tracker(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        f"""
        import torch

        def test_fallback():
            x = torch.randn(3)
            {FALLBACK.source}
        """
    )
    result = pytester.runpytest("--mps-audit")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "fallback: falls back to CPU (raises without "
            "PYTORCH_ENABLE_MPS_FALLBACK=1)",
            "  ask for a kernel on PyTorch's MPS op tracker, "
            "https://github.com/pytorch/pytorch/issues/141287",
        ]
    )
    result.stdout.no_fnmatch_line("*77764*")


def test_float64_that_only_pytorchs_cpu_path_makes_is_not_a_finding(
    pytester: pytest.Pytester,
) -> None:
    # quantile's ranks (float64 on every device but MPS from torch 2.14) and
    # batch_norm's statistics of an empty batch (the CPU's accumulate type for
    # float is double, MPS's is float) are made inside the call, from float32
    # and into float32: the CPU's choice, not the user's
    pytester.makepyfile(
        test_audit_float64="""
        import torch
        import torch.nn.functional as F

        def test_quantile():
            x = torch.randn(4, 10)
            q = torch.quantile(x, torch.tensor([0.25, 0.5]), dim=1)
            assert q.dtype == torch.float32

        def test_empty_batch_norm():
            x = torch.randn(0, 3)
            F.batch_norm(x, torch.zeros(3), torch.ones(3), training=True)

        def test_double():
            torch.randn(3).double()

        def test_asked_for():
            torch.quantile(torch.randn(10, dtype=torch.float64), 0.5)
        """
    )
    result = pytester.runpytest("--mps-audit", "--mps-report", "r.json")
    result.assert_outcomes(passed=4)
    tests = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"]

    def dtypes(name: str) -> list[str]:
        # dtype findings only: torch 2.6's quantile also reads a value back
        # (aten::equal), a host sync of its own
        found = tests[f"test_audit_float64.py::{name}"]
        return [f["name"] for f in found if f["kind"] == "dtype"]

    assert dtypes("test_quantile") == []
    assert dtypes("test_empty_batch_norm") == []
    assert dtypes("test_double") == ["torch.float64"]
    assert dtypes("test_asked_for") == ["torch.float64"]
