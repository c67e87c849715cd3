"""The first layer that goes wrong: module inputs, outputs and gradients, both sides.

Where the op replay (:mod:`.localize`) cannot judge an op (a device's fused
kernel the CPU lacks, a cuDNN RNN), the layer still can be named. Both sides
run once more with module hooks that copy to the host, for every module
call: its tensor inputs and outputs in the forward, and in the backward the
gradients of those outputs and inputs (tensor hooks, which leave the graph
as it is, so in-place ops after a module still work). A layer is wrong on
its own when what it was given is within tolerance of the reference and what
it gave is not: in the forward, inputs right and outputs wrong; in the
backward, output gradients right and input gradients wrong. Of those, the
innermost is named (pytest-torch's ``localize_divergence`` asks the same of
the forward).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pytest_mps.parity.compare import compare, default_tolerance, dtype_name

if TYPE_CHECKING:
    import torch


class Names:
    """Modules by qualified name, found from the roots the forward calls."""

    def __init__(self, root_name: str) -> None:
        self.root_name = root_name
        self.names: dict[int, str] = {}
        self.keep: list[Any] = []  # the modules named, alive while named
        self.stack: list[tuple[str, str]] = []

    def name(self, module: Any) -> str:
        """``model.blocks.0.attn``: the root by the argument's name, then paths."""
        known = self.names.get(id(module))
        if known is not None:
            return known
        if self.stack:
            prefix = f"{self.stack[-1][0]}.<{type(module).__name__}>"
        else:
            prefix = self.root_name if not self.names else type(module).__name__
        for path, sub in module.named_modules():
            self.names.setdefault(id(sub), f"{prefix}.{path}" if path else prefix)
            self.keep.append(sub)
        return self.names[id(module)]

    def enter(self, module: Any, args: Any) -> None:
        """A forward pre-hook: the module runs now."""
        self.stack.append((self.name(module), type(module).__name__))

    def leave(self, module: Any, args: Any, output: Any) -> None:
        """A forward hook: the module has returned."""
        if self.stack:
            self.stack.pop()


@dataclasses.dataclass
class Call:
    """One module call's tensors, copied to the host, by role."""

    module: str
    kind: str
    depth: int
    inputs: list[torch.Tensor | None] = dataclasses.field(default_factory=list)
    outputs: list[torch.Tensor | None] = dataclasses.field(default_factory=list)
    grad_outputs: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    grad_inputs: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)


