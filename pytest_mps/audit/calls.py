"""The torch call around each aten op the audit records, and what kind it is.

``calls_mode_class`` notes the torch call each aten op runs under (what the
CPU's aten ops cannot show: ``F.linear`` of integers, ``svdvals`` through
``linalg.svd``); ``on_device`` tells an op working on the device from a copy to
the host; ``optimizer_counter`` tells torch.optim's read of its host ``step``
counter from a real sync.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def calls_mode_class() -> type[Any]:
    """The ``TorchFunctionMode`` behind ``Recorder.calls`` (torch is lazy)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from pytest_mps.watch.attribution import plugin_running

    is_compiling = torch.compiler.is_compiling

    class CallsMode(TorchFunctionMode):
        def __init__(self, recorder: Any) -> None:
            super().__init__()
            self.recorder = recorder

        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            __tracebackhide__ = True
            kwargs = kwargs or {}
            recorder = self.recorder
            if is_compiling() or recorder.call is not None or plugin_running[0]:
                return func(*args, **kwargs)
            recorder.on_call(func, args, kwargs)
            recorder.call = (func, args, kwargs)
            try:
                result = func(*args, **kwargs)
            except BaseException:
                recorder.settle_wide(None)
                raise
            finally:
                recorder.call = None
            recorder.settle_wide((args, kwargs, result))
            return result

    return CallsMode


_TORCH = f"{os.sep}torch{os.sep}"


_OPTIM = f"{_TORCH}optim{os.sep}"


_OURS = f"{os.sep}pytest_mps{os.sep}"


def on_device(args: tuple[Any, ...], kwargs: Mapping[str, Any], tensor: Any) -> bool:
    """True when an op works on the device: a tensor off the CPU, no host target.

    Under ``--mps-emulate`` the device's tensors say mps and the host's cpu; a
    copy to the host (``device="cpu"``) makes host tensors, whatever it reads.
    """
    target = kwargs.get("device")
    if target is not None and str(target).startswith("cpu"):
        return False
    from pytest_mps.watch.device_mix import is_cpu

    values: list[Any] = [*args, *kwargs.values()]
    for value in values:
        if isinstance(value, tensor):
            if not is_cpu(value):
                return True
        elif isinstance(value, (list, tuple)):
            if any(isinstance(v, tensor) and not is_cpu(v) for v in value):
                return True
    return False


def optimizer_counter(op: str) -> bool:
    """True when torch.optim reads back a ``step`` counter (``_get_value``).

    Non-fused, non-capturable optimizers keep ``step`` on the CPU on every
    device (torch/optim/optimizer.py), so the read is a host read on MPS too,
    not a GPU sync; a CPU run cannot tell it from ``loss.item()`` otherwise.
    """
    if op != "aten::_local_scalar_dense":
        return False
    frame: Any = sys._getframe(1)
    # up through pytest-mps's watch mode and torch's dispatch frames to the
    # first frame of torch.optim, or to the user's code
    while frame is not None:
        name = frame.f_code.co_filename
        if _OPTIM in name:
            return True
        if _TORCH not in name and _OURS not in name:
            return False
        frame = frame.f_back
    return False
