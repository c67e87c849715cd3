"""What MPS does with an op, its tensors and its generator, in PyTorch's own words.

The emulated device (:mod:`.tensor`) asks this module, before each aten op,
what a Mac would do: run it, run it on the CPU with a warning, or raise. The
knowledge is the audit's (:mod:`pytest_mps.ops` reads the installed
torch's ``native_functions.yaml``, :mod:`pytest_mps.audit.rules` the argument
rules), so the emulation and ``--mps-audit`` judge alike. The messages are
PyTorch's, each quoted from the source file named beside it.

Placement, as PyTorch checks it on MPS (its codegen adds no device check for
MPS kernels: torchgen/gen.py gives only CUDA and XPU ``device_guard``):

- an op whose kernel is a TensorIterator (the yaml's ``structured_inherits:
  TensorIteratorBase``) checks devices itself and takes 0-dim CPU tensors as
  scalars (TensorIterator.cpp, ``compute_types``);
- any other MPS kernel reads its inputs through MPSGraph placeholders, which
  refuse a CPU tensor (OperationUtils.mm, ``Placeholder::Placeholder``). Some
  check devices first in their own words (``where_self_out_mps`` in
  TensorCompare.mm); those get the placeholder's message here.

0-dim CPU tensors pass as scalars (the mixed-device guard notes them), except
in the kernels that bind every input as a Metal buffer
(:data:`pytest_mps.watch.device_mix.BUFFER_KERNELS`: ``lerp``), where a Mac
crashes or reads a wrong buffer and the emulation raises, saying so.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]

from pytest_mps import ops as mps_ops
from pytest_mps.audit import rules as audit_rules
from pytest_mps.emulate import messages
from pytest_mps.watch.device_mix import written_positions

MPS = torch.device("mps", 0)
CPU = torch.device("cpu")


#: PyTorch's variable, read once when torch loads (MPSFallback.mm: a static).
VARIABLE = "PYTORCH_ENABLE_MPS_FALLBACK"


def fallback_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``PYTORCH_ENABLE_MPS_FALLBACK`` turns the CPU fallback on.

    MPSFallback.mm: unset or ``std::stoi(value) == 0`` raises; any other
    number falls back (a non-number makes ``std::stoi`` throw when torch loads;
    here it counts as off).
    """
    number = re.match(r"\s*[+-]?(\d+)", environ.get(VARIABLE) or "")
    return number is not None and int(number.group(1)) != 0


class Call:
    """The torch API call the user's code is making now (one per thread).

    The emulation tells a CPU tensor the user passed (a bug on a Mac) from one
    PyTorch made inside a call from the tensors' options (``at::ones(...,
    q.options())`` in attention's math path): on the CPU both are plain CPU
    tensors, on a Mac only the first is. A plain CPU tensor counts as the
    user's when it shares storage with a CPU tensor among the arguments of
    the outermost torch call (:mod:`.calls` notes it), as views and reshapes
    of the argument do.
    """

    __slots__ = ("args", "func", "kwargs", "storages")

    def __init__(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]):
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.storages: frozenset[int] | None = None

    def user_storages(self) -> frozenset[int]:
        """The storages of the plain CPU tensors among the call's arguments."""
        if self.storages is None:
            from torch.utils._pytree import tree_leaves

            found = set()
            for leaf in tree_leaves((self.args, self.kwargs)):
                # a Parameter too (a model left on the CPU); an emulated
                # tensor says mps
                if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu":
                    # an uninitialized parameter (a lazy module's, in
                    # deepcopy's memo) has no storage to read
                    if leaf.layout == torch.strided and not isinstance(
                        leaf, UninitializedTensorMixin
                    ):
                        found.add(leaf.untyped_storage().data_ptr())
            found.discard(0)
            self.storages = frozenset(found)
        return self.storages


_local = threading.local()


def current_call() -> Call | None:
    """The outermost torch call of this thread, if :mod:`.calls` saw one."""
    return getattr(_local, "call", None)


def set_current_call(call: Call | None) -> None:
    """Note (or clear) the outermost torch call of this thread."""
    _local.call = call


def exempt_positions() -> dict[Any, frozenset[int] | None]:
    """Ops that take CPU tensors on purpose, with the argument positions.

    Copies move data between devices, as the mixed-device guard knows them
    (None: every argument); advanced
    indexing moves CPU indices to the indexed tensor's device
    (TensorAdvancedIndexing.cpp, ``make_info``).
    """
    from pytest_mps.watch.device_mix import exempt_ops, host_positions

    # the mixed-device guard's own lists: copies (and the attention backwards
    # taking their seed on the host), then indices and fill values
    found: dict[Any, frozenset[int] | None] = dict.fromkeys(exempt_ops())
    found.update(host_positions())
    return found


