"""Arguments a Mac's MPS kernels refuse: PyTorch's text under --mps-emulate.

Each rule of the table (``pytest_mps/audit/kernels.py`` and the call rules of
``audit/rules.py``) gets a user test that passes a refused argument and one
that passes a supported one, run as a user runs them. The refused call must
raise PyTorch's exact text (``pytest.raises(..., match="^...$")``), the
supported one must run.
"""

from __future__ import annotations

import json

import pytest
import torch

from pytest_mps.audit import kernels, rules

pytest_plugins = ["pytester"]

HEADER = """
import re

import json

import pytest
import torch
import torch.nn.functional as F

D = "mps"


def refused(kind, text):
    return pytest.raises(kind, match="^" + re.escape(text) + "$")
"""

RULES = {
    "adaptive_pool_mixed": (
        """
        with refused(NotImplementedError, "Adaptive pool MPS: Input height and width "
                     "must both be greater than, or equal to, or lesser than output "
                     "height and width"):
            F.adaptive_avg_pool2d(torch.randn(1, 1, 4, 8, device=D), (6, 6))
        """,
        "F.adaptive_avg_pool2d(torch.randn(1, 1, 4, 8, device=D), (2, 4))",
    ),
    "adaptive_max_pool_mixed": (
        """
        with refused(NotImplementedError, "Adaptive pool MPS: Input height and width "
                     "must both be greater than, or equal to, or lesser than output "
                     "height and width"):
            F.adaptive_max_pool2d(torch.randn(1, 1, 4, 8, device=D), (6, 6))
        """,
        "F.adaptive_max_pool2d(torch.randn(1, 1, 4, 8, device=D), (8, 8))",
    ),
    "adaptive_pool_divisible": (
        """
        with refused(NotImplementedError, "Adaptive pool MPS: input sizes must be "
                     "divisible by output sizes. Non-divisible input sizes are not "
                     "implemented on MPS device yet. For now, you can manually "
                     "transfer tensor to cpu in this case. Please refer to [this "
                     "issue](https://github.com/pytorch/pytorch/issues/96056)"):
            F.adaptive_avg_pool2d(torch.randn(1, 1, 8, 8, device=D), (3, 3))
        """,
        "F.adaptive_avg_pool2d(torch.randn(1, 1, 8, 8, device=D), (4, 4))",
    ),
    "adaptive_pool_upsampling": (
        """
        with refused(NotImplementedError, "Adaptive pool MPS: output sizes must be "
                     "divisible by input sizes. Non-divisible input sizes are not "
                     "implemented on MPS device yet. For now, you can manually "
                     "transfer tensor to cpu in this case. Please refer to [this "
                     "issue](https://github.com/pytorch/pytorch/issues/96056)"):
            F.adaptive_avg_pool2d(torch.randn(1, 1, 2, 2, device=D), (3, 3))
        """,
        "F.adaptive_avg_pool2d(torch.randn(1, 1, 2, 2, device=D), (4, 4))",
    ),
    "integer_convolution": (
        """
        with refused(RuntimeError, "Convolution is supported only for Floating types"):
            F.conv2d(torch.ones(1, 1, 4, 4, dtype=torch.long, device=D),
                     torch.ones(1, 1, 3, 3, dtype=torch.long, device=D))
        """,
        "F.conv2d(torch.ones(1, 1, 4, 4, device=D), torch.ones(1, 1, 3, 3, device=D))",
    ),
    "lu_factor_complex": (
        """
        with refused(RuntimeError,
                     "linalg.lu_factor(): MPS doesn't support complex types."):
            torch.linalg.lu_factor(torch.eye(3, dtype=torch.complex64, device=D))
        """,
        "torch.linalg.lu_factor(torch.eye(3, device=D))",
    ),
    "lu_factor_no_pivot": (
        """
        with refused(RuntimeError,
                     "linalg.lu_factor(): MPS doesn't allow pivot == False."):
            torch.linalg.lu_factor(torch.eye(3, device=D), pivot=False)
        """,
        "torch.linalg.lu_factor(torch.eye(3, device=D), pivot=True)",
    ),
    "seventeen_dims": (
        """
        with refused(RuntimeError,
                     "MPS supports tensors with dimensions <= 16, but got 17."):
            torch.zeros([1] * 17, device=D)
        with refused(RuntimeError,
                     "MPS supports tensors with dimensions <= 16, but got 17."):
            torch.zeros([1] * 16, device=D).unsqueeze(0) + 1
        """,
        # a view allocates nothing: unsqueeze to 17 dimensions is taken
        "torch.zeros([1] * 16, device=D).unsqueeze(0)",
    ),
    "linear_integer_inputs": (
        """
        with refused(RuntimeError,
                     "MPS device does not support linear for non-float inputs"):
            F.linear(torch.ones(2, 4, dtype=torch.long, device=D),
                     torch.ones(3, 4, dtype=torch.long, device=D))
        """,
        "F.linear(torch.ones(2, 4, device=D), torch.ones(3, 4, device=D))",
    ),
    "linear_integer_weights": (
        """
        with refused(RuntimeError,
                     "MPS device does not support linear for non-float weights"):
            F.linear(torch.ones(2, 4, device=D),
                     torch.ones(3, 4, dtype=torch.long, device=D))
        """,
        "F.linear(torch.ones(2, 4, device=D), torch.ones(3, 4, device=D))",
    ),
    "lstm_projections": (
        """
        lstm = torch.nn.LSTM(4, 8, proj_size=3).to(D)
        with refused(RuntimeError,
                     "LSTM with projections is not currently supported with MPS."):
            lstm(torch.randn(2, 1, 4, device=D))
        """,
        "torch.nn.LSTM(4, 8).to(D)(torch.randn(2, 1, 4, device=D))",
    ),
}

