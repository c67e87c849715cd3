"""The emulated device's generator: a CPU generator whose device is mps.

``torch.Generator("mps")`` makes one under the emulation, and factories given
``device="mps"`` draw from :data:`default_generator` (``torch.manual_seed``
and ``torch.mps.manual_seed`` seed it).
"""

from __future__ import annotations

from typing import Any

import torch

from pytest_mps.emulate.messages import not_emulated
from pytest_mps.emulate.policy import MPS


def is_mps_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "mps"
    if isinstance(device, str):
        return device.partition(":")[0].strip() == "mps"
    return False


class EmulatedGenerator(torch._C.Generator):
    """A generator of the emulated device: a CPU generator whose ``device`` is mps."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        """``mps:0``, as for a generator made with ``torch.Generator("mps")``."""
        return MPS

    def get_offset(self) -> int:
        """Not emulated: MPS's Philox offset (a CPU generator has none)."""
        __tracebackhide__ = True
        raise not_emulated("the MPS generator's Philox offset (Generator.get_offset)")

    def set_offset(self, offset: int) -> EmulatedGenerator:
        """Not emulated: MPS's Philox offset (a CPU generator has none)."""
        __tracebackhide__ = True
        raise not_emulated("the MPS generator's Philox offset (Generator.set_offset)")


#: The emulated device's default generator (``torch.mps.manual_seed`` seeds it).
default_generator = EmulatedGenerator()
