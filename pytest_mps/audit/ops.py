"""What MPS would do with each aten op, read from the installed torch's own yaml.

Every torch wheel ships ``torchgen/packaged/ATen/native/native_functions.yaml``,
the table the dispatcher registrations are generated from. The rules, applied
to one op overload in this order (``classify``):

1. ``explicit``: its ``dispatch:`` lists ``MPS``: an MPS kernel.
2. ``structured``: it has a ``structured_delegate`` (``add.Tensor`` delegates to
   ``add.out``) and the delegate lists ``MPS``: codegen registers MPS kernels
   for the functional and in-place variants too. A delegate without ``MPS``
   gives no kernel (but see 3: ``all.dims`` has one of each).
3. ``composite``: its dispatch lists ``CompositeImplicitAutograd`` (also the
   default when an op has neither ``dispatch:`` nor a delegate),
   ``CompositeExplicitAutograd`` or ``CompositeExplicitAutogradNonFunctional``:
   one kernel for every backend without a kernel of its own, built from other
   ops, also beside a delegate that lacks the backend.
   A ``CompositeExplicitAutograd`` functional whose out= or in-place sibling
   has no MPS kernel (``frexp.Tensor`` -> ``frexp.Tensor_out``, ``put`` ->
   ``put_``) is ``composite-out``: its one kernel allocates and calls that
   sibling, so on MPS it falls back (``likely``: the yaml does not say which
   sibling the kernel calls).
4. ``none``: none of these: MPS runs PyTorch's boxed fallback, which moves the
   op to the CPU under ``PYTORCH_ENABLE_MPS_FALLBACK=1`` and raises
   NotImplementedError otherwise (aten/src/ATen/mps/MPSFallback.mm).

Before the yaml, ``predict`` asks the dispatcher for MPS kernels registered
from Python (``torch/_refs/linalg``: ``linalg_lu_solve.out``): a CPU-only
build knows them too.

``predict`` then applies, in order: the dated ``CORRECTIONS`` (ops the yaml
gets wrong for MPS), ``ROUTED_PREFIXES`` (device-specific implementations a
CPU or CUDA run reaches that MPS never calls), and ``unknown`` for ops outside
the aten yaml. The same rules run for any backend key: on CPU they agree with
the dispatcher's own registrations for every overload (tests/test_audit_ops.py).

Parsing the yaml with torchgen costs about a second, so the result is cached
in-process and in a JSON file under the user's cache directory, keyed by torch
version and the yaml's sha256; runs without ``--mps-audit`` never load it.
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

MPS_KERNEL = "mps"
COMPOSITE = "composite"
ROUTED = "routed"
FALLBACK = "fallback"
FORCED_FALLBACK = "forced_fallback"
UNKNOWN = "unknown"
RAISES = "raises"
EXPECTED_FAIL = "expected to fail"

#: Outcomes that mean the op would raise on MPS (or leave it, given the variable).
PROBLEMS = frozenset({FALLBACK, RAISES, EXPECTED_FAIL})

#: Certainty of a prediction: read from PyTorch's own tables (yaml, dispatcher,
#: MPS test lists), or inferred by a rule.
CERTAIN = "certain"
LIKELY = "likely"

#: What each outcome means for a user, as printed in the audit.
MEANING = {
    MPS_KERNEL: "runs on MPS",
    COMPOSITE: "composite: runs on any backend",
    ROUTED: "device-specific; MPS takes another path",
    FALLBACK: "falls back to CPU (raises without PYTORCH_ENABLE_MPS_FALLBACK=1)",
    FORCED_FALLBACK: "runs on the CPU even on MPS (MPSFallback.mm): works, slowly",
    UNKNOWN: "not in aten's native_functions.yaml; not predicted",
    RAISES: "raises on MPS for these arguments",
    EXPECTED_FAIL: "PyTorch's own MPS tests expect it to fail at this dtype",
}

_COMPOSITE_KEYS = (
    "CompositeImplicitAutograd",
    "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
)

#: Cache-file layout version; bump when the stored table changes shape.
_CACHE_FORMAT = 4


@dataclasses.dataclass(frozen=True)
class Correction:
    """One op whose MPS behaviour the yaml does not tell, for a range of versions."""

    op: str
    outcome: str
    why: str
    source: str
    since: tuple[int, int] | None = None
    before: tuple[int, int] | None = None
    checked: str = "2026-11-22"
    #: An overload whose missing MPS kernel the correction works around: once
    #: the installed yaml gives it one, the correction no longer holds.
    until_kernel: str | None = None

    def applies_to(self, version: tuple[int, int]) -> bool:
        """True when ``version`` (major, minor) lies in ``[since, before)``."""
        if self.since is not None and version < self.since:
            return False
        return self.before is None or version < self.before

    def contradicted_by(self, codes: dict[str, str]) -> str | None:
        """Why the installed yaml (``codes``) contradicts this correction, or None."""
        if self.until_kernel is None:
            return None
        code = codes.get(self.until_kernel, "none")
        if code == "explicit" or code.startswith("structured"):
            return (
                f"{self.op}: the correction ({self.why}) works around "
                f"{self.until_kernel} having no MPS kernel, and this torch's "
                "native_functions.yaml gives it one: not applied"
            )
        return None


# Sources: pytorch/pytorch aten/src/ATen/mps/MPSFallback.mm at two stored
# revisions. @035290b is the newer (its error text cites pytorch#141287, filed
# late 2024); @33ce581 the older (c10::optional, cites pytorch#77764).
_FALLBACK_NEW = "MPSFallback.mm @035290b registers mps_fallback"
_FALLBACK_OLD = "MPSFallback.mm @33ce581 registers mps_fallback (gone in @035290b)"

#: Ops the yaml's rules get wrong for MPS. Mostly ops registered with
#: MPSFallback.mm's ``mps_fallback`` directly, so they run on
#: the CPU even without PYTORCH_ENABLE_MPS_FALLBACK (and override the composite
#: kernel the yaml gives linalg_svd and upsample_nearest3d.vec). No upper bound
#: where the newest source read (@035290b) still lists the op: a Mac owner
#: confirms with ``pytest --mps --mps-audit-check``.
CORRECTIONS: tuple[Correction, ...] = (
    Correction("embedding_renorm_", FORCED_FALLBACK, "no MPS key", _FALLBACK_NEW),
    # MPSFallback.mm's svd fallback stands in for a missing _linalg_svd.U kernel;
    # torch 2.14's yaml has one (native MPS SVD, pytorch PR #185954).
    Correction(
        "linalg_svd",
        FORCED_FALLBACK,
        "MPSFallback.mm",
        _FALLBACK_NEW,
        until_kernel="_linalg_svd.U",
    ),
    Correction(
        "linalg_svd.U",
        FORCED_FALLBACK,
        "MPSFallback.mm",
        _FALLBACK_NEW,
        until_kernel="_linalg_svd.U",
    ),
    Correction(
        "upsample_nearest3d.vec", FORCED_FALLBACK, "MPSFallback.mm", _FALLBACK_NEW
    ),
    # The yaml of 2.8+ lists an MPS col2im (pytorch#152282, 2025-04-27) but
    # @035290b still registers the fallback for it; 2.6.0 fell back
    # (pytorch#151820). Which registration wins on 2.8+ is for --mps-audit-check.
    Correction(
        "col2im",
        FORCED_FALLBACK,
        "MPSFallback.mm; fallback seen on 2.6.0 in pytorch#151820",
        _FALLBACK_NEW,
        before=(2, 8),
    ),
    # Native im2col arrived with pytorch#135706 (2024-09-11); first release
    # assumed 2.6, the bound is approximate.
    Correction(
        "im2col", FORCED_FALLBACK, "MPSFallback.mm", _FALLBACK_OLD, None, (2, 6)
    ),
    Correction(
        "bitwise_left_shift.Tensor_out",
        FORCED_FALLBACK,
        "MPSFallback.mm",
        _FALLBACK_OLD,
        None,
        (2, 6),
    ),
    Correction(
        "bitwise_right_shift.Tensor_out",
        FORCED_FALLBACK,
        "MPSFallback.mm",
        _FALLBACK_OLD,
        None,
        (2, 6),
    ),
    # The composite-out rule (3 above) guesses which sibling a composite kernel
    # calls; mvlgamma's calls none: UnaryOps.cpp builds it from arange, add,
    # lgamma_ and sum (and mvlgamma.out calls it, not the other way round).
    # Before 2.13 mvlgamma.out had no MPS key, and the rule called mvlgamma a
    # fallback that PyTorch's 2.11 MPS tests run (benchmarks/audit_accuracy.py).
    Correction(
        "mvlgamma",
        COMPOSITE,
        "its composite kernel builds on arange, add, lgamma_ and sum",
        "aten/src/ATen/native/UnaryOps.cpp, mvlgamma",
        checked="2026-11-24",
    ),
)

#: Device-specific implementations that a composite above them picks by device:
#: ``scaled_dot_product_attention`` calls ``_scaled_dot_product_flash_attention_
#: for_cpu`` on CPU and ``_scaled_dot_product_attention_math_for_mps`` (or the
#: composite math path when grads are needed) on MPS
#: (aten/src/ATen/native/transformers/attention.cpp, ``case SDPBackend::math``);
#: convolutions and RNNs pick cuDNN/MIOpen/oneDNN/NNPACK kernels the same way.
#: Seen on CPU or CUDA, they say nothing about MPS.
ROUTED_PREFIXES = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
    "_flash_attention_",
    "_efficient_attention_",
    "_cudnn_",
    "cudnn_",
    "miopen_",
    "_miopen_",
    "mkldnn_",
    "_mkldnn_",
    "_nnpack_",
)

#: Namespaces of bookkeeping ops that run no kernel (record_function markers).
IGNORED_NAMESPACES = frozenset({"profiler"})

#: The dtypes MPS tensors can hold: getMPSDataType in
#: aten/src/ATen/native/mps/OperationUtils.mm (pytorch/pytorch @001d046, read
#: 2026-11-22) maps exactly these; bfloat16 and complex need macOS 14.
MPS_DTYPES = frozenset(
    {
        "torch.float32",
        "torch.float16",
        "torch.bfloat16",
        "torch.int32",
        "torch.int64",
        "torch.int16",
        "torch.int8",
        "torch.uint8",
        "torch.bool",
        "torch.complex32",
        "torch.complex64",
        "torch.uint64",
        "torch.uint32",
        "torch.uint16",
    }
)

#: aten/src/ATen/mps/EmptyTensor.cpp, MPS_ERROR_DOUBLE_NOT_SUPPORTED (TypeError).
FLOAT64_MESSAGE = (
    "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't "
    "support float64. Please use float32 instead."
)

_SCALAR_TYPE_NAMES = {"torch.complex128": "ComplexDouble"}


def dtype_problem(dtype: object) -> str | None:
    """PyTorch's error for a tensor of ``dtype`` on MPS, or None when MPS holds it."""
    name = str(dtype)
    if name in MPS_DTYPES:
        return None
    if name == "torch.float64":
        return FLOAT64_MESSAGE
    # OperationUtils.mm getMPSDataType, default case (TORCH_CHECK_TYPE).
    scalar = _SCALAR_TYPE_NAMES.get(name, name.removeprefix("torch."))
    return (
        f"Trying to convert {scalar} to the MPS backend but it does not have "
        "support for that dtype."
    )


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What MPS would do with one op overload, which rule said so, and from what."""

    op: str
    outcome: str
    rule: str
    source: str = "native_functions.yaml"
    certainty: str = CERTAIN

    @property
    def problem(self) -> bool:
        """True when the op would fall back to the CPU or raise on MPS."""
        return self.outcome in PROBLEMS


def torch_version() -> tuple[int, int]:
    """The installed torch's (major, minor)."""
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def yaml_paths() -> tuple[Path, Path]:
    """The installed ``native_functions.yaml`` and ``tags.yaml``."""
    import torchgen

    base = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native"
    return base / "native_functions.yaml", base / "tags.yaml"


