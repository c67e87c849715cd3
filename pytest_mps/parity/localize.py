"""Where a parity failure comes from: the first device op wrong on its own inputs.

A failing parity check says that some output or gradient differs. To say
where, the device side runs again with the test's seed under two recorders:

- a dispatch mode sees every aten op the device runs, forward, backward and
  optimizer steps alike, at the level the device dispatches it. Each op's
  tensor inputs are copied to the host (strides kept) before it runs, its
  outputs after; then the op runs again on the CPU from those inputs and each
  output is compared with the device's, with the tolerance of its dtype. An
  op that leaves the tolerance from the very inputs the device gave it is
  wrong on its own, not by inheritance: the first one is the answer (kornia
  replayed each aten signature of its suite this way, kornia#4521; TabPFN's
  ladder looked for the first op whose difference jumps, TabPFN#1078). Only
  summaries are kept, so memory stays that of one op.
- module hooks keep the stack of modules running in the forward, named by
  their qualified names; a torch-function mode maps each autograd node made
  in the forward to its module and the user's line, so a backward op (whose
  node ``torch._C._current_autograd_node()`` names) is put back where its
  forward was written.

Ops that draw random numbers, or that leave memory uninitialised, cannot be
replayed and are not judged; an op the CPU has no kernel for (a device's own
attention kernel) is counted and named. Paid only on failure: a passing
parity check never comes here.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pytest_mps.parity.compare import (
    compare,
    compare_runs,
    default_tolerance,
    dtype_name,
)
from pytest_mps.parity.equivalents import CPU_EQUIVALENTS
from pytest_mps.parity.findings import Localization, Site, WrongOp
from pytest_mps.parity.layers import LayerRecorder, Names, first_wrong_layer
from pytest_mps.parity.layers import recording as layer_recording
from pytest_mps.parity.run import Plan, Run, rng_restored, run
from pytest_mps.watch.locations import relative_location, user_location

if TYPE_CHECKING:
    import torch

#: how many ops out of tolerance a localization keeps in full
KEEP = 5

#: ops that compute no values: aliases, and a storage handed to a tensor
#: (``copy.deepcopy`` sets a fresh, not yet filled storage)
_NO_VALUES = frozenset(
    {
        "aten.detach.default",
        "aten.lift_fresh.default",
        "aten.set_.source_Storage",
        "aten.set_.source_Storage_storage_offset",
        "aten.set_.source_Tensor",
        "aten.set_.default",
        "aten.resize_.default",
    }
)
#: ops whose outputs are uninitialised memory: nothing to compare
_UNINITIALISED = (
    "empty",
    "new_empty",
    "empty_like",
    "empty_strided",
    "new_empty_strided",
)


def describe(name: str, t: torch.Tensor) -> str:
    layout = "contiguous" if t.is_contiguous() else "non-contiguous"
    return (
        f"{name}: {dtype_name(t.dtype)} {tuple(t.shape)} strides {tuple(t.stride())} "
        f"({layout})"
    )


def to_host(value: Any) -> Any:
    """A CPU copy of a device tensor with its strides, where they can be kept."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    t = value.detach()
    if t.layout != torch.strided:
        return t.to("cpu", copy=True)
    if _dense(t):
        host = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
        return host.copy_(t)
    return t.to("cpu", copy=True)