class Policy:
    """The emulated Mac: its op table, fallback setting and macOS version."""

    def __init__(
        self,
        table: mps_ops.OpTable,
        fallback: bool,
        macos: tuple[int, int],
    ) -> None:
        self.table = table
        self.fallback = fallback
        self.macos = macos
        self.sha = torch.version.git_version
        self.exempt = exempt_positions()
        #: Per aten op, by id (see tensor._Op): the op itself, its name, its
        #: argument rule (or None), its outcome.
        self.verdicts: dict[int, tuple[Any, str, Any, str]] = {}
        self.warned = False
        self.bad_dtypes = _bad_dtypes(macos)
        self.argument_rules = audit_rules.argument_rules(
            lambda op: self.table.predict(op).outcome, macos
        )

    # -- ops ------------------------------------------------------------------------

    def check_op(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        """Raise or warn as MPS would before running ``func``; return to run it."""
        __tracebackhide__ = True
        known = self.verdicts.get(id(func))
        if known is None:
            prediction = self.table.predict(func.name())
            known = self.verdicts[id(func)] = (
                func,
                prediction.op.removesuffix(".default"),
                self.argument_rules.get(prediction.op),
                prediction.outcome,
            )
        _, name, rule, outcome = known
        if rule is not None:
            call = current_call()
            seen = (call.func, call.args, call.kwargs) if call is not None else None
            verdict = rule(args, kwargs, seen)
            if verdict is not None:
                self.apply(verdict, name)
            return
        if outcome in _ACTED_ON:
            self._apply_outcome(outcome, name)

    def apply(self, verdict: audit_rules.Verdict, op: str) -> None:
        """Act on an argument or call rule's verdict for ``op``."""
        __tracebackhide__ = True
        if verdict.outcome == mps_ops.RAISES:
            raise raised(verdict)
        self._apply_outcome(verdict.outcome, op)

    def _apply_outcome(self, outcome: str, op: str) -> None:
        __tracebackhide__ = True
        if outcome == mps_ops.FORCED_FALLBACK:
            self.warn_fallback(op)
        elif outcome == mps_ops.FALLBACK:
            if not self.fallback:
                raise NotImplementedError(
                    messages.NOT_IMPLEMENTED.format(op=op, sha=self.sha)
                )
            self.warn_fallback(op)

    def warn_fallback(self, op: str) -> None:
        """PyTorch's fallback warning: once per process, unless warn-always is on.

        ``TORCH_WARN_ONCE`` keeps one flag per call site, and every op falls
        back through the one ``mps_fallback`` function.
        """
        if self.warned and not torch.is_warn_always_enabled():
            return
        self.warned = True
        warnings.warn(
            messages.FALLBACK_WARNING.format(op=op), UserWarning, stacklevel=2
        )

    # -- placement ------------------------------------------------------------------

    def check_placement(
        self,
        func: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        is_emulated: Any,
    ) -> None:
        """Raise as MPS would for an op mixing the device with CPU tensors."""
        __tracebackhide__ = True
        exempt = self.exempt.get(func, frozenset())
        if exempt is None:
            return
        mutated = written_positions(func)
        call = current_call()
        self._check_buffer_scalars(func, args, kwargs, is_emulated)
        operands: list[tuple[torch.device, bool]] = []  # (device, is an output)
        bad = False
        for position, value in enumerate(args):
            values = value if isinstance(value, (list, tuple)) else (value,)
            for item in values:
                if not isinstance(item, torch.Tensor):
                    continue
                if is_emulated(item):
                    operands.append((MPS, position in mutated))
                    continue
                if position in exempt:
                    continue
                output = position in mutated
                where = _placement_of(item, output, call)
                if where is None:
                    operands.append((MPS, output))
                    continue
                operands.append((where, output))
                bad = bad or where != MPS
        for name, value in kwargs.items():
            if isinstance(value, torch.Tensor) and is_emulated(value):
                operands.append((MPS, name == "out"))
            elif isinstance(value, torch.Tensor):
                output = name == "out"
                where = _placement_of(value, output, call)
                if where is not None:
                    operands.append((where, output))
                    bad = True
        if not bad:
            return
        name = func.name().removeprefix("aten::").removesuffix(".default")
        same_gpu = messages.SAME_GPU.get(name.removesuffix(".out"))
        if same_gpu is not None:
            raise RuntimeError(_not_on_gpu(same_gpu, args, kwargs, call, is_emulated))
        if name in self.table.iterators:
            # outputs come first in a TensorIterator's operands
            ordered = [d for d, out in operands if out] + [
                d for d, out in operands if not out
            ]
            first = ordered[0]
            second = next((d for d in ordered if d != first), None)
            if second is not None:
                raise RuntimeError(
                    messages.TWO_DEVICES.format(first=first, second=second)
                )
        raise RuntimeError(messages.PLACEHOLDER)

    def _check_buffer_scalars(
        self,
        func: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        is_emulated: Any,
    ) -> None:
        """Raise for a user's 0-dim CPU tensor in a kernel that binds buffers."""
        __tracebackhide__ = True
        from pytest_mps.watch.device_mix import buffer_kernel

        source = buffer_kernel(func)
        if source is None:
            return
        schema = func._schema
        names = [a.name for a in schema.arguments]
        named = [*zip(names, args, strict=False), *kwargs.items()]
        for name, value in named:
            if (
                isinstance(value, torch.Tensor)
                and not is_emulated(value)
                and value.dim() == 0
                and on_host(value)
            ):
                op = f"{schema.name}.{schema.overload_name or 'default'}"
                raise RuntimeError(
                    messages.BUFFER_SCALAR.format(op=op, argument=name, source=source)
                )

    # -- dtypes and generators ----------------------------------------------------

    def dtype_error(self, dtype: torch.dtype) -> TypeError | None:
        """PyTorch's TypeError for a tensor of ``dtype`` on MPS, or None."""
        message = self.bad_dtypes.get(dtype)
        return TypeError(message) if message is not None else None

    def check_generator(self, generator: Any, device: torch.device) -> None:
        """Raise when ``generator`` belongs to another device type than ``device``."""
        __tracebackhide__ = True
        if generator is None:
            return
        found = generator.device.type
        if found != device.type:
            raise RuntimeError(messages.GENERATOR.format(want=device.type, found=found))


#: The op table's outcomes check_op acts on; every other one runs as it is.
_ACTED_ON = frozenset({mps_ops.FORCED_FALLBACK, mps_ops.FALLBACK})


def _not_on_gpu(
    checked: tuple[str, tuple[str, ...]],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    call: Call | None,
    is_emulated: Any,
) -> str:
    """The text of checkAllSameGPU: the first tensor against each other one."""
    where, names = checked
    out = kwargs.get("out")
    on_cpu = [
        (
            "argument 'out'",
            isinstance(out, torch.Tensor)
            and not is_emulated(out)
            and _placement_of(out, True, call) == CPU,
        )
    ]
    for position, name in enumerate(names):
        value = args[position] if position < len(args) else kwargs.get(name)
        cpu = (
            isinstance(value, torch.Tensor)
            and not is_emulated(value)
            and _placement_of(value, False, call) == CPU
        )
        on_cpu.append((f"argument #{position + 1} '{name}'", cpu))
    return messages.same_gpu(where, on_cpu)


def _placement_of(
    tensor: torch.Tensor, output: bool, call: Call | None
) -> torch.device | None:
    """Where a plain tensor counts as living: the CPU, or None for "the device".

    A 0-dim CPU input is a scalar MPS takes; a CPU tensor that PyTorch made
    inside the user's call (not sharing storage with the call's arguments)
    would have been made on MPS on a Mac. With no call seen (TorchScript runs
    its ops below the torch-function modes, and its ``x.device`` is the C++
    device, the CPU) where a tensor came from cannot be told: the tensor is
    not judged, rather than failing code a Mac runs.
    """
    if tensor.device.type != "cpu":
        return tensor.device
    if tensor.dim() == 0 and not output:
        return None
    if call is None:
        return None
    if tensor.layout == torch.strided:
        storage = tensor.untyped_storage().data_ptr()
        if storage not in call.user_storages():
            return None
    return CPU


def on_host(tensor: torch.Tensor) -> bool:
    """True when a plain CPU tensor would be on the host on a Mac as well.

    The mixed-device guard's view of :func:`_placement_of`: a 0-dim CPU
    tensor the user passed is still a host tensor there (pytorch#142048).
    """
    if type(tensor) is not torch.Tensor or tensor.device.type != "cpu":
        return tensor.device.type == "cpu"
    call = current_call()
    if call is None or tensor.layout != torch.strided:
        return True
    return tensor.untyped_storage().data_ptr() in call.user_storages()


def raised(verdict: audit_rules.Verdict) -> Exception:
    """The exception for a rule that says MPS raises.

    Where the rule knows PyTorch's own message and exception (adaptive
    pooling's NotImplementedError) they are raised as they are; otherwise the
    rule's own words, marked as the emulation's, since the text a Mac prints
    is not known.
    """
    if verdict.message:
        kind = (
            NotImplementedError
            if verdict.error == "NotImplementedError"
            else (TypeError if verdict.error == "TypeError" else RuntimeError)
        )
        return kind(verdict.message)
    return RuntimeError(
        f"MPS (emulated by pytest-mps): {verdict.rule} [{verdict.source}]"
    )


def _bad_dtypes(macos: tuple[int, int]) -> dict[torch.dtype, str]:
    """Every dtype MPS cannot hold on ``macos``, with PyTorch's message."""
    found: dict[torch.dtype, str] = {}
    for value in vars(torch).values():
        if not isinstance(value, torch.dtype) or value in found:
            continue
        message = mps_ops.dtype_problem(value)
        if message is not None:
            found[value] = message
    if macos < (14, 0):
        found[torch.bfloat16] = messages.BFLOAT16_MACOS
        for name, message in audit_rules.MACOS_14_DTYPES.items():
            dtype = getattr(torch, name.removeprefix("torch."))
            found.setdefault(dtype, message)
    return found
