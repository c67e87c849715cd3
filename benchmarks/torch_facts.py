"""What the installed torch says of MPS, held against what pytest-mps holds.

pytest-mps keeps a few facts of each torch release in tables by hand (the
dtypes MPS holds, the ops whose MPS kernels take float8, the ``torch._C``
functions and ``torch.mps`` names the emulation answers, the arguments MPS
kernels refuse). A new torch can make any of them wrong silently. This reads
the installed wheel's own word on each and prints every disagreement, with
where pytest-mps holds the fact:

    python benchmarks/torch_facts.py            # disagreements; exit 1 if any
    python benchmarks/torch_facts.py --verbose  # and every fact read

What it reads: OpInfo's ``dtypesIfMPS`` (torch.testing's
common_methods_invocations), ``common_mps.py``'s lists, the MPS dispatch of
``native_functions.yaml`` (through the op table), ``torch/_C/__init__.pyi``'s
``_mps_*`` declarations, and ``torch.mps`` / ``torch.backends.mps``'s
``__all__``. ``tests/test_torch_facts.py`` runs it on each torch CI installs.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from pytest_mps import ops
from pytest_mps.audit import expectations, kernels
from pytest_mps.emulate import runtime, widen


@dataclasses.dataclass(frozen=True)
class Disagreement:
    """One fact pytest-mps holds that the installed torch contradicts."""

    fact: str
    held: str  # where pytest-mps holds it
    wheel: str  # what the wheel says

    def line(self) -> str:
        return f"{self.fact}\n    held in {self.held}\n    this torch: {self.wheel}"


def mps_only_dtypes(op_db: Iterable[Any]) -> dict[str, list[str]]:
    """Dtype -> the OpInfos that list it for MPS and not for the CPU.

    OpInfo's ``dtypesIfMPS`` defaults to its ``dtypes``; a dtype there that
    ``dtypes`` lacks was added for MPS on purpose (float8_e4m3fn in 2.15's
    gather): MPS tensors hold it.
    """
    found: dict[str, list[str]] = {}
    for op in op_db:
        mps = getattr(op, "dtypesIfMPS", None) or ()
        cpu = set(getattr(op, "dtypes", None) or ())
        for dtype in mps:
            if dtype not in cpu:
                found.setdefault(str(dtype), []).append(_name(op))
    return found


def _name(op: Any) -> str:
    variant = getattr(op, "variant_test_name", "")
    return f"{op.name}.{variant}" if variant else str(op.name)


def check_dtypes(
    op_db: list[Any], held: frozenset[str], version: tuple[int, int]
) -> list[Disagreement]:
    """MPS's dtypes (OpInfo) against ``ops.mps_dtypes()`` and its versions."""
    where = "pytest_mps/ops/yaml_rules.py MPS_DTYPES, MPS_DTYPES_SINCE"
    found = []
    for dtype, names in sorted(mps_only_dtypes(op_db).items()):
        if dtype not in held:
            found.append(
                Disagreement(
                    f"MPS holds {dtype}; pytest-mps refuses it on the device",
                    where,
                    f"dtypesIfMPS of {', '.join(names[:4])} list it, their "
                    "dtypes do not",
                )
            )
    listed = {str(d) for op in op_db for d in (getattr(op, "dtypesIfMPS", ()) or ())}
    for dtype, since in sorted(ops.MPS_DTYPES_SINCE.items()):
        if version >= since and dtype not in listed:
            found.append(
                Disagreement(
                    f"pytest-mps holds {dtype} on MPS from torch {since[0]}.{since[1]}",
                    where,
                    "no OpInfo lists it in dtypesIfMPS",
                )
            )
    return found


def check_float8_ops(op_db: list[Any], held: frozenset[str]) -> list[Disagreement]:
    """Each op the emulation computes wider for float8 lists it for MPS."""
    if "torch.float8_e4m3fn" not in held:
        return []
    by_name: dict[str, set[str]] = {}
    for op in op_db:
        dtypes = {str(d) for d in (getattr(op, "dtypesIfMPS", ()) or ())}
        by_name.setdefault(str(op.name), set()).update(dtypes)
    return [
        Disagreement(
            f"{name}'s MPS kernel takes float8_e4m3fn",
            "pytest_mps/emulate/widen.py FLOAT8_MPS_OPS",
            f"OpInfo {name}'s dtypesIfMPS: "
            f"{sorted(by_name.get(name, ())) or 'no such OpInfo'}",
        )
        for name in sorted(widen.FLOAT8_MPS_OPS)
        if "torch.float8_e4m3fn" not in by_name.get(name, set())
    ]


def declared_mps_functions(stub: Path) -> list[str]:
    """The ``torch._C._mps_*`` functions the wheel's type stub declares."""
    return sorted(set(re.findall(r"^def (_mps_\w+)", stub.read_text(), re.M)))


