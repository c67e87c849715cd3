"""PyTorch's own MPS expectations, version-matched, mapped onto aten ops.

Two sources ship in every torch wheel:

- ``torch/testing/_internal/common_mps.py``: the per-OpInfo lists PyTorch's
  MPS tests use (``UNIMPLEMENTED_XFAILLIST``, ``ON_MPS_XFAILLIST``,
  ``UNDEFINED_XFAILLIST``, ``SKIPLIST``, ``MACOS_BEFORE_<M>_<m>_XFAILLIST``,
  and the complex ops: ``SUPPORTED_COMPLEX_OPS`` up to torch 2.14,
  ``UNSUPPORTED_COMPLEX_OPS`` after). Read with :mod:`ast`: the module itself imports
  test-only packages and defines its lists only on a Mac.
- ``op_db``: each OpInfo's dtypes on the CPU and on MPS (``dtypesIfMPS``),
  its own decorators for ``test_mps.py``'s ``TestConsistency`` (an
  ``expectedFailure`` or a skip), and the aten ops its sample inputs run,
  traced once per torch version by :mod:`.opinfo_trace` in a subprocess and
  cached beside the yaml cache.

:func:`attribute` turns "OpInfo X fails on MPS at dtype d" into "aten op Y at
dtype d": the ``(op, dtype)`` keys X's samples run that no OpInfo expected to
work ever runs. A failure whose keys all also run in working OpInfos depends
on arguments, not on the op; it is left to the argument rules of :mod:`.rules`
and counted as unattributed.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: Lists whose entries PyTorch expects to fail on MPS.
LACKING_LISTS = ("UNIMPLEMENTED_XFAILLIST", "ON_MPS_XFAILLIST")
#: Lists whose entries run on MPS (results may differ from the CPU's).
RUNNING_LISTS = ("UNDEFINED_XFAILLIST", "EMPTY_OPS_SKIPLIST")
#: Lists whose entries PyTorch does not run at all: no word either way.
SILENT_LISTS = ("SKIPLIST",)
_MACOS_LIST = re.compile(r"MACOS_BEFORE_(\d+)_(\d+)_XFAILLIST$")
_COMPLEX = ("complex32", "complex64")
#: The complex-op lists, oldest shape first.
_COMPLEX_LISTS = ("SUPPORTED_COMPLEX_OPS", "UNSUPPORTED_COMPLEX_OPS")
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64"}


#: The source named when an OpInfo's own decorator expects the MPS test to fail.
_OWN_XFAIL = "op_db DecorateInfo(unittest.expectedFailure, 'TestConsistency')"


class SourceError(Exception):
    """A source file is missing, unreadable or not in the expected shape."""


_COMPARE = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}


@dataclasses.dataclass(frozen=True)
class ByMacos:
    """An entry's dtypes that depend on the macOS: ``A if MACOS_VERSION < 15.0 else B``.

    torch 2.11's ``scatter_reduceamax``; ``MACOS_VERSION`` is the Mac's
    ``major.minor`` as a float (common_mps.py).
    """

    compare: Callable[[float, float], bool]
    threshold: float
    then: list[str] | None
    otherwise: list[str] | None

    def pick(self, macos: tuple[int, int]) -> list[str] | None:
        """The dtypes listed for ``macos`` (``(99, 0)``: the newest)."""
        version = float(f"{macos[0]}.{macos[1]}")
        return self.then if self.compare(version, self.threshold) else self.otherwise


Dtypes = list[str] | None | ByMacos


@dataclasses.dataclass(frozen=True)
class MpsLists:
    """``mps_ops_modifier``'s lists: name -> {OpInfo key: dtypes or None (all)}."""

    path: str
    lists: dict[str, dict[str, Dtypes]]
    comments: dict[tuple[str, str], str]
    complex_ok: frozenset[str]
    #: UNSUPPORTED_COMPLEX_OPS (torch 2.15 replaced SUPPORTED_COMPLEX_OPS by it)
    complex_lacking: frozenset[str] = frozenset()
    #: the complex list read, or "" when the file has neither (the check is off)
    complex_list: str = ""

    def checks_off(self) -> list[str]:
        """The checks these lists cannot feed, each with why (for the header)."""
        if self.complex_list:
            return []
        return [
            "complex64 check off: "
            f"{self.path} has neither SUPPORTED_COMPLEX_OPS nor "
            "UNSUPPORTED_COMPLEX_OPS in mps_ops_modifier()"
        ]

    def verdict(
        self, key: str, dtype: str, macos: tuple[int, int]
    ) -> tuple[bool, str] | None:
        """(True: expected to fail, the list) / (False: runs, ...) / None: silent."""
        for name in SILENT_LISTS:
            if _listed(self.lists.get(name, {}), key, dtype, macos):
                return None
        for name in LACKING_LISTS:
            if _listed(self.lists.get(name, {}), key, dtype, macos):
                return True, name
        for name, entries in self.lists.items():
            gate = _MACOS_LIST.match(name)
            if gate and macos < (int(gate[1]), int(gate[2])):
                if _listed(entries, key, dtype, macos):
                    return True, name
        if dtype in _COMPLEX:
            if self.complex_list == "UNSUPPORTED_COMPLEX_OPS":
                if key in self.complex_lacking:
                    return True, "UNSUPPORTED_COMPLEX_OPS"
            elif self.complex_list and key not in self.complex_ok:
                return True, "SUPPORTED_COMPLEX_OPS (not in it)"
        return False, "not listed"

    def comment(self, name: str, key: str) -> str:
        """PyTorch's comment above ``key`` in list ``name``, or ''."""
        return self.comments.get((name, key), "")


