"""What macOS and Metal say about a Mac: the record :func:`.backend.mac_facts` fills.

Apart from :mod:`.backend`, which pytest imports at start-up, because creating
a NamedTuple class costs 0.3 ms there; this module is imported only where a
Mac's facts are read (on macOS) or made (tests).
"""

from __future__ import annotations

from typing import NamedTuple


class MacFacts(NamedTuple):
    """What macOS and Metal say about this Mac; None where a read fails.

    Sizes in bytes. ``working_set`` is Metal's ``recommendedMaxWorkingSetSize``
    (what ``torch.mps.recommended_max_memory()`` returns), ``max_buffer`` its
    ``maxBufferLength`` (the largest single buffer: PyTorch's allocator refuses
    a larger one with "Invalid buffer size").
    """

    macos: str | None
    #: ``sysctl kern.osversion``: ``"24F74"``
    build: str | None
    #: ``sysctl hw.model``: ``"Mac14,10"``; ``"VirtualMac2,1"`` in a VM
    model: str | None
    #: ``sysctl machdep.cpu.brand_string``: ``"Apple M1 (Virtual)"`` in a VM
    chip: str | None
    #: ``sysctl kern.hv_vmm_present``: True inside a virtual machine
    vmm: bool | None
    #: ``sysctl hw.memsize``
    memory: int | None
    #: the Metal device's name: ``"Apple M2 Pro"``, ``"Apple Paravirtual device"``
    gpu: str | None
    gpu_cores: int | None
    working_set: int | None
    max_buffer: int | None
    #: the frameworks' bundle versions, where their plists can be read
    metal: str | None
    mpsgraph: str | None
