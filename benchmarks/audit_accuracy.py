"""How far ``--mps-audit`` agrees with PyTorch's own MPS expectations, op by dtype.

Measured the user's way: one generated test per (OpInfo of torch's ``op_db``,
dtype), run by ``pytest --mps-audit=error`` in a subprocess. Each test's
inputs (the OpInfo's sample inputs for that dtype, made as PyTorch's MPS
tests make them, ``sample_inputs("mps", ...)``, but with CPU tensors; some
sample functions pass ``dtype=torch.float64`` on the CPU and bfloat16 on MPS;
``--cpu-samples`` takes the CPU ones) are made by a fixture, outside the
watched call; the test calls the op on each. By default every sample runs, as
PyTorch's ``test_output_match`` runs them, since PyTorch's verdict is about
all of them (``--sample 0``: the first only). A sample that raises on the CPU
is passed over; one that asks for a CPU tensor by name (``device="cpu"``:
``zeros_like(x, dtype=torch.double, device="cpu")``) too, and counted: on a
machine without MPS every tensor is on the CPU, and nothing tells it from one
meant for MPS (the audit flags its float64; a known limit). So is one that
asks for float64 by name (``zeros_like(x, dtype=torch.double)``, in torch
2.11's samples; 2.13's ask float32 for MPS): it fails on a Mac whatever the
op, so PyTorch's word on the op cannot be about it. A test that fails
with the audit's message is the audit saying "MPS lacks this (op, dtype)"; a
test that passes is the audit saying it runs.

PyTorch's word, for the same torch, comes from the installed wheel:

- ``torch/testing/_internal/common_mps.py``: the per-OpInfo lists that
  PyTorch's own MPS tests use. ``UNIMPLEMENTED_XFAILLIST`` and
  ``ON_MPS_XFAILLIST`` entries are "MPS lacks it"; ``SKIPLIST`` entries are
  left out (PyTorch does not say); everything else, ``UNDEFINED_XFAILLIST``
  (runs, results differ from the CPU) included, is "runs".
- ``op_db``: a dtype the OpInfo supports on the CPU but leaves out of its MPS
  dtypes (``dtypesIfMPS``) is "MPS lacks it"; so is an OpInfo whose own
  decorators expect test_mps.py's ``TestConsistency`` to fail
  (``nn.functional.channel_shuffle``), and one they skip is left out.

The harness reads common_mps.py and the decorators on its own, not with
pytest-mps's readers, so a bug there does not hide here. Only (OpInfo, dtype)
pairs whose dtype the OpInfo supports on the CPU are run; pairs whose samples
all raise on the CPU are left out and counted. It prints precision and recall
per dtype and overall, then every disagreement with its reason.

Needs the packages ``op_db`` imports (numpy, expecttest). Usage::

    python benchmarks/audit_accuracy.py [--dtypes float32,int64] [--match SUBSTR]
        [--sample all|N] [--cpu-samples] [--yaml-only] [--workers N]
        [--json PATH] [--keep DIR]

``--yaml-only`` hides common_mps.py from the audit (``PYTEST_MPS_COMMON_MPS``)
to measure the op table and rules alone: the OpInfo map is traced from these
very samples, so the full figure is partly the lists agreeing with themselves.

2026-11-26, ``--workers 2``: torch 2.13.0 (CPU) 1.000 / 0.964 (159, 0, 6);
torch 2.14.1 (CUDA build, on the CPU; 2554 scored cases) 1.000 / 0.979
(142, 0, 3). Float64 that a torch call makes inside itself, from arguments
with none and into results with none, no longer counts (PyTorch's CPU path
picks it where MPS's picks float32: quantile's ranks, batch_norm's empty-batch
statistics); it was the one false alarm on 2.13.0 and all five on 2.14.1.

Before that, torch 2.13.0 (CPU), ``--workers 2`` (92 s), 2545 scored cases
(46 left out; 134 samples in 59 cases name the CPU), precision / recall (TP,
FP, FN):

- then: 0.994 / 0.964 (159, 1, 6). Per dtype: float32 0.982 / 0.948, float16
  1.000 / 0.964, bfloat16 1.000 / 0.967, int64 1.000 / 0.969, bool 1.000 /
  1.000. The yaml and rules alone (``--yaml-only``): 0.993 / 0.873.
- the audit of d7887a4 in this same harness: 0.920 / 0.982 (162, 14, 3): all
  and any with a tuple ``dim`` were called fallbacks (all.dims has a composite
  kernel beside its CPU/CUDA delegate), and nanmedian.dim was blamed for
  masked.median's failure because only two samples per OpInfo were traced
  (the nanmedian OpInfo's later samples show it running).
- first samples only (``--sample 0``): 1.000 / 0.909 (150, 0, 15); nine of the
  misses are failures only later samples reach (a nuclear norm, sort ties).

The six misses, each an OpInfo whose aten ops all run in OpInfos PyTorch
expects to work, so a CPU run shows nothing to flag (the causes are my reading;
PyTorch's lists give none): log_softmax with ``dtype=`` at float32 and int64
(the MPS sample asks for a bfloat16 result, likely compared at the input
dtype's tolerance), masked.median at float32/float16/bfloat16 (masked-out
elements reach its nanmedian as NaN; the nanmedian OpInfo has none),
svd_lowrank (random projections drawn on each device's generator). The
false alarm: batch_norm of an empty float32 batch allocates its float64
statistics on the CPU (the CPU's accumulate type for float32 is double, MPS's
is float). A second table scores the ON_MPS_XFAILLIST entries whose comment
says "undefined behaviour" (sort, argsort: tie order) as running, the way
UNDEFINED_XFAILLIST is read: 0.956 / 0.962 (153, 7, 6); the audit flags them,
quoting PyTorch's comment.

torch 2.11.0 (the CUDA build, on a lent H100 host, ``CUDA_VISIBLE_DEVICES=``,
``--workers 15``, 104 s), 2538 scored cases (201 samples in 59 cases name the
CPU or float64): 0.995 / 0.953 (183, 1, 9). The misses add linalg.pinv's
singular samples and grid_sample at three dtypes; the false alarm is the same
batch_norm. Before the float64-by-name rule above and the mvlgamma correction
(``pytest_mps/ops/``) the same run read 0.718 / 0.953 (183, 72, 9):
59 samples asked for ``dtype=torch.double`` on MPS by name, and mvlgamma was
called a fallback by the composite-out rule at 12 (variant, dtype) pairs.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any

DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
LACKS = ("UNIMPLEMENTED_XFAILLIST", "ON_MPS_XFAILLIST")
LEFT_OUT = ("SKIPLIST",)
RUNS_BUT_DIFFERS = ("UNDEFINED_XFAILLIST", "EMPTY_OPS_SKIPLIST")
AUDIT_FAILURE = "--mps-audit=error"

CONFTEST = """
import json
import os

