"""Python that autograd runs during a backward on the device sees the device.

The gradients autograd computes for device tensors are made by C++ kernels on
the CPU tensors underneath, so nothing tags them: a custom
``autograd.Function.backward``, a tensor hook or a module backward hook would
read ``grad.device`` as the CPU, and ``grad.double()`` there would run where a
Mac refuses it. While a backward started from a device tensor runs
(:data:`running`, raised by the function mode's ``backward`` and
``autograd.grad``), the gradients handed to those three are tagged before the
user's code sees them. The function mode handles ``backward()`` with itself
off the stack, as every torch-function handler runs, so the engine is started
with the mode pushed again (``torch.autograd._engine_run_backward``): autograd
runs a CPU graph in the caller's thread with the thread's modes, and the
user's backward code meets the mode, its answers and its refusals, as
anywhere. A backward of CPU tensors (a float64 ``gradcheck``) is left alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from pytest_mps.emulate import patching, tags

_MPS = torch.device("mps", 0)
_CPU = torch.device("cpu")


class _Running(threading.local):
    depth = 0


#: Above 0 while the thread runs a backward started from a device tensor.
running = _Running()


class on_device:
    """Marks the calling thread as running a backward on the device."""

    __slots__ = ()

    def __enter__(self) -> None:
        running.depth += 1

    def __exit__(self, *exc: object) -> None:
        running.depth -= 1


ON_DEVICE = on_device()


def tag_gradients(values: Any) -> None:
    """Tag every tensor in ``values`` (a tensor, or a tuple or list of them)."""
    if isinstance(values, torch.Tensor):
        tags.tag(values)
    elif isinstance(values, (tuple, list)):
        for value in values:
            if isinstance(value, torch.Tensor):
                tags.tag(value)


def tensor_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` for ``t.register_hook`` of a device tensor: its gradient is too."""

    def device_hook(grad: Any) -> Any:
        if isinstance(grad, torch.Tensor):
            tags.tag(grad)
        return hook(grad)

    return device_hook


def _module_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    def device_hook(module: Any, *grads: Any) -> Any:
        if running.depth:
            for value in grads:
                tag_gradients(value)
        return hook(module, *grads)

    return device_hook


def engine_gradients(hosts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tag the gradients autograd's engine made; the host tensors left.

    During a backward (autograd's engine runs a node; torch 2.6's
    ``torch.autograd.backward`` never reaches this mode, so the node is the
    sign), the engine's C++ kernels make gradients from CPU tensors,
    untagged. The function mode (:mod:`.tagged`) never sees those kernels,
    except when a dispatch mode (``FlopCounterMode``, a user's op logger, the
    parity localizer) runs each aten op from Python: then the gradients meet
    the device's saved tensors there. On a Mac they are device tensors.
    0-dim host tensors stay (scalars, as anywhere).
    """
    kept = []
    for h in hosts:
        if h.device.type == "cpu" and h.dim() != 0:
            tags.tag(h)
        else:
            kept.append(h)
    return kept


def install(patches: patching.Patches, mode: Callable[[], Any]) -> None:
    """Tag the gradients of custom Functions and module backward hooks.

    ``mode()`` gives the session's function mode, pushed while the engine
    runs a backward on the device.
    """
    import torch.autograd
    from torch.autograd.function import BackwardCFunction
    from torch.utils.hooks import BackwardHook

    engine = torch.autograd._engine_run_backward  # type: ignore[attr-defined]

    def run_backward(*args: Any, **kwargs: Any) -> Any:
        current = mode()
        if running.depth and current is not None:
            with current:
                return engine(*args, **kwargs)
        return engine(*args, **kwargs)

    patches.patch(torch.autograd, "_engine_run_backward", run_backward)

    apply = BackwardCFunction.apply

    def device_apply(self: Any, *args: Any) -> Any:
        if running.depth:
            tag_gradients(args)
        return apply(self, *args)  # type: ignore[no-untyped-call]

    device_apply.__doc__ = apply.__doc__
    patches.patch(BackwardCFunction, "apply", device_apply)

    init = BackwardHook.__init__

    def device_init(
        self: Any, module: Any, user_hooks: Any, user_pre_hooks: Any
    ) -> None:
        init(
            self,
            module,
            [_module_hook(h) for h in user_hooks],
            [_module_hook(h) for h in user_pre_hooks],
        )

    patches.patch(BackwardHook, "__init__", device_init)
    _checkpoint(patches)


def _checkpoint(patches: patching.Patches) -> None:
    """Activation checkpointing compares devices by the tag.

    ``torch.utils.checkpoint`` compares the device a tensor had when saved
    and when recomputed in the backward; the first is read with the mode off
    the stack (CPU), the second with it pushed again (mps).
    """
    import torch.utils.checkpoint as checkpoint

    checks = getattr(checkpoint, "_allowed_determinism_checks_to_fns", None)
    default = getattr(checkpoint, "_DEFAULT_DETERMINISM_MODE", None)
    if not isinstance(checks, dict) or default not in checks:
        return

    def metadata(x: torch.Tensor) -> dict[str, Any]:
        device = _MPS if tags.tagged(x) else _CPU
        if x.device.type not in ("cpu", "mps"):
            device = x.device
        return {"shape": x.shape, "dtype": x.dtype, "device": device}

    patches.patch(
        checkpoint, "_allowed_determinism_checks_to_fns", {**checks, default: metadata}
    )
