"""Host-sync detection: ``@pytest.mark.no_host_sync`` and ``forbid_host_sync()``.

An op "syncs" when the host must wait for the device to finish before it can go
on: it reads a value back (``.item()``), copies to or from host memory
blockingly, or allocates an output whose size depends on the data (``nonzero``).
PyTorch's ``torch.cuda.set_sync_debug_mode`` catches these on CUDA only; this
check is device-generic, by op identity, so it also runs on MPS and on CPU.
The ops are those ``set_sync_debug_mode("warn")`` reports on an H100 (torch
2.11): ``_local_scalar_dense`` (``.item()``, ``float(t)``, ``bool(t)``),
``_to_copy``/``copy_`` between host and device unless ``non_blocking``,
``nonzero`` (``torch.where(m)``), ``index.Tensor``/``index_put_`` with a bool
mask (not ``t[mask] = scalar``, which ATen turns into ``masked_fill_``),
``masked_select``, ``_unique2``, ``repeat_interleave`` without ``output_size``,
``bincount``, ``allclose``/``equal``, and linalg error checks
(``_linalg_check_errors``: ``linalg.inv``, ``cholesky``, ...); not
``multinomial``, ``randperm``, ``sort``, ``cumsum`` or non-blocking copies to
the host.

On CPU nothing waits, but the same test run on MPS would: when the test runs
on CPU, CPU tensors count as device tensors, so ``x.item()`` is flagged there
too (``count_cpu``); on an accelerator only accelerator tensors count.

Some reads run no aten op that says so on the CPU: ``t.tolist()``,
``t.numpy()``, ``np.asarray(t)``, ``repr``/``str``/``print`` and f-strings of a
tensor, iterating a 1-D tensor into 0-dim ones, ``t.cpu()`` and
``t.to("cpu")``. These are caught as torch calls (``host_read``, shown by the
watch front before they run), on every device alike, so a CPU run finds what
an MPS or CUDA run would. Only a host destination spelled ``"cpu"`` counts for
``.to()`` of a CPU tensor: ``t.to(device)`` with the test's device is no read
there. Reads of metadata (``.shape``, ``.dtype``, ``.device``, ``.numel()``,
``len(t)``) never count, and neither do pytest's own reprs of a failing
assertion. Reads made by the test's own checks (inside an ``assert``,
``torch.testing.assert_close``) are not the code under test's and pass
(:mod:`pytest_mps.watch.attribution`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import ownership
from pytest_mps.devices import devices_key
from pytest_mps.watch import settings
from pytest_mps.watch.attribution import CODE, HOST_SYNC, side_for, whose
from pytest_mps.watch.device_mix import is_cpu
from pytest_mps.watch.findings import TestFindings, findings_for
from pytest_mps.watch.locations import called_by_pytest, in_functions, user_location

if TYPE_CHECKING:
    from pytest_mps.watch import OpCallback


class HostSyncError(AssertionError):
    """An op made the host wait for the device where that is forbidden."""


Check = Callable[[tuple[Any, ...], Mapping[str, Any], bool], str | None]


def _on_device(tensor: Any, count_cpu: bool) -> bool:
    return count_cpu or not is_cpu(tensor)


def _reads_back(what: str) -> Check:
    def check(
        args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool
    ) -> str | None:
        return what if _on_device(args[0], cpu) else None

    return check


def _mask_check(args: tuple[Any, ...], cpu: bool, what: str) -> str | None:
    if not _on_device(args[0], cpu):
        return None
    import torch

    for index in args[1]:
        if index is not None and index.dtype in (torch.bool, torch.uint8):
            return what
    return None


def _bool_mask(what: str) -> Check:
    def check(
        args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool
    ) -> str | None:
        return _mask_check(args, cpu, what)

    return check


def _index_put(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool
) -> str | None:
    indices = [i for i in args[1] if i is not None]
    value = args[2]
    # ATen's _index_put_impl_ turns `t[mask] = scalar` into masked_fill_
    # (canDispatchToMaskedFill in TensorAdvancedIndexing.cpp): no nonzero, no sync
    if len(indices) == 1 and value.numel() == 1 and indices[0].dim() > 0:
        return None
    return _mask_check(args, cpu, "indexing with a bool mask calls nonzero")


def _same_tensor_or(what: str) -> Check:
    reads_back = _reads_back(what)

    def check(
        args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool
    ) -> str | None:
        # torch.equal(t, t) returns early without reading anything back
        return None if args[0] is args[1] else reads_back(args, kwargs, cpu)

    return check


def _crosses(src: Any, dst_is_cpu: bool, non_blocking: bool) -> bool:
    return not non_blocking and is_cpu(src) != dst_is_cpu


def _to_copy(args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool) -> str | None:
    device = kwargs.get("device")
    if device is None:
        return None
    dst_is_cpu = str(device).startswith("cpu")
    if _crosses(args[0], dst_is_cpu, bool(kwargs.get("non_blocking", False))):
        return "a blocking copy between host and device (.to())"
    return None


def _copy_(args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool) -> str | None:
    non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if _crosses(args[1], is_cpu(args[0]), non_blocking):
        return "a blocking copy between host and device (copy_)"
    return None


def _repeat_interleave(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool
) -> str | None:
    size = kwargs.get("output_size", args[1] if len(args) > 1 else None)
    if size is None and _on_device(args[0], cpu):
        return "repeat_interleave without output_size reads the repeats back"
    return None


@lru_cache(maxsize=1)
def sync_checks() -> dict[Any, Check]:
    """OpOverload -> check returning why it syncs (or None), built once."""
    import torch

    aten = torch.ops.aten
    checks: dict[Any, Check] = {
        aten._local_scalar_dense.default: _reads_back(
            "reads a value back (.item(), float(t), int(t), bool(t), if t:)"
        ),
        aten.nonzero.default: _reads_back("output size depends on the data"),
        aten.masked_select.default: _reads_back("output size depends on the data"),
        aten._unique2.default: _reads_back("output size depends on the data"),
        aten.bincount.default: _reads_back("output size depends on the data"),
        aten.allclose.default: _reads_back("returns a Python bool"),
        aten.equal.default: _same_tensor_or("returns a Python bool"),
        aten.index.Tensor: _bool_mask("indexing with a bool mask calls nonzero"),
        aten.index_put_.default: _index_put,
        aten.index_put.default: _index_put,
        aten._to_copy.default: _to_copy,
        aten.copy_.default: _copy_,
        aten.repeat_interleave.Tensor: _repeat_interleave,
    }
    # linalg ops with error checking (inv, cholesky, solve) read `info` back
    checks[aten._linalg_check_errors.default] = _reads_back(
        "linalg error checking reads the info tensor back"
    )
    for name in ("_unique", "unique_dim", "unique_consecutive"):
        packet = getattr(aten, name, None)
        if packet is not None:
            checks[packet.default] = _reads_back("output size depends on the data")
    return checks


def _destination(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, bool]:
    """``Tensor.to``'s device argument (None for none) and its ``non_blocking``."""
    import torch

    device = kwargs.get("device")
    non_blocking = bool(kwargs.get("non_blocking", False))
    for arg in args[1:]:
        if device is None and isinstance(arg, (str, torch.device)):
            device = arg
        elif isinstance(arg, bool):
            non_blocking = non_blocking or arg
            break  # to(dtype, non_blocking, copy): the first bool
    return device, non_blocking


