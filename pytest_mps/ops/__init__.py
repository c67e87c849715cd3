"""Op knowledge: what MPS would do with each aten op, read from the installed torch.

Below both the audit and the emulation, which import it. :mod:`.yaml_rules`
classifies the yaml; :mod:`.table` holds the classified table and its cache.

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

from pytest_mps.ops.table import (
    OpTable,
    cache_dir,
    cache_file,
    compare_with_dispatcher,
    dispatcher_outcome,
    load_table,
)
from pytest_mps.ops.yaml_rules import (
    CERTAIN,
    COMPOSITE,
    CORRECTIONS,
    EXPECTED_FAIL,
    FALLBACK,
    FORCED_FALLBACK,
    IGNORED_NAMESPACES,
    LIKELY,
    MEANING,
    MPS_DTYPES,
    MPS_DTYPES_SINCE,
    MPS_KERNEL,
    PROBLEMS,
    RAISES,
    ROUTED,
    ROUTED_PREFIXES,
    UNKNOWN,
    Correction,
    Prediction,
    classify,
    dtype_problem,
    mps_dtypes,
    tensor_iterator_ops,
    torch_version,
    yaml_paths,
)

__all__ = [
    "CERTAIN",
    "COMPOSITE",
    "CORRECTIONS",
    "EXPECTED_FAIL",
    "FALLBACK",
    "FORCED_FALLBACK",
    "IGNORED_NAMESPACES",
    "LIKELY",
    "MEANING",
    "MPS_DTYPES",
    "MPS_DTYPES_SINCE",
    "MPS_KERNEL",
    "PROBLEMS",
    "RAISES",
    "ROUTED",
    "ROUTED_PREFIXES",
    "UNKNOWN",
    "Correction",
    "OpTable",
    "Prediction",
    "cache_dir",
    "cache_file",
    "classify",
    "compare_with_dispatcher",
    "dispatcher_outcome",
    "dtype_problem",
    "mps_dtypes",
    "load_table",
    "tensor_iterator_ops",
    "torch_version",
    "yaml_paths",
]