#: Rules that hold on older macOS only: (macOS, exception, PyTorch's text, call).
OLD_MACOS = {
    "wide_convolution": (
        "15.0",
        "NotImplementedError",
        "Output channels > 65536 not supported at the MPS device. ",
        "F.conv1d(torch.randn(1, 1, 65539, device=D), torch.randn(1, 1, 3, device=D))",
    ),
    "conv3d": (
        "13.1",
        "RuntimeError",
        "Conv3D is only supported on MPS for MacOS_13_2 or newer",
        "F.conv3d(torch.randn(1, 1, 3, 3, 3, device=D), "
        "torch.randn(1, 1, 1, 1, 1, device=D))",
    ),
    "bfloat16": (
        "13.5",
        "TypeError",
        "MPS BFloat16 is only supported on MacOS 14 or newer",  # EmptyTensor.cpp
        "torch.ones(2, dtype=torch.bfloat16, device=D)",
    ),
    "complex": (
        "13.5",
        "TypeError",
        "MPS complex types are only supported on MacOS 14.0 or newer.",
        "torch.ones(2, dtype=torch.complex64, device=D)",
    ),
}


def _suite(bodies: dict[str, tuple[str, str]]) -> str:
    parts = [HEADER]
    for name, (refused, taken) in bodies.items():
        lines = [
            line[8:] if line.startswith("        ") else line
            for line in refused.strip("\n").splitlines()
        ]
        body = "\n".join("    " + line for line in lines)
        parts.append(f"\ndef test_{name}_refused():\n{body}\n")
        parts.append(f"\ndef test_{name}_taken():\n    {taken}\n")
    return "\n".join(parts)


def test_each_refused_argument_raises_pytorchs_text_and_a_supported_one_runs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_kernels=_suite(RULES))
    result = pytester.runpytest("--mps-emulate")
    result.assert_outcomes(passed=2 * len(RULES))


