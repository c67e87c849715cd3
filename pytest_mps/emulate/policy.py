"""What MPS does with an op, its tensors and its generator, in PyTorch's own words.

The emulated device (:mod:`.tagged` per torch call, :mod:`.op_rules` per aten
op) asks this module what a Mac would do: run it, run it on the CPU with a
warning, or raise. The
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
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from pytest_mps import ops as mps_ops
from pytest_mps.audit import rules as audit_rules
from pytest_mps.emulate import messages

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


#: The installed emulation's policy (set by :mod:`.install`), or None.
current: list[Policy | None] = [None]


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
        self.warned = False
        self.bad_dtypes = _bad_dtypes(macos)
        self.argument_rules = audit_rules.argument_rules(
            lambda op: self.table.predict(op).outcome, macos
        )

    # -- ops ------------------------------------------------------------------------

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


#: The op table's outcomes acted on; every other one runs as it is.
_ACTED_ON = frozenset({mps_ops.FORCED_FALLBACK, mps_ops.FALLBACK})


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
