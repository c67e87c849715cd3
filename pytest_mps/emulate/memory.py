"""The emulated Mac's memory: PyTorch's MPS allocator limit and its error.

A Mac's GPU allocates from the machine's own memory. PyTorch's MPS allocator
(``aten/src/ATen/mps/MPSAllocator.mm``, ``alloc_buffer_block``) refuses a
buffer when the bytes the Metal driver holds plus the new buffer pass

    max allowed = ratio * recommendedMaxWorkingSetSize

(``setHighWatermarkRatio``), and raises ``RuntimeError: MPS backend out of
memory (...)``. The pieces, as PyTorch has them:

- ``ratio`` is ``PYTORCH_MPS_HIGH_WATERMARK_RATIO``, read once when the
  allocator starts, default 1.7 (``default_high_watermark_ratio`` in
  ``MPSAllocator.h``); 0 turns the limit off; outside 0..2 the allocator
  refuses it (``invalid high watermark ratio``).
  ``torch.mps.set_per_process_memory_fraction(f)`` sets the ratio to ``f``
  (``MPSHooks::setMemoryFraction`` calls ``setHighWatermarkRatio``).
- ``recommendedMaxWorkingSetSize`` is Metal's; ``MPSAllocator.h`` says it "is
  typically 75% of the total system memory", which is what the emulation
  takes for a Mac with ``--mps-emulate-memory`` of memory.

The emulation counts the bytes of the emulated tensors' storages alive now
(each storage once, however many views share it) and checks a new storage
against the limit when an op hands it to the device, with PyTorch's message
and figures (``format_size`` is c10's ``CachingAllocator::format_size``).
What it leaves out: the allocator's cached buffers, its heap rounding and the
driver's own allocations (a Mac counts them; "other allocations" is 0 here),
so a Mac can run out somewhat earlier. Without ``--mps-emulate-memory`` there
is no limit.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping

import torch

from pytest_mps.machine.fingerprint import format_size

#: MPSAllocator.h, default_high_watermark_ratio.
DEFAULT_RATIO = 1.7
#: MPSAllocator.h, default_high_watermark_upper_bound.
RATIO_UPPER_BOUND = 2.0
#: MPSAllocator.h, on max_device_size(): recommendedMaxWorkingSetSize "is
#: typically 75% of the total system memory".
WORKING_SET_SHARE = 0.75
VARIABLE = "PYTORCH_MPS_HIGH_WATERMARK_RATIO"
# aten/src/ATen/mps/MPSAllocator.mm, alloc_buffer_block (TORCH_CHECK).
OUT_OF_MEMORY = (
    "MPS backend out of memory (MPS allocated: {allocated}, other allocations: "
    "{other}, max allowed: {limit}). Tried to allocate {size} on private pool. "
    "Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory "
    "allocations (may cause system failure)."
)
# aten/src/ATen/mps/MPSAllocator.mm, setHighWatermarkRatio (TORCH_CHECK).
INVALID_RATIO = "invalid high watermark ratio {ratio}"

_GIB = 1 << 30
_UNITS = {"": _GIB, "g": _GIB, "gb": _GIB, "gib": _GIB, "m": 1 << 20, "mb": 1 << 20}
_UNITS.update({"mib": 1 << 20, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40})


def parse_memory(value: str, where: str) -> int:
    """Bytes of a memory size like ``8GB``, ``16G`` or ``512MB`` (GB = GiB).

    Apple's "8 GB" of memory is 8 GiB, as ``sysctl hw.memsize`` gives it.
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS or float(found.group(1)) <= 0:
        raise ValueError(
            f"{where}: {value!r} is not a memory size; give one like 8GB, 16GB "
            "or 512MB (GB counts 2**30 bytes, as a Mac's memory does)"
        )
    return int(float(found.group(1)) * _UNITS[unit])


def watermark_ratio(environ: Mapping[str, str]) -> float:
    """``PYTORCH_MPS_HIGH_WATERMARK_RATIO``, or PyTorch's default when unset."""
    text = environ.get(VARIABLE)
    if text is None or not text.strip():
        return DEFAULT_RATIO
    try:
        ratio = float(text)
    except ValueError:
        raise ValueError(
            f"{VARIABLE}={text!r} in the environment is not a number "
            f"(0 turns the limit off; PyTorch's default is {DEFAULT_RATIO})"
        ) from None
    check_ratio(ratio)
    return ratio


def check_ratio(ratio: float) -> None:
    """PyTorch's RuntimeError for a ratio outside 0..2."""
    if not 0.0 <= ratio <= RATIO_UPPER_BOUND:
        raise RuntimeError(INVALID_RATIO.format(ratio=_c_double(ratio)))


def _c_double(value: float) -> str:
    # std::ostream << double: 6 significant digits, no trailing zeros
    return f"{value:g}"


class Budget:
    """The emulated Mac's memory and the live bytes of the device's storages."""

    def __init__(self, memory: int, ratio: float) -> None:
        self.memory = memory
        self.recommended = int(WORKING_SET_SHARE * memory)
        self.ratio = ratio
        self.allocated = 0
        self._sizes: dict[int, int] = {}
        self._users: dict[int, int] = {}

    @property
    def limit(self) -> int | None:
        """Bytes allowed on the device, or None when the ratio is 0 (no limit)."""
        if self.ratio == 0.0:
            return None
        return int(self.ratio * self.recommended)

    def set_fraction(self, fraction: float) -> None:
        """``torch.mps.set_per_process_memory_fraction``: the ratio from now on."""
        check_ratio(fraction)
        self.ratio = fraction

    def track(self, inner: torch.Tensor) -> None:
        """Count ``inner``'s storage while it lives; raise past the limit.

        Called before ``inner`` becomes a device tensor.
        """
        __tracebackhide__ = True
        storage = inner.untyped_storage()
        key = storage.data_ptr()
        if key == 0:
            return
        users = self._users.get(key)
        if users is None:
            size = storage.nbytes()
            limit = self.limit
            if limit is not None and self.allocated + size > limit:
                raise RuntimeError(
                    OUT_OF_MEMORY.format(
                        allocated=format_size(self.allocated),
                        other=format_size(0),
                        limit=format_size(limit),
                        size=format_size(size),
                    )
                )
            self._sizes[key] = size
            self.allocated += size
            users = 0
        self._users[key] = users + 1
        weakref.finalize(inner, self._release, key)

    def _release(self, key: int) -> None:
        users = self._users[key] - 1
        if users:
            self._users[key] = users
            return
        del self._users[key]
        self.allocated -= self._sizes.pop(key)

    def describe(self) -> str:
        """One line for the header: memory, recommended working set, limit."""
        limit = self.limit
        allowed = (
            f"max allowed {format_size(limit)} ({self.ratio:g} x)"
            if limit is not None
            else f"no limit ({VARIABLE}=0)"
        )
        return (
            f"memory {format_size(self.memory)}: recommended working set "
            f"{format_size(self.recommended)}, {allowed}"
        )


#: The running emulation's budget (set by :mod:`.install`), or None: no limit.
current: list[Budget | None] = [None]