@pytest.mark.parametrize("name", sorted(OLD_MACOS))
def test_a_rule_of_an_older_macos_follows_mps_emulate_macos(
    pytester: pytest.Pytester, name: str
) -> None:
    macos, kind, text, call = OLD_MACOS[name]
    pytester.makepyfile(
        test_old=HEADER
        + f"\n\ndef test_refused():\n    with refused({kind}, {text!r}):\n"
        + f"        {call}\n"
        + f"\n\ndef test_taken():\n    {call}\n"
    )
    result = pytester.runpytest("--mps-emulate", f"--mps-emulate-macos={macos}")
    result.assert_outcomes(passed=1, failed=1)  # refused there, so not taken
    newest = pytester.runpytest("--mps-emulate")
    newest.assert_outcomes(passed=1, failed=1)  # taken there, so not refused
    newest.stdout.fnmatch_lines(["*test_refused*DID NOT RAISE*"])


GRID = """
import json

import pytest
import torch
import torch.nn.functional as F


@pytest.mark.parametrize("options", [{"padding_mode": "border"}, {"mode": "bicubic"}])
def test_grid_sample(options):
    image = torch.randn(1, 1, 4, 4, device="mps")
    grid = torch.zeros(1, 2, 2, 2, device="mps")
    F.grid_sample(image, grid, align_corners=False, **options)


def test_grid_sample_zeros():
    image = torch.randn(1, 1, 4, 4, device="mps")
    F.grid_sample(image, torch.zeros(1, 2, 2, 2, device="mps"), align_corners=False)
"""


def test_grid_sample_border_and_bicubic_follow_the_installed_torch(
    pytester: pytest.Pytester,
) -> None:
    """Refused below torch 2.13 (GridSampler.mm), taken from 2.13 on.

    CI runs this file on torch 2.6 as well as 2.13 and 2.14, so both sides run.
    """
    pytester.makepyfile(test_grid=GRID)
    result = pytester.runpytest("--mps-emulate")
    if kernels.torch_release(torch.__version__) < (2, 13):
        result.assert_outcomes(passed=1, failed=2)
        result.stdout.fnmatch_lines(
            [
                "E *RuntimeError: MPS: Unsupported Border padding mode",
                "E *RuntimeError: MPS: Unsupported Bicubic interpolation",
            ],
            consecutive=False,
        )
    else:
        result.assert_outcomes(passed=3)


def test_the_grid_rules_hold_below_torch_2_13_on_real_tensors() -> None:
    grid = torch.zeros(1, 2, 2, 2)
    image = torch.randn(1, 1, 4, 4)
    border = (image, grid, 0, 1, False)  # bilinear, border
    bicubic = (image, grid, 2, 0, False)  # bicubic, zeros
    old = rules.argument_rules(lambda op: "ok", torch_version="2.9.1")
    rule = old["aten::grid_sampler_2d"]
    found = rule(border, {}, None)
    assert found is not None
    assert found.message == "MPS: Unsupported Border padding mode"
    found = rule(bicubic, {}, None)
    assert found is not None
    assert found.message == "MPS: Unsupported Bicubic interpolation"
    assert rule((image, grid, 0, 0, False), {}, None) is None
    new = rules.argument_rules(lambda op: "ok", torch_version="2.13.0")
    assert "aten::grid_sampler_2d" not in new


GRID_3D = """
import re

import pytest
import torch
import torch.nn.functional as F


def test_nearest_3d():
    volume = torch.randn(1, 1, 3, 4, 4, device="mps")
    grid = torch.zeros(1, 2, 2, 2, 3, device="mps")
    with pytest.raises(KIND, match="^" + re.escape(TEXT)):
        F.grid_sample(volume, grid, mode="nearest", align_corners=False)


def test_bilinear_3d():
    volume = torch.randn(1, 1, 3, 4, 4, device="mps")
    grid = torch.zeros(1, 2, 2, 2, 3, device="mps")
    out = F.grid_sample(volume, grid, mode="bilinear", align_corners=False)
    assert out.device.type == "mps" and out.shape == (1, 1, 2, 2, 2)


def test_bicubic_3d_follows_the_shared_check():
    # torch refused 5-D bicubic on every device until 2.15 (pytorch#194738)
    volume = torch.randn(1, 1, 3, 4, 4)
    grid = torch.zeros(1, 2, 2, 2, 3)
    try:
        F.grid_sample(volume, grid, mode="bicubic", align_corners=False)
    except RuntimeError as cpu_error:
        with pytest.raises(RuntimeError, match=re.escape(str(cpu_error))):
            F.grid_sample(
                volume.to("mps"), grid.to("mps"), mode="bicubic", align_corners=False
            )
    else:
        out = F.grid_sample(
            volume.to("mps"), grid.to("mps"), mode="bicubic", align_corners=False
        )
        assert out.device.type == "mps"
"""