def classify(parsed: Any, backend: str = "MPS") -> dict[str, str]:
    """Apply rules 1-4 to a ``torchgen.gen.ParsedYaml``: overload name -> rule code.

    Codes: ``explicit``, ``structured:<delegate>``, ``composite:<key>``,
    ``composite-out:<sibling>``, ``none``, ``none:<delegate>`` (a delegate
    without the backend).
    """
    from torchgen.model import DispatchKey

    indices = parsed.backend_indices
    own = indices[DispatchKey.parse(backend)].index
    composites = [(k, indices[DispatchKey.parse(k)].index) for k in _COMPOSITE_KEYS]
    table: dict[str, str] = {}
    siblings: dict[str, list[Any]] = {}
    for f in parsed.native_functions:
        name = f.func.name
        delegate = f.structured_delegate
        composite = next((k for k, idx in composites if name in idx), None)
        if name in own:
            code = "explicit"
        elif delegate is not None and delegate in own:
            code = f"structured:{delegate}"
        elif composite is not None:
            # also a delegate without the backend: all.dims delegates to
            # all.dims_out (CPU, CUDA) and lists CompositeExplicitAutograd
            # all_dims_default, which the dispatcher gives every other backend
            code = f"composite:{composite}"
        elif delegate is not None:
            code = f"none:{delegate}"
        else:
            code = "none"
        table[str(name)] = code
        if f.func.is_out_fn() or name.name.inplace:
            siblings.setdefault(str(name.name.base), []).append(name)
    explicit = "composite:CompositeExplicitAutograd"
    # a runtime consequence, not a registration: only for the MPS prediction
    # (the CPU table must match the CPU dispatcher's registrations)
    for f in parsed.native_functions if backend == "MPS" else ():
        name = f.func.name
        if table[str(name)] != explicit or f.func.is_out_fn() or name.name.inplace:
            continue
        for sibling in siblings.get(str(name.name.base), ()):
            if table[str(sibling)].startswith("none"):
                table[str(name)] = f"composite-out:{sibling}"
                break
    return table