def _copy_to_host(
    func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool
) -> str | None:
    """Why ``t.cpu()`` / ``t.to(...)`` reads data back, or None."""
    source = args[0]
    if func.__name__ == "cpu":
        return "a blocking copy to the host" if _on_device(source, cpu) else None
    device, non_blocking = _destination(args, kwargs)
    if device is None or non_blocking or str(device).partition(":")[0] != "cpu":
        return None
    # a CPU tensor counts for "cpu" spelled out; t.to(device) is the test's own
    if not is_cpu(source) or (cpu and isinstance(device, str)):
        return "a blocking copy to the host"
    return None


_READS = {
    "tolist": "copies the values into Python lists",
    "numpy": "copies the values into a NumPy array",
    "__array__": "copies the values into a NumPy array, as np.asarray(t) does",
    "__repr__": "formats the values as text: repr, str, print",
    "__format__": "formats the values as text: an f-string or format()",
    "__iter__": "iterates a 1-D tensor into 0-dim tensors, each read back alone",
}


def host_read_reason(
    func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], cpu: bool
) -> str | None:
    """Why the torch call ``func`` reads tensor data back to Python, or None."""
    name = func.__name__
    if name in ("cpu", "to"):
        return _copy_to_host(func, args, kwargs, cpu)
    tensor = args[0]
    if not _on_device(tensor, cpu):
        return None
    if name == "__iter__" and tensor.dim() != 1:
        return None  # rows of a matrix are tensors, not values
    return _READS.get(name)


