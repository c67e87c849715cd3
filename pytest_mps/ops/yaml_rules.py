"""The rules that classify each op of native_functions.yaml for a backend.

The outcomes, the dated corrections the yaml gets wrong for MPS, the dtypes
MPS holds, and :func:`classify` (the package's docstring gives the rules).
"""

from __future__ import annotations

import dataclasses
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

#: Dtypes MPS holds from a torch release on: dtype -> (major, minor). torch
#: 2.15 lists float8_e4m3fn in the ``dtypesIfMPS`` of gather, scatter, cat,
#: constant_pad_nd and _scaled_mm_v2 (pytorch#194074), read from its wheel's
#: common_methods_invocations.py; 2.14.1's lists none.
MPS_DTYPES_SINCE = {"torch.float8_e4m3fn": (2, 15)}

#: c10's names for the dtypes whose ``str`` does not give it by capitalising
#: (ScalarType.h): the names PyTorch's messages print.
_SCALAR_TYPE_NAMES = {"torch.complex128": "ComplexDouble"}


def mps_dtypes(version: tuple[int, int] | None = None) -> frozenset[str]:
    """The dtypes MPS tensors hold on torch ``version`` (default: the installed)."""
    version = torch_version() if version is None else version
    added = {name for name, since in MPS_DTYPES_SINCE.items() if version >= since}
    return MPS_DTYPES | added


def _scalar_type_name(name: str) -> str:
    """``torch.float8_e4m3fn`` -> ``Float8_e4m3fn``, ``torch.qint8`` -> ``QInt8``."""
    if name in _SCALAR_TYPE_NAMES:
        return _SCALAR_TYPE_NAMES[name]
    bare = name.removeprefix("torch.")
    quantized = bare.startswith("q")
    bare = bare.removeprefix("q")
    for lower, upper in (("uint", "UInt"), ("int", "Int")):
        if bare.startswith(lower):
            bare = upper + bare[len(lower) :]
            break
    else:
        bare = bare[:1].upper() + bare[1:]
    return ("Q" if quantized else "") + bare


def dtype_problem(dtype: object) -> str | None:
    """PyTorch's error for a tensor of ``dtype`` on MPS, or None when MPS holds it."""
    name = str(dtype)
    if name in MPS_DTYPES:
        return None
    if name in MPS_DTYPES_SINCE and name in mps_dtypes():
        return None
    if name == "torch.float64":
        return FLOAT64_MESSAGE
    # OperationUtils.mm getMPSDataType, default case (TORCH_CHECK_TYPE).
    return (
        f"Trying to convert {_scalar_type_name(name)} to the MPS backend but it "
        "does not have support for that dtype."
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