def tensor_iterator_ops(parsed: Any) -> list[str]:
    """Overloads whose kernel is a TensorIterator, by the yaml's own word.

    An out= overload with ``structured_inherits: TensorIteratorBase``, and
    every overload delegating to one (``add.Tensor``, ``add_.Tensor``): the
    shared meta function builds the iterator, whose device check
    (TensorIterator.cpp, ``compute_types``) takes 0-dim CPU tensors as scalars
    on every backend and names both devices when others mix.
    """
    iterators = {
        f.func.name
        for f in parsed.native_functions
        if f.structured and f.structured_inherits == "TensorIteratorBase"
    }
    return sorted(
        str(f.func.name)
        for f in parsed.native_functions
        if f.func.name in iterators or f.structured_delegate in iterators
    )


def _outcome_of(code: str) -> tuple[str, str]:
    kind, _, detail = code.partition(":")
    if kind == "explicit":
        return MPS_KERNEL, "explicit MPS key in native_functions.yaml"
    if kind == "structured":
        return MPS_KERNEL, f"structured_delegate {detail} has an MPS kernel"
    if kind == "composite":
        return COMPOSITE, f"{detail} kernel in native_functions.yaml"
    if kind == "composite-out":
        return FALLBACK, (
            f"its CompositeExplicitAutograd kernel calls {detail}, which has no "
            "MPS kernel"
        )
    if detail:
        return FALLBACK, f"structured_delegate {detail} has no MPS kernel"
    return FALLBACK, "no MPS, structured or composite kernel in native_functions.yaml"


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