def _listed(
    entries: Mapping[str, Dtypes], key: str, dtype: str, macos: tuple[int, int]
) -> bool:
    if key not in entries:
        return False
    dtypes = entries[key]
    if isinstance(dtypes, ByMacos):
        dtypes = dtypes.pick(macos)
    return dtypes is None or dtype in dtypes


def _dtypes(node: ast.AST) -> Dtypes:
    """An entry's value: dtypes, None (all), or dtypes chosen by the macOS."""
    if isinstance(node, ast.IfExp):
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "MACOS_VERSION"
            and len(test.ops) == 1
            and type(test.ops[0]) in _COMPARE
            and isinstance(test.comparators[0], ast.Constant)
            and isinstance(test.comparators[0].value, (int, float))
        ):
            return ByMacos(
                _COMPARE[type(test.ops[0])],
                float(test.comparators[0].value),
                _literal(node.body),
                _literal(node.orelse),
            )
    value = _literal(node)
    return None if value is None else [str(v) for v in value]


def _literal(node: ast.AST) -> Any:
    """The value of a literal of strings, None and ``torch.<dtype>`` names."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return _DTYPE_ALIASES.get(node.attr, node.attr)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(e) for e in node.elts]
    raise ValueError(f"line {getattr(node, 'lineno', '?')}: not a literal")


def _comment_above(lines: list[str], line: int, first: int) -> str:
    """The nearest block of ``#`` lines above source line ``line`` (1-based)."""
    index = line - 2
    while index >= first and not lines[index].strip().startswith("#"):
        if lines[index].strip().endswith(("{", "[")):
            break
        index -= 1
    block: list[str] = []
    while index >= first and lines[index].strip().startswith("#"):
        block.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    return " ".join(part for part in block if part)[:300]


def read_lists(path: Path) -> MpsLists:
    """Parse ``common_mps.py`` without importing it; :class:`SourceError` if not."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise SourceError(f"{path}: {exc}") from None
    function = next(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name == "mps_ops_modifier"
        ),
        None,
    )
    if function is None:
        raise SourceError(f"{path}: no mps_ops_modifier() in it")
    lines = text.splitlines()
    lists: dict[str, dict[str, Dtypes]] = {}
    comments: dict[tuple[str, str], str] = {}
    complex_sets: dict[str, list[str]] = {}
    for stmt in function.body:
        target: ast.AST | None = None
        value: ast.AST | None = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        try:
            if isinstance(value, ast.Dict):
                entries: dict[str, Dtypes] = {}
                for key_node, dtypes in zip(value.keys, value.values, strict=True):
                    if not isinstance(key_node, ast.Constant):
                        continue
                    key = str(key_node.value)
                    entries[key] = _dtypes(dtypes)
                    comments[(target.id, key)] = _comment_above(
                        lines, key_node.lineno, value.lineno - 1
                    )
                lists[target.id] = entries
            elif target.id in _COMPLEX_LISTS and isinstance(
                value, (ast.Set, ast.List, ast.Tuple)
            ):
                complex_sets[target.id] = [str(v) for v in _literal(value)]
        except ValueError as exc:
            raise SourceError(f"{path}: {target.id}: {exc}") from None
    missing = [name for name in LACKING_LISTS if name not in lists]
    if missing:
        raise SourceError(f"{path}: no {', '.join(missing)} in mps_ops_modifier()")
    # the newer name wins where a file has both
    complex_list = next((n for n in _COMPLEX_LISTS[::-1] if n in complex_sets), "")
    return MpsLists(
        str(path),
        lists,
        comments,
        frozenset(complex_sets.get("SUPPORTED_COMPLEX_OPS", ())),
        frozenset(complex_sets.get("UNSUPPORTED_COMPLEX_OPS", ())),
        complex_list,
    )


def common_mps_path() -> Path:
    """``$PYTEST_MPS_COMMON_MPS``, else the installed torch's ``common_mps.py``."""
    explicit = os.environ.get("PYTEST_MPS_COMMON_MPS")
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SourceError("torch is not installed")
    return Path(spec.origin).parent / "testing" / "_internal" / "common_mps.py"


# -- the OpInfo -> aten map, traced once per torch version ----------------------------