def _dense(t: torch.Tensor) -> bool:
    """True when ``t``'s elements fill its memory once each (any order)."""
    pairs = zip(t.shape, t.stride(), strict=True)
    dims = sorted((st, sz) for sz, st in pairs if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _on_host(value: Any) -> Any:
    """A device argument of a factory op (``device=``) turned to the CPU."""
    import torch

    if isinstance(value, torch.device) and value.type != "cpu":
        return torch.device("cpu")
    return value


class Recorder:
    """The dispatch mode and the function mode of one localization run."""

    def __init__(self, device: str, root_name: str, tolerances: Any) -> None:
        self.found = Localization(device)
        self.device_type = device.split(":")[0]
        self.modules = Names(root_name)
        self.nodes: dict[Any, Site] = {}
        self.tolerances = tolerances
        self.root = os.getcwd()

    # -- where an op was written ------------------------------------------
    def _line(self) -> str:
        return relative_location(user_location(sys._getframe(2)), self.root)

    def map_nodes(self, out: Any) -> None:
        """Put each autograd node new in ``out``'s graph at the current site."""
        stack = self.modules.stack
        site = Site(
            stack[-1][0] if stack else None,
            stack[-1][1] if stack else None,
            self._line(),
            "backward",
        )
        todo = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or node in self.nodes:
                continue
            self.nodes[node] = site
            todo.extend(n for n, _ in node.next_functions)

    def site(self) -> Site:
        """Where the op running now was written: its node's site in a backward."""
        import torch

        node = torch._C._current_autograd_node()
        if node is not None:
            found = self.nodes.get(node)
            if found is not None:
                return found
            return Site(None, None, f"backward of {type(node).__name__}", "backward")
        stack = self.modules.stack
        if stack:
            return Site(stack[-1][0], stack[-1][1], self._line(), "forward")
        return Site(None, None, self._line(), "forward or optimizer step")

    # -- one op --------------------------------------------------------------
    def op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one device op, replay it on the CPU from its inputs, compare."""
        import torch
        from torch.utils import _pytree
        from torch.utils._python_dispatch import _disable_current_modes

        found = self.found
        name = str(func)
        skip = (
            func.is_view
            or func.__name__.split(".")[0] in _UNINITIALISED
            or name in _NO_VALUES
        )
        if skip:
            return func(*args, **kwargs)
        if torch.Tag.nondeterministic_seeded in func.tags:
            if _tensors((args, kwargs)):  # a draw from nothing is no device op
                found.ops += 1
                found.random += 1
            return func(*args, **kwargs)
        found.ops += 1
        with _disable_current_modes():
            host_args, host_kwargs = _pytree.tree_map(to_host, (args, kwargs))
        out = func(*args, **kwargs)
        with _disable_current_modes():
            self._judge(func, name, host_args, host_kwargs, out)
        return out

    def _judge(
        self,
        func: Any,
        name: str,
        host_args: Any,
        host_kwargs: Any,
        out: Any,
    ) -> None:
        import torch
        from torch.utils import _pytree

        found = self.found
        inputs = [describe(n, t) for n, t in named_inputs(func, host_args, host_kwargs)]
        device_out = [
            to_host(t) for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
        ]
        if not device_out:
            return
        call_args, call_kwargs = _pytree.tree_map(_on_host, (host_args, host_kwargs))
        replay, compared = func, len(device_out)
        equivalent = CPU_EQUIVALENTS.get(name)
        if equivalent is not None:
            replay, call_args, call_kwargs, compared = equivalent(
                call_args, call_kwargs
            )
            device_out = device_out[:compared]
        try:
            cpu = replay(*call_args, **call_kwargs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            found.no_cpu_kernel[name] = found.no_cpu_kernel.get(name, 0) + 1
            return
        cpu_out = [t for t in _pytree.tree_leaves(cpu) if isinstance(t, torch.Tensor)]
        found.replayed += 1
        for i, (d, c) in enumerate(zip(device_out, cpu_out, strict=False)):
            if d.shape != c.shape or d.dtype != c.dtype:
                continue
            rtol, atol = self.tolerances
            if rtol is None or atol is None:
                rtol, atol = default_tolerance(d.dtype, self.device_type)
            label = "output" if len(device_out) == 1 else f"output {i}"
            diff = compare(label, c, d, rtol, atol, dtype_name(d.dtype))
            if diff.ok:
                continue
            found.wrong_count += 1
            if len(found.wrong) < KEEP:
                at = diff.worst or ()
                found.wrong.append(
                    WrongOp(
                        index=found.ops - 1,
                        op=name,
                        site=self.site(),
                        inputs=inputs,
                        diff=diff,
                        output=describe(label, d),
                        device_value=item(d, at),
                        cpu_value=item(c, at),
                    )
                )
            break


def named_inputs(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[str, torch.Tensor]]:
    """The op's tensor arguments by their schema names (``self``, ``weight``)."""
    import torch

    schema = func._schema.arguments
    named = [
        (schema[i].name if i < len(schema) else f"argument {i}", value)
        for i, value in enumerate(args)
    ]
    named += list(kwargs.items())
    found = []
    for name, value in named:
        if isinstance(value, torch.Tensor):
            found.append((name, value))
        elif isinstance(value, (list, tuple)):
            found += [
                (f"{name}[{j}]", v)
                for j, v in enumerate(value)
                if isinstance(v, torch.Tensor)
            ]
    return found


def item(t: torch.Tensor, at: tuple[int, ...]) -> float | complex:
    value = t[at] if at else t
    return complex(value) if t.is_complex() else float(value)


def _tensors(out: Any) -> list[Any]:
    import torch
    from torch.utils import _pytree

    return [t for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """The recorder's hooks and modes, on for the block."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return recorder.op(func, args, kwargs or {})

    class Calls(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            if torch.is_grad_enabled():
                recorder.map_nodes(out)
            return out

    hooks = torch.nn.modules.module
    with contextlib.ExitStack() as stack:
        pre = hooks.register_module_forward_pre_hook(recorder.modules.enter)
        stack.callback(pre.remove)
        post = hooks.register_module_forward_hook(recorder.modules.leave)
        stack.callback(post.remove)
        stack.enter_context(Calls())
        stack.enter_context(Ops())  # type: ignore[no-untyped-call]
        yield


def localize(
    execute: Callable[[], Any], device: str, root_name: str, tolerances: Any
) -> tuple[Localization, Any]:
    """Run ``execute`` (the device side) under the recorders.

    Returns what they found and what ``execute`` returned.
    """
    recorder = Recorder(device, root_name, tolerances)
    with recording(recorder):
        result = execute()
    return recorder.found, result


def localized(
    plan: Plan,
    devices: tuple[torch.device, torch.device],
    dtypes: tuple[torch.dtype | None, torch.dtype | None],
    tolerances: tuple[float | None, float | None],
    first: Run,
) -> tuple[Localization | None, list[str]]:
    """Both sides once more, each device op replayed on the CPU: the report's lines.

    Only a failing check comes here. Both sides run under module hooks
    (:mod:`.layers`), the device side under the op replay too
    (:mod:`.localize`). The rerun's leaves are compared with the ``first``
    run's: a device that answers the same inputs differently twice is named
    (pytorch#180776). A failure of the localization itself is a line of the
    report, never a second error hiding the first.
    """
    ref, target = devices
    try:
        with rng_restored([ref, target]):
            reference_layers = LayerRecorder(plan.name)
            with layer_recording(reference_layers):
                run(plan, ref, dtypes[0], checked=False)
            device_layers = LayerRecorder(plan.name)
            with layer_recording(device_layers):
                found, again = localize(
                    lambda: run(plan, target, dtypes[1], checked=False),
                    str(target),
                    plan.name,
                    tolerances,
                )
        found.layer = first_wrong_layer(
            reference_layers, device_layers, target.type, tolerances
        )
        sides = (f"the first run ({target})", f"the rerun ({target})")
        diffs, _, _ = compare_runs(first, again, target, sides, False, tolerances)
        found.rerun_differs = [d.path for d in diffs if not d.ok]
    except Exception as exc:  # the parity failure is the news; this is a footnote
        text = str(exc).strip().splitlines()
        return None, [
            f"localization failed: {type(exc).__name__}: {text[0] if text else ''}"
        ]
    return found, found.lines()
