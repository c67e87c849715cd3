"""assert_reproducible and parity's twice=True: one device, same inputs, two answers.

The flaky kernel is a user's dispatch mode that makes one op's output a little
larger at each call, the shape of pytorch#180776 (``F.linear`` on M5 giving
different results on consecutive calls).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

FLAKY = """
import itertools

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_mps import assert_device_parity, assert_reproducible


class Flaky(TorchDispatchMode):
    # each call of one op comes out a little larger than the one before
    def __init__(self, op, by=1e-3):
        super().__init__()
        self.op, self.by, self.calls = op, by, itertools.count()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is self.op:
            return out * (1 + self.by * next(self.calls))
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))
"""


def _line(text: str) -> int:
    lines = FLAKY.strip("\n").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_net=FLAKY + body)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


@pytest.mark.parametrize(
    ("device", "flags"), [("cpu", ()), ("mps", ("--mps-emulate",))]
)
def test_an_op_that_answers_twice_differently_is_named(
    pytester: pytest.Pytester, device: str, flags: tuple[str, ...]
) -> None:
    result = _run(
        pytester,
        f"""
def test_net():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with Flaky(torch.ops.aten.relu.default):
        assert_reproducible(net, x, device="{device}")
""",
        *flags,
    )
    result.assert_outcomes(failed=1)
    shown = "mps:0" if device == "mps" else "cpu"
    result.stdout.fnmatch_lines(
        [
            f"E  *NotReproducible: assert_reproducible: two runs on {shown} from the "
            "same inputs and seed differ (bit for bit): output, *",
            "E  *   first op whose outputs differ between the runs, from the same "
            "inputs: aten.relu.default (op * of *, forward) in layer net (Net), "
            f"called at test_net.py:{_line('torch.relu(')}",
            "E  *     self: float32 (4, 16) strides (16, 1) (contiguous)",
            "E  *     output: float32 (4, 16) strides (16, 1) (contiguous): */64 "
            "elements differ, worst at (*, *): first run *, second * (|diff| *)",
        ]
    )


def test_a_reproducible_module_passes_bit_for_bit(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
def test_net():
    torch.manual_seed(0)
    assert_reproducible(Net(), torch.randn(4, 8), device="mps", steps=2)


def test_tolerance_lets_small_differences_through():
    torch.manual_seed(0)
    with Flaky(torch.ops.aten.relu.default, by=1e-7):
        assert_reproducible(
            Net(), torch.randn(4, 8), device="mps", rtol=1e-5, atol=1e-6
        )
""",
        "--mps-emulate",
    )
    result.assert_outcomes(passed=2)


def test_parity_twice_catches_a_difference_inside_the_parity_tolerance(
    pytester: pytest.Pytester,
) -> None:
    # 1e-7 relative per call stays within float32's parity tolerance
    result = _run(
        pytester,
        """
def test_net():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with Flaky(torch.ops.aten.addmm.default, by=1e-7):
        assert_device_parity(net, x, device="cpu")
        assert_device_parity(net, x, device="cpu", twice=True)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *ParityError: assert_device_parity: two runs on cpu from the same "
            "inputs and seed differ (bit for bit): *",
            "E  *   first op whose outputs differ between the runs, from the same "
            "inputs: aten.addmm.default (op * of *, forward) in layer net.* (Linear)*",
        ]
    )
    # the plain parity check on the line before passed
    result.stdout.fnmatch_lines(["*twice=True)"])


def test_bad_tolerances_are_named() -> None:
    import torch

    from pytest_mps import assert_reproducible

    with pytest.raises(ValueError, match=r"assert_reproducible: rtol=-1 is not a tol"):
        assert_reproducible(
            torch.nn.Linear(2, 2), torch.ones(1, 2), device="cpu", rtol=-1
        )