def test_grid_sample_3d_nearest_is_refused_in_pytorchs_words(
    pytester: pytest.Pytester,
) -> None:
    """GridSampler.mm refuses the 3-D sampler's nearest mode (kornia#4147).

    Where the installed torch's yaml gives grid_sampler_3d no MPS kernel (and
    no fallback is asked for), the op table's NotImplementedError stands;
    from 2.13, PyTorch's own Mac CI runs it (its common_mps.py), so it runs.
    """
    from pytest_mps.ops.table import FALLBACK, load_table

    outcome = load_table().predict("aten::grid_sampler_3d").outcome
    runs = kernels.torch_release(torch.__version__) >= (2, 13)
    if outcome == FALLBACK:
        kind, text = "NotImplementedError", "The operator 'aten::grid_sampler_3d'"
    else:
        kind, text = (
            "RuntimeError",
            "grid_sampler_3d: Unsupported Nearest interpolation",
        )
    code = GRID_3D.replace("KIND", kind).replace("TEXT", repr(text))
    pytester.makepyfile(test_grid_3d=code)
    result = pytester.runpytest("--mps-emulate")
    if outcome == FALLBACK:  # every mode raises the table's text
        result.assert_outcomes(passed=1, failed=2)
    elif runs:  # the nearest test's pytest.raises fails: nothing raised
        result.assert_outcomes(passed=2, failed=1)
        result.stdout.fnmatch_lines(["*DID NOT RAISE*"])
    else:
        result.assert_outcomes(passed=3)


def test_the_3d_nearest_rule_on_real_tensors() -> None:
    volume, grid = torch.randn(1, 1, 3, 4, 4), torch.zeros(1, 2, 2, 2, 3)
    found_rules = rules.argument_rules(lambda op: "ok", torch_version="2.9.1")
    rule = found_rules["aten::grid_sampler_3d"]
    assert "aten::grid_sampler_3d" not in rules.argument_rules(
        lambda op: "ok", torch_version="2.13.0"
    )
    found = rule((volume, grid, 1, 0, False), {}, None)
    assert found is not None and found.error == "RuntimeError"
    assert found.message == "grid_sampler_3d: Unsupported Nearest interpolation"
    assert rule((volume, grid, 0, 0, False), {}, None) is None
    assert rule((volume, grid, 0, 1, False), {}, None) is None  # border is taken


def test_every_table_rule_cites_an_mps_source_and_has_a_test_here() -> None:
    for rule in kernels.KERNEL_RULES:
        assert rule.source.startswith("aten/src/ATen/native/mps/operations/")
        assert rule.error in ("RuntimeError", "NotImplementedError")
    covered = len(RULES) + len(OLD_MACOS) + 3  # + grid border, bicubic, 3-d nearest
    assert covered >= 16