import pytest

_OUT = os.environ["AUDIT_ACCURACY_RESULTS"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" or report.outcome != "passed":
        message = ""
        if report.failed:
            message = str(getattr(report.longrepr, "reprcrash", None)
                          and report.longrepr.reprcrash.message
                          or report.longrepr)
        with open(_OUT, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({
                "case": item.callspec.id,
                "when": report.when,
                "outcome": report.outcome,
                "message": message[:2000],
                "passed_over": dict(item.user_properties).get("passed_over", 0),
            }) + "\\n")
    return report
"""

TEST_MODULE = '''
import json
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.testing._internal.common_methods_invocations import op_db

OPS = {f"{op.name}|{op.variant_test_name}": op for op in op_db}
CASES = json.loads(open(os.environ["AUDIT_ACCURACY_CASES"]).read())
SAMPLE = int(os.environ["AUDIT_ACCURACY_SAMPLE"])  # -1: every sample
DEVICE = os.environ["AUDIT_ACCURACY_DEVICE"]


def _to_cpu(value):
    """An "mps" device (str or torch.device) in a sample becomes "cpu"."""
    if isinstance(value, torch.device) and value.type == "mps":
        return torch.device("cpu")
    if isinstance(value, str) and value.split(":")[0] == "mps":
        return "cpu"
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


class OnCpu(TorchFunctionMode):
    """Tensors asked for on "mps" are made on the CPU, so a sample function
    that checks ``torch.device(device).type == "mps"`` yields what PyTorch's
    MPS tests get (no float64 arguments, ...), with CPU tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.device:  # the sample function asks which device it is for
            return func(*args, **(kwargs or {}))
        return func(*_to_cpu(args), **_to_cpu(kwargs or {}))


@pytest.fixture
def case(request):
    """The OpInfo and its sample inputs, made here: outside the watched call."""
    key, dtype = request.param.rsplit("|", 1)
    op = OPS[key]
    torch.manual_seed(0)
    with OnCpu():
        made = list(op.sample_inputs(DEVICE, getattr(torch, dtype)))
    chosen = made if SAMPLE < 0 else [made[SAMPLE]]
    kept = [s for s in chosen if DEVICE == "cpu" or not _asks_by_name(s)]
    request.node.user_properties.append(("passed_over", len(chosen) - len(kept)))
    if not kept:
        pytest.skip("every sample asks for a CPU tensor or float64 by name")
    return op, [(_to_cpu(s.input), _to_cpu(s.args), _to_cpu(s.kwargs)) for s in kept]


def _asks_by_name(sample):
    """True when a sample made for MPS asks for a CPU tensor by name
    (``device="cpu"``: zeros_like(x, dtype=torch.double, device="cpu")): on a
    machine without MPS every tensor is on the CPU, so nothing tells it from
    one meant for MPS. Or for a dtype MPS cannot hold (``dtype=torch.double``):
    torch 2.11's sample functions hard-code float64 where 2.13's ask
    ``highest_precision_float(device)``, float32 for MPS; such a sample fails on
    a Mac whatever the op, so PyTorch's word on the op is not about it."""
    if sample.kwargs.get("dtype") in (torch.float64, torch.complex128):
        return True
    named = [sample.kwargs.get("device"), *sample.args]
    return any(
        isinstance(v, torch.device) and v.type == "cpu"
        or v is named[0] and isinstance(v, str) and v.split(":")[0] == "cpu"
        for v in named
    )


# PyTorch's lists say which (op, dtype) MPS lacks, not where an op reads back
# (nonzero, unique): --mps-audit=error fails on those too, so they are silenced
@pytest.mark.mps_audit_ignore(
    "host-sync", "mixed-devices", reason="the question is which ops MPS lacks"
)
@pytest.mark.parametrize("case", CASES, ids=CASES, indirect=True)
def test_op(case):
    op, samples = case
    # a sample that raises on the CPU is passed over; the test raises only if
    # all do (PyTorch's test_output_match runs them all)
    errors = []
    for first, args, kwargs in samples:
        try:
            op(first, *args, **kwargs)
        except Exception as exc:
            errors.append(exc)
    if len(errors) == len(samples):
        raise errors[0]
'''


# -- PyTorch's word ----------------------------------------------------------------


#: The macOS PyTorch's lists are read for: the newest, as the audit's default.
MACOS_VERSION = 99.0


def _literal(node: ast.AST) -> Any:
    """A list literal of ``torch.<dtype>`` names, None, or a dict/set of those.

    ``A if MACOS_VERSION < 15.0 else B`` (torch 2.11) is read for the newest
    macOS.
    """
    if isinstance(node, ast.IfExp):
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "MACOS_VERSION"
            and len(test.ops) == 1
            and isinstance(test.comparators[0], ast.Constant)
        ):
            limit = float(test.comparators[0].value)
            holds = {
                ast.Lt: MACOS_VERSION < limit,
                ast.LtE: MACOS_VERSION <= limit,
                ast.Gt: MACOS_VERSION > limit,
                ast.GtE: MACOS_VERSION >= limit,
            }.get(type(test.ops[0]))
            if holds is not None:
                return _literal(node.body if holds else node.orelse)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_literal(e) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {
            _literal(k): _literal(v)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    raise ValueError(f"unexpected node {ast.dump(node)[:80]}")


_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64"}


def read_common_mps(path: Path) -> dict[str, dict[str, Any]]:
    """``mps_ops_modifier``'s dicts: list name -> {OpInfo key: dtype names | None}."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lists: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "mps_ops_modifier":
            for stmt in node.body:
                target = value = None
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                elif isinstance(stmt, ast.AnnAssign):
                    target, value = stmt.target, stmt.value
                if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
                    raw = _literal(value)
                    lists[target.id] = {
                        k: None if v is None else [_DTYPE_ALIASES.get(d, d) for d in v]
                        for k, v in raw.items()
                    }
            break
    if not lists:
        raise SystemExit(f"{path}: no mps_ops_modifier lists found")
    return lists


def undefined_on_mps(path: Path) -> set[str]:
    """ON_MPS_XFAILLIST keys whose own comment says "undefined behaviour".

    PyTorch lists some ops as failing on MPS only because their results differ
    from the CPU's where the CPU's are undefined (an unstable sort's order of
    ties): by its own words they run. Comments are not in the ast, so the first
    ON_MPS_XFAILLIST dict (``mps_ops_modifier``'s) is read as text: a comment
    block applies to the keys that follow it.
    """
    found: set[str] = set()
    inside, comments = False, []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not inside:
            inside = text.startswith("ON_MPS_XFAILLIST") and text.endswith("{")
            continue
        if text == "}":
            break
        if text.startswith("#"):
            comments.append(text.lower())
            continue
        key = re.match(r'"([^"]+)":', text)
        if key:
            if any("undefined behavio" in c for c in comments):
                found.add(key.group(1))
            comments = []
    return found


def _listed(entry: dict[str, Any], key: str, dtype: str) -> bool:
    return key in entry and (entry[key] is None or dtype in entry[key])


def own_expectation(op: Any, dtype: str) -> str | None:
    """What the OpInfo's own decorators say of test_mps.py's TestConsistency
    test_output_match at ``dtype``: "xfail", "skip" or None."""
    import unittest

    import torch

    verdict = None
    for info in op.decorators:
        active = getattr(info, "is_active", None)
        if active is None or not active(
            "TestConsistency", "test_output_match", "mps", getattr(torch, dtype), {}
        ):
            continue
        for decorator in info.decorators:
            if decorator is unittest.expectedFailure:
                verdict = "xfail"
            elif verdict is None and getattr(
                _decorated(decorator), "__unittest_skip__", False
            ):
                verdict = "skip"
    return verdict


def _decorated(decorator: Any) -> Any:
    try:
        return decorator(lambda: None)
    except Exception:
        return None


def truth_for(
    lists: dict[str, dict[str, Any]],
    key: str,
    dtype: str,
    mps_dtypes: set[str],
    undefined: Collection[str] = (),
    own: str | None = None,
) -> tuple[bool | None, str]:
    """(True: MPS lacks it, False: runs, None: PyTorch does not say), the reason.

    ``undefined``: ON_MPS_XFAILLIST keys read as running (see undefined_on_mps).
    ``own``: the OpInfo's own decorator for the MPS test (own_expectation).
    """
    for name in LEFT_OUT:
        if _listed(lists.get(name, {}), key, dtype):
            return None, name
    if own == "skip":
        return None, "op_db skips its TestConsistency"
    for name in LACKS:
        if _listed(lists.get(name, {}), key, dtype):
            if name == "ON_MPS_XFAILLIST" and key in undefined:
                return False, f"{name}, 'undefined behaviour' (runs)"
            return True, name
    if own == "xfail":
        return True, "op_db expectedFailure for TestConsistency"
    if dtype not in mps_dtypes:
        return True, "dtypesIfMPS leaves it out"
    for name in RUNS_BUT_DIFFERS:
        if _listed(lists.get(name, {}), key, dtype):
            return False, f"{name} (runs; results may differ)"
    return False, "not listed"


# -- running the audit the user's way -------------------------------------------------


def plan(
    dtypes: tuple[str, ...], match: str | None
) -> tuple[list[str], dict[str, Any]]:
    """The cases to run and, per case, PyTorch's MPS dtypes for its OpInfo."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    cases: list[str] = []
    info: dict[str, Any] = {}
    skipped = Counter()
    for op in op_db:
        key = f"{op.name}|{op.variant_test_name}"
        if match and match not in op.name + op.variant_test_name:
            continue
        cpu = {str(d).removeprefix("torch.") for d in op.supported_dtypes("cpu")}
        mps = {str(d).removeprefix("torch.") for d in op.supported_dtypes("mps")}
        for dtype in dtypes:
            if dtype not in cpu:
                skipped["not supported on the CPU"] += 1
                continue
            case = f"{key}|{dtype}"
            cases.append(case)
            info[case] = {
                "key": op.name + op.variant_test_name,
                "dtype": dtype,
                "mps": sorted(mps),
                "own": own_expectation(op, dtype),
            }
    del torch
    return cases, {"cases": info, "skipped": dict(skipped)}


def run_suite(
    cases: list[str],
    folder: Path,
    sample: int,
    workers: int,
    device: str,
    yaml_only: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    (folder / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (folder / "test_opinfo.py").write_text(TEST_MODULE, encoding="utf-8")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    cases_file = folder / "cases.json"
    cases_file.write_text(json.dumps(cases), encoding="utf-8")
    results = folder / "results.jsonl"
    results.unlink(missing_ok=True)
    report = folder / "report.json"
    env = {
        **os.environ,
        "AUDIT_ACCURACY_RESULTS": str(results),
        "AUDIT_ACCURACY_CASES": str(cases_file),
        "AUDIT_ACCURACY_SAMPLE": str(sample),
        "AUDIT_ACCURACY_DEVICE": device,
    }
    if yaml_only:  # pytest-mps's override of common_mps.py: a file that is not
        env["PYTEST_MPS_COMMON_MPS"] = str(folder / "no-common_mps.py")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--mps-audit=error",
        "--mps-report",
        str(report),
        "--tb=no",
        "--no-header",
        "-W",
        "ignore",
    ]
    if workers > 1:
        command += ["-n", str(workers)]
    print("$ " + " ".join(command), file=sys.stderr)
    start = time.perf_counter()
    log = (folder / "pytest.log").open("w", encoding="utf-8")
    process = subprocess.Popen(
        command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    shown = -1
    while process.poll() is None:
        time.sleep(2)
        done = _count_lines(results)
        if done != shown and (done - shown >= len(cases) // 20 or done == len(cases)):
            shown = done
            elapsed = time.perf_counter() - start
            print(f"  {done}/{len(cases)} tests run, {elapsed:.0f} s", file=sys.stderr)
    log.close()
    seconds = time.perf_counter() - start
    if not results.exists() or not report.exists():
        tail = (folder / "pytest.log").read_text(encoding="utf-8")[-3000:]
        raise SystemExit(
            f"pytest produced no results (exit {process.returncode}):\n{tail}"
        )
    rows = [json.loads(line) for line in results.read_text().splitlines() if line]
    audit = json.loads(report.read_text(encoding="utf-8")).get("mps_audit", {})
    return rows, audit, seconds


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


# -- scoring ------------------------------------------------------------------------


def _findings_by_case(audit: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for nodeid, rows in audit.get("tests", {}).items():
        case = nodeid.partition("[")[2].removesuffix("]")
        found[case] = rows
    return found


def _describe(rows: list[dict[str, Any]]) -> str:
    parts = []
    for row in rows:
        if row.get("allowed") or row.get("kind") in ("host-sync", "mixed-devices"):
            continue
        rule = row.get("rule") or row.get("why", "")
        how = f"{rule}; {row['certainty']}" if row.get("certainty") else rule
        parts.append(f"{row['name']} {row['outcome']} [{how}]: {row['why'][:90]}")
    return "; ".join(parts) or "no finding"


def score(
    cases: list[str],
    info: dict[str, Any],
    rows: list[dict[str, Any]],
    audit: dict[str, Any],
    lists: dict[str, dict[str, Any]],
    undefined: Collection[str] = (),
) -> dict[str, Any]:
    by_case: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["when"] == "call" or row["outcome"] != "passed":
            by_case.setdefault(row["case"], row)
    findings = _findings_by_case(audit)
    table: dict[str, Counter[str]] = {}
    disagreements: list[dict[str, Any]] = []
    left_out: Counter[str] = Counter()
    for case in cases:
        meta = info["cases"][case]
        dtype = meta["dtype"]
        counts = table.setdefault(dtype, Counter())
        row = by_case.get(case)
        if row is None:
            left_out["not run"] += 1
            continue
        if row["outcome"] == "skipped":
            left_out["every sample asks for a CPU tensor or float64 by name"] += 1
            continue
        if row["when"] != "call":
            left_out[f"sample input fails on the CPU ({row['when']})"] += 1
            continue
        message = row["message"].removeprefix("Failed: ")
        flagged = row["outcome"] == "failed" and message.startswith(AUDIT_FAILURE)
        if row["outcome"] == "failed" and not flagged:
            left_out["op raises on the CPU"] += 1
            continue
        truth, why = truth_for(
            lists, meta["key"], dtype, set(meta["mps"]), undefined, meta["own"]
        )
        if truth is None:
            left_out[f"PyTorch does not say ({why})"] += 1
            continue
        verdict = {
            (True, True): "tp",
            (False, True): "fp",
            (True, False): "fn",
            (False, False): "tn",
        }[(truth, flagged)]
        counts[verdict] += 1
        if verdict in ("fp", "fn"):
            disagreements.append(
                {
                    "case": case,
                    "kind": verdict,
                    "pytorch": why,
                    "audit": _describe(findings.get(case, [])),
                }
            )
    return {"table": table, "disagreements": disagreements, "left_out": left_out}


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "  -  "


def print_table(table: dict[str, Counter[str]]) -> None:
    print(f"{'dtype':<10} {'TP':>5} {'FP':>5} {'FN':>5} {'TN':>6}  precision  recall")
    total: Counter[str] = Counter()
    for dtype, c in table.items():
        total.update(c)
        print(
            f"{dtype:<10} {c['tp']:>5} {c['fp']:>5} {c['fn']:>5} {c['tn']:>6}  "
            f"{_ratio(c['tp'], c['tp'] + c['fp']):>9}  "
            f"{_ratio(c['tp'], c['tp'] + c['fn']):>6}"
        )
    c = total
    print(
        f"{'overall':<10} {c['tp']:>5} {c['fp']:>5} {c['fn']:>5} {c['tn']:>6}  "
        f"{_ratio(c['tp'], c['tp'] + c['fp']):>9}  "
        f"{_ratio(c['tp'], c['tp'] + c['fn']):>6}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--match", help="only OpInfos whose name+variant has this")
    parser.add_argument(
        "--sample",
        default="all",
        help="which sample input (0: the first), or all (default): every one, "
        "as PyTorch's test_output_match runs them",
    )
    parser.add_argument(
        "--cpu-samples",
        action="store_true",
        help="sample inputs as the CPU tests get them (float64 dtype= arguments, "
        "...), not as PyTorch's MPS tests get them",
    )
    parser.add_argument(
        "--yaml-only",
        action="store_true",
        help="the audit without PyTorch's MPS test lists (yaml and rules alone)",
    )
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers")
    parser.add_argument("--json", type=Path, help="write cases and results here")
    parser.add_argument("--keep", type=Path, help="generate and run the suite here")
    args = parser.parse_args()
    if args.sample == "all":
        sample = -1
    elif args.sample.isdigit():
        sample = int(args.sample)
    else:
        raise SystemExit(f"--sample: {args.sample!r} is neither 'all' nor a number")
    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise SystemExit(f"--dtypes: {dtype!r} is not one of {', '.join(DTYPES)}")

    import torch
    import torch.testing._internal as internal

    common_mps = Path(internal.__file__).parent / "common_mps.py"
    lists = read_common_mps(common_mps)
    print(f"torch {torch.__version__}; PyTorch's lists from {common_mps}")
    device = "cpu" if args.cpu_samples else "mps"
    cases, info = plan(dtypes, args.match)
    print(f"{len(cases)} (OpInfo, dtype) cases over {', '.join(dtypes)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows, audit, seconds = run_suite(
            cases, folder, sample, args.workers, device, args.yaml_only
        )
    result = score(cases, info, rows, audit, lists)
    note = audit.get("pytorch_lists", {}).get("note") or "PyTorch's lists used"
    print(f"\npytest --mps-audit=error over {len(cases)} tests: {seconds:.0f} s")
    print(f"audit: {note}")
    print_table(result["table"])
    passed_over = [row.get("passed_over", 0) for row in rows]
    print(
        f"samples that ask for a CPU tensor or float64 by name, passed over: "
        f"{sum(passed_over)} in {sum(1 for n in passed_over if n)} cases"
    )
    print("\nleft out:")
    for why, count in sorted(result["left_out"].items()):
        print(f"  {count:>5}  {why}")
    print(f"\n{len(result['disagreements'])} disagreements (case: PyTorch | audit):")
    for row in sorted(result["disagreements"], key=lambda r: (r["kind"], r["case"])):
        label = "missed" if row["kind"] == "fn" else "false alarm"
        print(f"  {label:<11} {row['case']}: {row['pytorch']} | {row['audit']}")
    undefined = undefined_on_mps(common_mps)
    if undefined:
        worded = score(cases, info, rows, audit, lists, undefined)
        print(
            "\nthe same, reading the ON_MPS_XFAILLIST entries that PyTorch's comment "
            f"calls 'undefined behaviour' ({', '.join(sorted(undefined))}) as "
            "running, as its UNDEFINED_XFAILLIST is read:"
        )
        print_table(worded["table"])
    if args.json:
        payload = {
            "torch": torch.__version__,
            "table": {k: dict(v) for k, v in result["table"].items()},
            "left_out": dict(result["left_out"]),
            "disagreements": result["disagreements"],
            "findings": _findings_by_case(audit),
            "rows": rows,
        }
        args.json.write_text(json.dumps(payload, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
