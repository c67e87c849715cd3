"""benchmarks/torch_facts.py: the installed torch's MPS facts against ours.

CI runs this module on every torch it installs (the pinned one, the newest,
the floor): a new torch that contradicts a table pytest-mps keeps by hand fails
here, with the table's place named. The other tests hold each check against
the installed wheel's real data with one of our facts taken away, so each
check is seen to fail.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "torch_facts.py"


@pytest.fixture(scope="module")
def facts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_facts", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_facts"] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def op_db() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def test_the_installed_torch_agrees_with_what_pytest_mps_holds() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"torch {torch.__version__}: 0 disagreement(s)" in result.stdout


def test_a_dtype_mps_holds_and_we_refuse_is_named(
    facts: ModuleType, op_db: list[Any]
) -> None:
    from pytest_mps import ops

    if not any(hasattr(op, "dtypesIfMPS") for op in op_db):
        # torch 2.6's OpInfos have none: the script says it read nothing
        result = subprocess.run(
            [sys.executable, str(SCRIPT)], capture_output=True, text=True
        )
        assert "not read: this torch's OpInfos have no dtypesIfMPS" in result.stdout
        return
    held = ops.mps_dtypes() - {"torch.bool"}
    found = facts.check_dtypes(op_db, held, ops.torch_version())
    assert [d.fact for d in found] == [
        "MPS holds torch.bool; pytest-mps refuses it on the device"
    ]
    assert "MPS_DTYPES" in found[0].held
    assert "dtypesIfMPS of" in found[0].wheel


def test_float8_on_a_torch_whose_mps_lacks_it_is_named(
    facts: ModuleType, op_db: list[Any]
) -> None:
    from pytest_mps import ops

    if ops.torch_version() >= (2, 15):
        # 2.15's OpInfos list it: taken away, our 2.15 claim has no ground
        without = [op for op in op_db if op.name not in ("gather", "scatter")]
        found = facts.check_float8_ops(without, ops.mps_dtypes())
        assert {d.fact.split("'")[0] for d in found} == {"gather", "scatter"}
        return
    # before 2.15: claiming float8 here contradicts this torch's OpInfos
    found = facts.check_float8_ops(op_db, ops.mps_dtypes((2, 15)))
    assert {d.fact.split("'")[0] for d in found} == {"gather", "scatter"}
    assert all("FLOAT8_MPS_OPS" in d.held for d in found)


def test_an_mps_function_the_emulation_does_not_answer_is_named(
    facts: ModuleType,
) -> None:
    stub = Path(torch.__file__).parent / "_C" / "__init__.pyi"
    declared = facts.declared_mps_functions(stub)
    assert "_mps_acquireEvent" in declared
    emulated = facts.emulated_mps_functions() - {"_mps_acquireEvent"}
    found = facts.check_mps_functions(declared, emulated)
    assert [d.fact for d in found] == ["torch._C._mps_acquireEvent is not emulated"]


def test_a_new_torch_mps_name_is_named(facts: ModuleType) -> None:
    import torch.mps

    from pytest_mps.emulate import runtime

    found = facts.check_api(torch.mps, runtime.KNOWN_MPS_API - {"Event"}, "here")
    assert [d.fact for d in found] == ["torch.mps.Event is new to pytest-mps"]
