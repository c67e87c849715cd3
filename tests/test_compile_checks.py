"""``assert_no_graph_breaks`` and ``assert_no_recompiles`` as a user meets them."""

from __future__ import annotations

import pytest

SUITE = """
import pytest
import torch

from pytest_mps import assert_no_graph_breaks, assert_no_recompiles


def branchy(x):
    y = x.sin()
    if y.sum() > 0:  # data-dependent: a graph break
        y = y * 2
    return y.cos()


def smooth(x):
    return (x.sin() * 2).cos()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.linear(x))


def scaled(x, n):
    return x * 2 if n > 2 else x.sin()


def test_one_graph(device):
    assert_no_graph_breaks(smooth, torch.ones(3, device=device))
    assert_no_graph_breaks(Block().to(device), torch.ones(2, 4, device=device))


def test_a_break(device):
    assert_no_graph_breaks(branchy, torch.ones(3, device=device))


def test_same_shapes_compile_once(device):
    block = Block().to(device)
    assert_no_recompiles(block, [torch.ones(2, 4, device=device)] * 3)


def test_a_python_value_recompiles(device):
    x = torch.ones(3, device=device)
    assert_no_recompiles(scaled, [(x, 1), (x, 1), (x, 3)])


def test_one_call_is_a_mistake(device):
    with pytest.raises(ValueError, match="at least 2 calls to compare, got 1"):
        assert_no_recompiles(smooth, [torch.ones(3, device=device)])
"""


@pytest.mark.parametrize("flags", [[], ["--mps-emulate"]], ids=["cpu", "emulated"])
def test_breaks_and_recompiles_are_named_with_their_lines(
    pytester: pytest.Pytester, flags: list[str]
) -> None:
    pytester.makepyfile(test_user=SUITE)
    result = pytester.runpytest_subprocess(*flags)
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "E *AssertionError: branchy: 1 graph break(s), 2 graphs where one was "
            "expected:",
            "E *  1. * at *test_user.py:9 in branchy: if y.sum() > 0:*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(
        [
            "E *AssertionError: scaled: call 2 of 3 recompiled it (calls are counted "
            "from 0):",
            "E *Recompiling function scaled in *test_user.py:*",
            "E *triggered by the following guard failure(s):",
            "E *n*== 1*",
        ],
        consecutive=False,
    )