def traces_file(directory: Path, version: str) -> Path:
    """The cache file of one torch version's traced OpInfos."""
    from pytest_mps.audit import opinfo_trace

    stem = "".join(c if c.isalnum() or c in ".-" else "_" for c in version)
    return directory / f"mps-opinfo-{stem}-f{opinfo_trace.FORMAT}.json"


def _valid_traces(data: Any, version: str) -> bool:
    from pytest_mps.audit import opinfo_trace

    return (
        isinstance(data, dict)
        and data.get("format") == opinfo_trace.FORMAT
        and data.get("torch") == version
        and isinstance(data.get("opinfos"), dict)
    )


def load_traces(
    directory: Path, version: str, progress: Any = None
) -> tuple[dict[str, Any], str]:
    """The traced OpInfos from the cache, or traced now; (data, where from).

    Tracing runs ``python -m pytest_mps.audit.opinfo_trace`` (op_db needs
    numpy and expecttest, and its import changes global state) and writes the
    cache atomically. :class:`SourceError` names the file or the missing
    package when neither works.
    """
    path = traces_file(directory, version)
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            data = None
            note = f"corrupt cache file {path} ({type(exc).__name__}), traced again"
        else:
            note = ""
            if _valid_traces(data, version):
                return data, f"cache file {path}"
            note = f"cache file {path} is of another format, traced again"
    else:
        note = ""
    missing = [m for m in ("numpy", "expecttest") if not importlib.util.find_spec(m)]
    if missing:
        raise SourceError(
            f"op_db (the OpInfo -> aten map) needs {' and '.join(missing)} "
            f"(pip install {' '.join(missing)})"
        )
    if progress is not None:
        progress(
            "pytest-mps: tracing torch's OpInfo samples for --mps-audit "
            "(once per torch version, ~25 s)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest_mps.audit.opinfo_trace", tmp],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise SourceError(f"tracing op_db failed: {last}")
        data = json.loads(Path(tmp).read_text(encoding="utf-8"))
        if not _valid_traces(data, version):
            raise SourceError("tracing op_db gave an unexpected file")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return data, ("traced now" + (f"; {note}" if note else ""))


# -- attributing PyTorch's verdicts to aten ops ---------------------------------


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Why PyTorch expects an ``(aten op, dtype)`` to fail on MPS."""

    opinfo: str
    dtype: str
    source: str  # "common_mps.py UNIMPLEMENTED_XFAILLIST" or "op_db dtypesIfMPS"
    comment: str

    def describe(self) -> str:
        """One line for the audit's ``why``."""
        text = f"PyTorch's MPS tests expect OpInfo {self.opinfo!r} to fail at "
        text += f"{self.dtype} ({self.source})"
        return text + (f": {self.comment}" if self.comment else "")


@dataclasses.dataclass
class Attribution:
    """``(op, dtype)`` keys PyTorch expects to fail, and what could not be mapped."""

    blamed: dict[str, Evidence]
    unattributed: list[tuple[str, str]]
    lacking: int


def attribute(
    traces: Mapping[str, Any],
    lists: MpsLists,
    macos: tuple[int, int],
    explained: Callable[[str], bool] = lambda key: False,
) -> Attribution:
    """Map each (OpInfo, dtype) PyTorch expects to fail onto the keys to blame.

    A failure that one of its keys already explains (``explained(key)``: the
    op table, an argument rule or a dtype says it fails) blames nothing more:
    its other ops ran in it innocently.
    """
    lacking: dict[tuple[str, str], tuple[str, str]] = {}
    running: set[str] = set()
    for key, entry in traces["opinfos"].items():
        mps = set(entry["mps_dtypes"])
        own = entry.get("consistency", {})
        for dtype, keys in entry["ops"].items():
            if dtype in entry["errors"]:
                continue  # the sample raises on the CPU: no word on its ops
            verdict = lists.verdict(key, dtype, macos)
            if verdict is None or own.get(dtype) == "skip":
                continue
            fails, source = verdict
            if fails:
                comment = lists.comment(source, key)
                lacking[(key, dtype)] = (f"common_mps.py {source}", comment)
            elif own.get(dtype) == "xfail":
                lacking[(key, dtype)] = (_OWN_XFAIL, "")
            elif dtype not in mps:
                lacking[(key, dtype)] = ("op_db dtypesIfMPS leaves it out", "")
            else:
                running.update(keys)
    blamed: dict[str, Evidence] = {}
    unattributed: list[tuple[str, str]] = []
    for (key, dtype), (source, comment) in sorted(lacking.items()):
        keys = traces["opinfos"][key]["ops"][dtype]
        if any(explained(k) for k in keys):
            continue
        culprits = [k for k in keys if k not in running]
        if not culprits:
            unattributed.append((key, dtype))
        for culprit in culprits:
            blamed.setdefault(culprit, Evidence(key, dtype, source, comment))
    return Attribution(blamed, unattributed, len(lacking))


def digest(path: Path) -> str:
    """sha256 of a file's bytes (first 16 hex digits)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