MM = """
import re

import json

import pytest
import torch
import torch.nn.functional as F

D = "mps"


def refused(text):
    return pytest.raises(RuntimeError, match="^" + re.escape(text) + "$")


def test_mm():
    with refused("Tensor for argument #2 'mat2' is on CPU, but expected it to be "
                 "on GPU (while checking arguments for mm)"):
        torch.mm(torch.randn(3, 4, device=D), torch.randn(4, 5))


def test_mm_first():
    with refused("Tensor for argument #1 'mat1' is on CPU, but expected it to be "
                 "on GPU (while checking arguments for mm)"):
        torch.randn(3, 4) @ torch.randn(4, 5, device=D)


def test_matmul_folds_into_mm():
    with refused("Tensor for argument #2 'mat2' is on CPU, but expected it to be "
                 "on GPU (while checking arguments for mm)"):
        torch.matmul(torch.randn(2, 3, 4, device=D), torch.randn(4, 5))


def test_addmm():
    with refused("Tensor for argument #3 'mat2' is on CPU, but expected it to be "
                 "on GPU (while checking arguments for addmm_out_mps_impl)"):
        torch.addmm(torch.randn(3, 5, device=D), torch.randn(3, 4, device=D),
                    torch.randn(4, 5))


def test_bmm_has_no_such_check():
    with refused("Placeholder storage has not been allocated on MPS device!"):
        torch.bmm(torch.randn(2, 3, 4, device=D), torch.randn(2, 4, 5))


def test_linear_weight():
    with refused("Tensor for argument weight is on cpu but expected on mps"):
        F.linear(torch.randn(3, 4, device=D), torch.randn(5, 4))


def test_linear_input():
    with refused("Tensor for argument input is on cpu but expected on mps"):
        F.linear(torch.randn(3, 4), torch.randn(5, 4, device=D))


def test_linear_bias():
    with refused("Tensor for argument bias is on cpu but expected on mps"):
        F.linear(torch.randn(3, 4, device=D), torch.randn(5, 4, device=D),
                 torch.randn(5))


def test_all_on_the_device():
    x = torch.randn(3, 4, device=D)
    assert (x @ torch.randn(4, 5, device=D)).device.type == "mps"
    assert F.linear(x, torch.randn(5, 4, device=D)).shape == (3, 5)
"""


def test_the_mm_family_and_linear_speak_their_own_placement_text(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_mm=MM)
    # the mixed-device guard would fail each test again: the raise is the subject
    result = pytester.runpytest("--mps-emulate", "--mps-mixed-devices=off")
    result.assert_outcomes(passed=9)


AUDITED = """
import torch
import torch.nn.functional as F


def test_pool_mixed():
    F.adaptive_avg_pool2d(torch.randn(1, 1, 4, 8), (6, 6))


def test_lu_complex():
    torch.linalg.lu_factor(torch.eye(3, dtype=torch.complex64))


def test_lstm_projections():
    torch.nn.LSTM(4, 8, proj_size=3)(torch.randn(2, 1, 4))


def test_wide_convolution():
    F.conv1d(torch.randn(1, 1, 65539), torch.randn(1, 1, 3))


def test_fine():
    F.adaptive_avg_pool2d(torch.randn(1, 1, 8, 8), (4, 4))
"""


def test_the_audit_names_the_same_rules_on_the_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_audited=AUDITED)
    result = pytester.runpytest(
        "--mps-audit=error", "--mps-audit-macos=15.0", "--mps-report", "r.json"
    )
    result.assert_outcomes(passed=1, failed=4)
    tests = json.loads((pytester.path / "r.json").read_text())["mps_audit"]["tests"]

    def messages(name: str) -> list[str]:
        return [f["why"] for f in tests[f"test_audited.py::{name}"]]

    assert tests["test_audited.py::test_fine"] == []
    expected = {
        "test_pool_mixed": "Adaptive pool MPS: Input height and width must both",
        "test_lu_complex": "linalg.lu_factor(): MPS doesn't support complex types.",
        "test_lstm_projections": "LSTM with projections is not currently supported",
        "test_wide_convolution": "Output channels > 65536 not supported",
    }
    for name, text in expected.items():
        assert any(text in m for m in messages(name)), (name, tests)


def test_the_docs_list_every_rule_of_the_table() -> None:
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "kernel-rules.md").read_text()
    for rule in kernels.KERNEL_RULES:
        assert f"`{rule.op}`" in text, rule
        assert rule.source.split()[0].rsplit("/", 1)[1] in text, rule


def test_the_fallback_variable_does_not_help_a_refused_argument(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    pytester.makepyfile(test_kernels=_suite(RULES))
    result = pytester.runpytest("--mps-emulate")
    result.assert_outcomes(passed=2 * len(RULES))
