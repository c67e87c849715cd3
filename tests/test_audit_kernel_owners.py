"""A kernel rule for an op with no MPS kernel, reached through a composite op.

torch 2.6's yaml gives ``linalg_lu_factor`` an MPS kernel of its own and
``linalg_lu_factor_ex`` none; the CPU's composite ``linalg_lu_factor`` calls
``linalg_lu_factor_ex``. A Mac runs ``torch.linalg.lu_factor`` (with its
checks) and refuses ``torch.linalg.lu_factor_ex``. The op table's outcomes are
given here as that torch's, so every installed torch checks the same rule.
"""

from __future__ import annotations

import pytest
import torch

from pytest_mps.audit import kernels, rules
from pytest_mps.ops import FALLBACK, MPS_KERNEL, RAISES

LU_EX = "aten::linalg_lu_factor_ex"


def torch_26_outcomes(op: str) -> str:
    """``linalg_lu_factor_ex`` a fallback, everything else an MPS kernel."""
    return FALLBACK if op == LU_EX else MPS_KERNEL


def lu_rule(outcome_of=torch_26_outcomes):  # type: ignore[no-untyped-def]
    return rules.argument_rules(outcome_of, torch_version="2.6.0").get(LU_EX)


@pytest.mark.parametrize(
    ("matrix", "pivot", "text"),
    [
        (torch.eye(3, dtype=torch.complex64), True, "doesn't support complex types"),
        (torch.eye(3), False, "doesn't allow pivot == False"),
    ],
)
def test_lu_factor_keeps_its_kernels_checks(matrix, pivot, text) -> None:  # type: ignore[no-untyped-def]
    rule = lu_rule()
    assert rule is not None
    call = (torch.linalg.lu_factor, (matrix,), {"pivot": pivot})
    verdict = rule((matrix, pivot), {}, call)
    assert verdict is not None and verdict.outcome == RAISES
    assert text in verdict.message and verdict.source == kernels._LU


def test_lu_factor_of_a_real_matrix_runs_on_its_own_kernel() -> None:
    rule = lu_rule()
    assert rule is not None
    matrix = torch.eye(3)
    verdict = rule((matrix, True), {}, (torch.linalg.lu_factor, (matrix,), {}))
    assert verdict is not None and verdict.outcome == MPS_KERNEL
    assert "linalg_lu_factor's own MPS kernel" in verdict.rule


@pytest.mark.parametrize("func", [torch.linalg.lu_factor_ex, torch.lu, None])
def test_any_other_way_in_meets_the_tables_fallback(func) -> None:  # type: ignore[no-untyped-def]
    rule = lu_rule()
    assert rule is not None
    matrix = torch.eye(3, dtype=torch.complex64)
    call = None if func is None else (func, (matrix,), {})
    assert rule((matrix, True), {}, call) is None  # the table's fallback stands


def test_no_rule_where_the_composite_has_no_mps_kernel_either() -> None:
    assert lu_rule(lambda op: FALLBACK) is None


def test_where_the_op_has_its_kernel_every_call_is_checked() -> None:
    rule = lu_rule(lambda op: MPS_KERNEL)
    assert rule is not None
    matrix = torch.eye(3, dtype=torch.complex64)
    verdict = rule((matrix, True), {}, (torch.linalg.lu_factor_ex, (matrix,), {}))
    assert verdict is not None and verdict.outcome == RAISES
    assert rule((torch.eye(3), True), {}, None) is None


def test_a_grid_3d_rule_without_the_kernel_leaves_the_table_to_speak() -> None:
    found = rules.argument_rules(
        lambda op: FALLBACK if op == "aten::grid_sampler_3d" else MPS_KERNEL,
        torch_version="2.9.1",
    )
    assert "aten::grid_sampler_3d" not in found
    assert "aten::grid_sampler_3d" in rules.argument_rules(
        lambda op: MPS_KERNEL, torch_version="2.9.1"
    )