def emulated_mps_functions() -> set[str]:
    """The ``torch._C._mps_*`` names the emulation answers on this torch."""
    names = set(runtime.Runtime((26, 0)).functions())
    if runtime.dummy_stream_base() is not None:
        names |= set(runtime.Streams().functions())
    return names


def check_mps_functions(declared: list[str], emulated: set[str]) -> list[Disagreement]:
    """Every ``_mps_*`` function torch declares is answered by the emulation."""
    return [
        Disagreement(
            f"torch._C.{name} is not emulated",
            "pytest_mps/emulate/runtime.py Runtime.functions, Streams.functions",
            f"torch/_C/__init__.pyi declares {name}",
        )
        for name in declared
        if name not in emulated
    ]


def check_api(module: Any, known: frozenset[str], where: str) -> list[Disagreement]:
    """Names in ``module.__all__`` that the emulation was not written against."""
    return [
        Disagreement(
            f"{module.__name__}.{name} is new to pytest-mps",
            where,
            f"{module.__name__}.__all__ lists {name}",
        )
        for name in sorted(set(getattr(module, "__all__", ())) - known)
    ]


def check_lists(verbose: bool = False) -> list[Disagreement]:
    """``common_mps.py``'s lists parse, and are not empty, where the wheel has it.

    torch before 2.8 or so kept them in ``test/test_mps.py``, which the wheel
    does not ship: nothing to read there (said with ``verbose``).
    """
    where = "pytest_mps/audit/expectations.py read_lists"
    path = expectations.common_mps_path()
    if not path.exists():
        if verbose:
            print(f"not read: {path} is not in this wheel")
        return []
    try:
        lists = expectations.read_lists(path)
    except expectations.SourceError as exc:
        return [Disagreement("common_mps.py's MPS lists", where, str(exc))]
    found = []
    if not any(lists.lists.values()):
        found.append(Disagreement("common_mps.py's MPS lists", where, "none read"))
    for problem in lists.checks_off():
        found.append(Disagreement("common_mps.py's complex list", where, problem))
    return found


def check_kernel_rules(
    table: Any, version: tuple[int, int], verbose: bool = False
) -> list[Disagreement]:
    """Each argument rule names an op of this torch's yaml.

    A rule on an op the yaml lacks (renamed, removed) could never fire. One on
    an op with no MPS kernel here is said with ``verbose``, for a reading by
    hand: on torch 2.6 ``linalg_lu_factor_ex`` has none, and a Mac reaches the
    same refusal through ``linalg_lu_factor``'s own MPS kernel, whose CPU
    composite calls it.
    """
    found = []
    for rule in kernels.KERNEL_RULES:
        if rule.torch_before is not None and version >= rule.torch_before:
            continue
        outcome = table.predict(rule.op.removeprefix("aten::")).outcome
        if outcome == ops.FALLBACK and verbose:
            print(f"kernel rule on an op with no MPS kernel: {rule.op} {rule.refuses}")
        if outcome == ops.UNKNOWN:
            found.append(
                Disagreement(
                    f"{rule.op} refuses {rule.refuses} on MPS",
                    "pytest_mps/audit/kernels.py KERNEL_RULES",
                    f"native_functions.yaml: {rule.op} {ops.MEANING[outcome]}",
                )
            )
    return found


def disagreements(verbose: bool = False) -> list[Disagreement]:
    """Every check above, on the installed torch."""
    import torch.backends.mps
    import torch.mps
    from torch.testing._internal.common_methods_invocations import op_db

    version = ops.torch_version()
    held = ops.mps_dtypes()
    table = ops.load_table()
    stub = Path(torch.__file__).parent / "_C" / "__init__.pyi"
    declared = declared_mps_functions(stub)
    if not any(hasattr(op, "dtypesIfMPS") for op in op_db):
        print("not read: this torch's OpInfos have no dtypesIfMPS")
    if verbose:
        print(f"MPS dtypes held: {sorted(held)}")
        print(f"dtypes OpInfo adds for MPS: {mps_only_dtypes(op_db)}")
        print(f"torch._C._mps_* declared: {declared}")
        print(f"torch.mps.__all__: {sorted(torch.mps.__all__)}")
        for line in table.contradictions():
            print(f"correction not applied (handled): {line}")
    return [
        *check_dtypes(list(op_db), held, version),
        *check_float8_ops(list(op_db), held),
        *check_mps_functions(declared, emulated_mps_functions()),
        *check_api(torch.mps, runtime.KNOWN_MPS_API, "pytest_mps/emulate/runtime.py"),
        *check_api(
            torch.backends.mps,
            runtime.KNOWN_BACKENDS_MPS_API,
            "pytest_mps/emulate/runtime.py",
        ),
        *check_lists(verbose),
        *check_kernel_rules(table, version, verbose),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="every fact read")
    args = parser.parse_args(argv)
    found = disagreements(args.verbose)
    for disagreement in found:
        print(disagreement.line())
    print(
        f"torch {torch.__version__}: {len(found)} disagreement(s) with what "
        "pytest-mps holds"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