def _tensors(value: Any) -> list[torch.Tensor]:
    import torch
    from torch.utils import _pytree

    return [t for t in _pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class LayerRecorder:
    """Every module call's inputs, outputs and their gradients, in call order.

    The inputs are read by a global forward pre-hook; the outputs by a hook
    of each module's own, added at its first call, after the hooks it has:
    PyTorch runs global forward hooks before a module's (``Module._call_impl``),
    so a global one would read an output before the user's hooks change it,
    while the rest of the model receives it after them.
    """

    def __init__(self, root_name: str) -> None:
        self.names = Names(root_name)
        self.calls: list[Call] = []
        self.open: list[Call] = []
        self.handles: dict[int, Any] = {}

    def enter(self, module: Any, args: Any) -> None:
        """Forward pre-hook: copy the inputs, hook their gradients."""
        if id(module) not in self.handles:
            self.handles[id(module)] = module.register_forward_hook(self.leave)
        self.names.enter(module, args)
        name, kind = self.names.stack[-1]
        call = Call(name, kind, len(self.names.stack))
        for i, t in enumerate(_tensors(args)):
            call.inputs.append(_host(t) if t.is_floating_point() else None)
            if t.requires_grad:
                t.register_hook(_keep(call.grad_inputs, i))  # type: ignore[no-untyped-call]
        self.calls.append(call)
        self.open.append(call)

    def leave(self, module: Any, args: Any, output: Any) -> None:
        """Forward hook: copy the outputs, hook their gradients."""
        self.names.leave(module, args, output)
        if not self.open:
            return
        call = self.open.pop()
        for i, t in enumerate(_tensors(output)):
            call.outputs.append(_host(t) if t.is_floating_point() else None)
            if t.requires_grad:
                t.register_hook(_keep(call.grad_outputs, i))  # type: ignore[no-untyped-call]


def _keep(into: dict[int, torch.Tensor], index: int) -> Any:
    def hook(grad: torch.Tensor | None) -> None:
        if grad is not None:  # an output nothing used (a GRU's h_n) gets none
            into[index] = _host(grad)

    return hook


@contextlib.contextmanager
def recording(recorder: LayerRecorder) -> Iterator[None]:
    """The recorder's module hooks, on for the block."""
    import torch

    hooks = torch.nn.modules.module
    pre = hooks.register_module_forward_pre_hook(recorder.enter)
    try:
        yield
    finally:
        pre.remove()
        for handle in recorder.handles.values():
            handle.remove()
        recorder.handles.clear()


@dataclasses.dataclass(frozen=True)
class WrongLayer:
    """A module call that went wrong on its own, and how."""

    module: str
    kind: str
    phase: str
    what: str
    max_abs: float
    mismatched: int
    numel: int

    def line(self) -> str:
        """One line for the report."""
        given = "inputs" if self.phase == "forward" else "output gradients"
        return (
            f"  first layer out of tolerance with its {given} within it: "
            f"{self.module} ({self.kind}), {self.phase}: {self.what} "
            f"{self.mismatched}/{self.numel} elements out (max |diff| "
            f"{self.max_abs:.2e})"
        )


def _listed(grads: dict[int, torch.Tensor]) -> list[torch.Tensor | None]:
    return [grads.get(i) for i in range(max(grads, default=-1) + 1)]


def _bad(
    ref: list[torch.Tensor | None],
    dev: list[torch.Tensor | None],
    device_type: str,
    tolerances: tuple[float | None, float | None],
    label: str,
) -> tuple[str, float, int, int] | None:
    """The first tensor of ``dev`` out of tolerance of ``ref``, or None."""
    for i, (r, d) in enumerate(zip(ref, dev, strict=False)):
        if r is None or d is None or r.shape != d.shape:
            continue
        rtol, atol = tolerances
        if rtol is None or atol is None:
            rtol, atol = default_tolerance(d.dtype, device_type)
        diff = compare(f"{label} {i}", r, d, rtol, atol, dtype_name(d.dtype))
        if not diff.ok:
            return f"{label} {i}", diff.max_abs, diff.mismatched, diff.numel
    return None


def first_wrong_layer(
    reference: LayerRecorder,
    device: LayerRecorder,
    device_type: str,
    tolerances: tuple[float | None, float | None],
) -> WrongLayer | None:
    """The innermost module call wrong on its own: forward first, then backward."""
    pairs = list(zip(reference.calls, device.calls, strict=False))
    if any(r.module != d.module for r, d in pairs):
        return None  # the two sides called other modules: nothing to pair
    for phase in ("forward", "backward"):
        found: list[tuple[int, WrongLayer]] = []
        for r, d in pairs:
            if phase == "forward":
                given = _bad(r.inputs, d.inputs, device_type, tolerances, "input")
                gave = _bad(r.outputs, d.outputs, device_type, tolerances, "output")
            else:
                given = _bad(
                    _listed(r.grad_outputs), _listed(d.grad_outputs), device_type,
                    tolerances, "gradient of output",
                )  # fmt: skip
                gave = _bad(
                    _listed(r.grad_inputs), _listed(d.grad_inputs), device_type,
                    tolerances, "gradient of input",
                )  # fmt: skip
            if given is None and gave is not None:
                what, max_abs, mismatched, numel = gave
                wrong = WrongLayer(
                    d.module, d.kind, phase, what, max_abs, mismatched, numel
                )
                found.append((d.depth, wrong))
        if found:
            # the innermost; of equals, the first called
            deepest = max(depth for depth, _ in found)
            return next(w for depth, w in found if depth == deepest)
    return None
