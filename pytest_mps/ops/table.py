"""The classified op table of one torch install, cached in-process and on disk.

:func:`load_table` parses the yaml once per torch version and yaml sha256 (about
a second with torchgen) and keeps the result in memory and in a JSON file
under :func:`cache_dir`; :class:`OpTable` predicts each op's outcome on a
backend.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_mps.ops.yaml_rules import (
    _CACHE_FORMAT,
    _COMPOSITE_KEYS,
    COMPOSITE,
    CORRECTIONS,
    FALLBACK,
    FORCED_FALLBACK,
    IGNORED_NAMESPACES,
    LIKELY,
    MPS_KERNEL,
    ROUTED,
    ROUTED_PREFIXES,
    UNKNOWN,
    Prediction,
    _outcome_of,
    classify,
    tensor_iterator_ops,
    torch_version,
    yaml_paths,
)


def cache_dir() -> Path:
    """``$PYTEST_MPS_CACHE_DIR``, else the platform's user cache dir + pytest-mps."""
    explicit = os.environ.get("PYTEST_MPS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "pytest-mps"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-mps"


@dataclasses.dataclass
class OpTable:
    """The classified yaml of one torch install, and where it came from."""

    codes: dict[str, str]
    torch_version: str
    yaml_sha256: str
    seconds: float
    source: str  # "parsed", "cache file", or "memory"
    version: tuple[int, int] = (0, 0)
    #: Overloads whose kernel is a TensorIterator (:func:`tensor_iterator_ops`).
    iterators: frozenset[str] = frozenset()
    #: The backend ``codes`` were classified for; corrections and routing are
    #: facts about MPS and apply only to it.
    backend: str = "MPS"
    _predictions: dict[str, Prediction] = dataclasses.field(default_factory=dict)

    def predict(self, op: str) -> Prediction:
        """Predict MPS's handling of ``op`` (``aten::add.Tensor`` or ``add.Tensor``)."""
        cached = self._predictions.get(op)
        if cached is None:
            cached = self._predictions[op] = self._predict(op)
        return cached

    def _predict(self, op: str) -> Prediction:
        namespace, sep, name = op.partition("::")
        if not sep:
            namespace, name = "aten", op
        if name.endswith(".default"):
            name = name[: -len(".default")]
        full = f"{namespace}::{name}"
        mps = self.backend == "MPS"
        if namespace != "aten" or name not in self.codes:
            if namespace in IGNORED_NAMESPACES:
                return Prediction(full, COMPOSITE, "bookkeeping op, runs no kernel")
            registered = _registered_outcome(full) if mps else None
            if registered is not None:
                return registered
            return Prediction(
                full, UNKNOWN, "not in aten's native_functions.yaml", "", LIKELY
            )
        for fix in CORRECTIONS if mps else ():
            if (
                fix.op == name
                and fix.applies_to(self.version)
                and fix.contradicted_by(self.codes) is None
            ):
                return Prediction(
                    full, fix.outcome, f"correction: {fix.why}", fix.source
                )
        code = self.codes[name]
        outcome, rule = _outcome_of(code)
        if mps and outcome == FALLBACK:
            if name.startswith(ROUTED_PREFIXES):
                return Prediction(full, ROUTED, "device-specific kernel; " + rule)
            forward = name.partition(".")[0].removesuffix("_backward")
            if forward != name.partition(".")[0] and self.codes.get(
                forward, ""
            ).startswith("composite:"):
                # torch 2.11: native_group_norm is CPU/CUDA plus a composite
                # math_group_norm, which MPS runs; autograd then differentiates
                # its parts and never calls native_group_norm_backward there
                return Prediction(
                    full,
                    ROUTED,
                    f"the backward of {forward}, which MPS runs through its "
                    "composite kernel (autograd differentiates its parts)",
                )
            # a structured op whose delegate got an MPS kernel from Python
            target = code.partition(":")[2] if code.startswith("none:") else name
            if _python_mps_kernel(f"aten::{target}"):
                return Prediction(
                    full,
                    MPS_KERNEL,
                    f"MPS kernel for {target} registered from Python",
                    "dispatcher (torch.library registration)",
                )
            if code.startswith("composite-out:"):
                return Prediction(full, outcome, rule, certainty=LIKELY)
        return Prediction(full, outcome, rule)

    def contradictions(self) -> list[str]:
        """Corrections this torch's own yaml contradicts (left unapplied), with why."""
        if self.backend != "MPS":
            return []
        found = (fix.contradicted_by(self.codes) for fix in CORRECTIONS)
        return [why for why in found if why is not None]

    def counts(self) -> dict[str, int]:
        """How many overloads each rule outcome covers, corrections applied."""
        result: dict[str, int] = {}
        for name in self.codes:
            outcome = self.predict(name).outcome
            result[outcome] = result.get(outcome, 0) + 1
        return result


def _python_mps_kernel(op: str) -> bool:
    """True when the dispatcher holds an MPS kernel for ``op`` off a Mac.

    A CPU-only build compiles no MPS kernels, so any it holds were registered
    from Python (``torch.library.Library("aten", "IMPL", "MPS")``). On a Mac
    every MPS kernel is there; the yaml said none, so it is also right.
    """
    from pytest_mps import backend as shim

    try:
        return shim.has_kernel(op.removesuffix(".default"), "MPS")
    except RuntimeError:  # an op of the yaml this build does not register
        return False


def _registered_outcome(op: str) -> Prediction | None:
    """What the dispatcher says of an op outside aten's yaml (``torch.library``)."""
    from pytest_mps import backend as shim

    name = op.removesuffix(".default")
    source = "dispatcher (torch.library registration)"
    try:
        if shim.has_kernel(name, "MPS"):
            return Prediction(op, MPS_KERNEL, "MPS kernel registered", source)
        for key in (*_COMPOSITE_KEYS, "CompositeImplicitAutogradNestedTensor"):
            if shim.has_kernel(name, key):
                return Prediction(op, COMPOSITE, f"{key} kernel registered", source)
    except RuntimeError:
        return None
    return None


def _read_cache(path: Path) -> tuple[dict[str, str], list[str]] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != _CACHE_FORMAT:
        return None
    codes, iterators = data.get("codes"), data.get("iterators")
    if not isinstance(codes, dict) or not isinstance(iterators, list):
        return None
    return codes, iterators


def _write_cache(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically (temp file + rename) so parallel workers never read halves."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs the next run a parse


_memory: dict[str, OpTable] = {}


def cache_file(directory: Path, version: str, sha: str) -> Path:
    """The cache file for one torch version and yaml digest."""
    stem = "".join(c if c.isalnum() or c in ".-" else "_" for c in version)
    return directory / f"mps-ops-{stem}-{sha[:16]}.json"


def load_table(directory: Path | None = None, *, use_cache: bool = True) -> OpTable:
    """The installed torch's op table: from memory, the cache file, or a parse."""
    import torch

    start = time.perf_counter()
    yaml_path, tags_path = yaml_paths()
    sha = hashlib.sha256(yaml_path.read_bytes()).hexdigest()
    key = f"{torch.__version__}-{sha}"
    if use_cache and key in _memory:
        seconds = time.perf_counter() - start
        return dataclasses.replace(_memory[key], source="memory", seconds=seconds)
    path = cache_file(directory or cache_dir(), torch.__version__, sha)
    cached = _read_cache(path) if use_cache else None
    source = "cache file"
    if cached is None:
        from torchgen.gen import parse_native_yaml

        parsed = parse_native_yaml(str(yaml_path), str(tags_path))
        cached = classify(parsed, "MPS"), tensor_iterator_ops(parsed)
        source = "parsed"
        payload = {"format": _CACHE_FORMAT, "torch": torch.__version__, "sha256": sha}
        _write_cache(path, {**payload, "codes": cached[0], "iterators": cached[1]})
    codes, iterators = cached
    table = OpTable(
        codes,
        torch.__version__,
        sha,
        time.perf_counter() - start,
        source,
        torch_version(),
        frozenset(iterators),
    )
    _memory[key] = table
    return table


def dispatcher_outcome(op: str, backend: str = "MPS") -> str:
    """The dispatcher's truth for ``op`` on ``backend``, in the outcomes above.

    Needs a torch built with ``backend`` (MPS: a Mac) to say anything useful
    about it; on Linux it answers for ``CPU``.
    """
    from pytest_mps import backend as shim

    name = op if "::" in op else f"aten::{op}"
    name = name.removesuffix(".default")
    if shim.has_kernel(name, backend):
        if backend == "MPS" and "MPSFallback" in shim.computed_kernel(name):
            return FORCED_FALLBACK
        return MPS_KERNEL
    if any(shim.has_kernel(name, key) for key in _COMPOSITE_KEYS):
        return COMPOSITE
    return FALLBACK


def compare_with_dispatcher(
    table: OpTable, ops: Iterable[str], backend: str = "MPS"
) -> list[dict[str, str]]:
    """The ops whose prediction differs from the dispatcher's registrations.

    Routed and unknown ops are not compared: they make no claim about MPS.
    """
    differences = []
    for op in sorted(set(ops)):
        predicted = table.predict(op)
        if predicted.outcome in (ROUTED, UNKNOWN) or not op.startswith("aten::"):
            continue
        truth = dispatcher_outcome(op, backend)
        if truth == COMPOSITE and predicted.outcome == FALLBACK:
            # torchgen gives a structured op a CompositeExplicitAutogradNon-
            # Functional wrapper that runs its delegate (torch 2.14:
            # _scaled_grouped_mm_v2 over a CUDA-only .out): without the
            # delegate's kernel it still falls back
            code = table.codes.get(predicted.op.removeprefix("aten::"), "")
            if code.startswith("none:") and (
                dispatcher_outcome(f"aten::{code[5:]}", backend) == FALLBACK
            ):
                continue
        if truth != predicted.outcome:
            differences.append(
                {
                    "op": predicted.op,
                    "predicted": predicted.outcome,
                    "rule": predicted.rule,
                    "dispatcher": truth,
                }
            )
    return differences
