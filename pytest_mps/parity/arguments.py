"""Checking what ``assert_device_parity`` was given: devices, options, names.

A bad argument is a ValueError or TypeError naming it; a device this machine
lacks skips the test, with the reason.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_mps import backend
from pytest_mps.accelerator import canonical

if TYPE_CHECKING:
    import torch


def device_named(where: str, value: Any, argument: str) -> torch.device:
    """The device named; ValueError for no device, a skip for one not here."""
    __tracebackhide__ = True
    import torch

    try:
        device = torch.device(canonical(value))
    except (RuntimeError, TypeError):
        raise ValueError(
            f"{where}: {argument}={value!r} is not a device; "
            "use cpu, mps, cuda or cuda:N"
        ) from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(
            f"{where}: {argument}={value!r}: parity is checked on cpu, mps or cuda"
        )
    reason = None
    if device.type == "cuda" and not torch.cuda.is_available():
        reason = f"CUDA is not available (torch {torch.__version__})"
    elif device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        reason = f"only {torch.cuda.device_count()} CUDA device(s) are visible"
    elif device.type == "mps":
        reason = _mps_reason()
    if reason is not None:
        # a test that names a device this machine lacks is skipped, like
        # @pytest.mark.mps; a session that asks for the device (--mps) stops
        # at start-up with the same reason instead
        import pytest

        pytest.skip(f"{where}: {argument}={value!r} is not usable here: {reason}")
    return device


def _mps_reason() -> str | None:
    """Why MPS cannot be used here, in a few words, or None."""
    reason = backend.mps_unavailable_reason()
    if reason is None or not backend.torch_installed():
        return reason
    if not backend.mps_built():
        import platform

        # the backend's reason spells out is_built(); one line is enough here
        return (
            f"this torch has no MPS (it needs an Apple-silicon Mac; this is "
            f"{platform.system()})"
        )
    return reason


def simple(name: str) -> bool:
    """True for ``x``, ``self.model``, ``batch["ids"]``: fit to head a path."""
    try:
        node = ast.parse(name, mode="eval").body
    except SyntaxError:
        return False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name)


def validate(
    where: str,
    fn_or_module: Any,
    steps: Any,
    grads: bool,
    tolerances: tuple[Any, Any],
    reference_dtype: Any,
    train: Any,
    kwargs: Any,
) -> None:
    """Raise naming the argument when one is not usable."""
    import torch

    is_module = isinstance(fn_or_module, torch.nn.Module)
    if not callable(fn_or_module):
        raise TypeError(
            f"{where}: fn_or_module must be a torch.nn.Module or a callable, got "
            f"{type(fn_or_module).__name__} {fn_or_module!r:.80}"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"{where}: steps={steps!r} is not a count of steps (>= 0)")
    if steps and not (is_module and any(True for _ in fn_or_module.parameters())):
        raise ValueError(
            f"{where}: steps={steps} needs fn_or_module to be a torch.nn.Module "
            f"with parameters, not a {type(fn_or_module).__name__}"
        )
    if steps and not grads:
        raise ValueError(f"{where}: steps={steps} needs grads=True")
    rtol, atol = tolerances
    if (rtol is None) != (atol is None):
        raise ValueError(
            f"{where}: give both rtol and atol or neither "
            f"(rtol={rtol!r}, atol={atol!r})"
        )
    for label, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (isinstance(value, (int, float)) and value >= 0):
            raise ValueError(f"{where}: {label}={value!r} is not a tolerance (>= 0)")
    if reference_dtype is not None and not (
        isinstance(reference_dtype, torch.dtype) and reference_dtype.is_floating_point
    ):
        raise TypeError(
            f"{where}: reference_dtype={reference_dtype!r} is not a floating dtype"
        )
    if train is not None and not (is_module and isinstance(train, bool)):
        raise ValueError(
            f"{where}: train={train!r} needs True or False and a torch.nn.Module"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"{where}: kwargs must be a mapping, got {kwargs!r:.80}")