def _optimizer_step_counter(tensor: Any) -> bool:
    """True for torch.optim reading its CPU step counter (``_get_value(step)``).

    Optimizers keep ``state["step"]`` on the CPU on every device (unless
    capturable or fused), so reading it syncs nothing, on MPS or CUDA either.
    """
    if not getattr(tensor, "is_cpu", False) or not is_cpu(tensor):
        return False
    here = os.path.dirname(os.path.abspath(__file__))
    frame: types.FrameType | None = sys._getframe(1)
    # step over this guard and the watch mode to the code that ran the op
    while frame is not None and (
        os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here
        or frame.f_code.co_filename.endswith("_python_dispatch.py")
    ):
        frame = frame.f_back
    if frame is None:
        return False
    path = frame.f_code.co_filename.replace("\\", "/")
    return frame.f_code.co_name == "_get_value" and "/torch/optim/" in path


class SyncGuard:
    """The per-op callback: raises ``HostSyncError`` at the first sync."""

    #: clean calls never sync (watch.front): they need not be watched op by op
    every_op = False

    def __init__(
        self,
        count_cpu: bool,
        why: str,
        findings: TestFindings | None = None,
        expected: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.count_cpu = count_cpu
        #: reading a CPU tensor is a sync only when CPU tensors count (watch.front)
        self.watches_cpu = count_cpu
        self.why = why
        self.findings = findings
        self.expected = expected
        self.checks = sync_checks()
        # the watch mode calls this guard only for these ops
        self.ops = frozenset(self.checks)

    def __call__(
        self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Raise ``HostSyncError`` if ``func`` on these arguments syncs."""
        __tracebackhide__ = True
        reason = self.checks[func](args, kwargs, self.count_cpu)
        if reason is None:
            return
        if self.count_cpu and _optimizer_step_counter(args[0]):
            return
        self._fail(func._schema.name, reason, sys._getframe(1))

    def host_read(
        self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Raise ``HostSyncError`` if the torch call ``func`` reads data back."""
        __tracebackhide__ = True
        reason = host_read_reason(func, args, kwargs, self.count_cpu)
        if reason is None or called_by_pytest(sys._getframe(1)):
            return
        self._fail(f"Tensor.{func.__name__}", reason, sys._getframe(1))

    def _fail(self, name: str, reason: str, start: types.FrameType) -> None:
        __tracebackhide__ = True
        side, frame = whose(start)
        if side_for(side, HOST_SYNC) != CODE:
            return  # the test's own check (an assert, torch.testing)
        if in_functions(frame, self.expected):
            return  # by design (mps_expected_host_syncs)
        where = user_location(frame) if frame is not None else "unknown"
        if self.findings is not None:
            self.findings.add("host-sync", name, where, detail=reason)
        raise HostSyncError(
            f"{name} makes the host wait for the device ({reason}) at {where}; "
            f"forbidden by {self.why}"
        )


@contextlib.contextmanager
def forbid_host_sync(*, count_cpu: bool | None = None) -> Iterator[None]:
    """Fail at the first op inside the block that makes the host wait for the device.

    Raises ``HostSyncError`` (an ``AssertionError``) naming the op and the line.
    ``count_cpu``: treat CPU tensors as device tensors, so that ``x.item()`` on
    a CPU tensor fails as it would sync on MPS; default: True when the running
    test's device is the CPU, else False.
    """
    __tracebackhide__ = True
    from pytest_mps.watch.mode import op_watch

    cpu = settings.running_on_cpu[0] if count_cpu is None else count_cpu
    expected = settings.expected_syncs[0]
    with op_watch(SyncGuard(cpu, "forbid_host_sync()", expected=expected)):
        yield


def _test_device(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("device") is not None:
        return str(callspec.params["device"])
    devices = item.config.stash.get(devices_key, None) or ["cpu"]
    return devices[0]


def pytest_mps_watch_ops(item: pytest.Item) -> OpCallback | None:
    if ownership.closest_marker(item, "no_host_sync") is None:
        return None
    count_cpu = _test_device(item) == "cpu"
    return SyncGuard(
        count_cpu,
        "@pytest.mark.no_host_sync",
        findings_for(item),
        item.config.stash.get(settings.expected_syncs_key, ()),
    )
