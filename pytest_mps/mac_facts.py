"""What macOS and Metal say about a Mac: the record and the reads that fill it.

:func:`.backend.mac_facts` fills :class:`MacFacts`, with the Metal device and
the frameworks' bundle versions read here.

Apart from :mod:`.backend`, which pytest imports at start-up, because creating
a NamedTuple class costs 0.3 ms there; this module is imported only where a
Mac's facts are read (on macOS) or made (tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple


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


FRAMEWORKS = Path("/System/Library/Frameworks")


def framework_version(name: str, root: Path = FRAMEWORKS) -> str | None:
    """A macOS framework's version from its bundle plist (``"368.12"``), or None.

    Reads ``<root>/<name>.framework/Resources/version.plist``, then its
    ``Info.plist``: ``CFBundleShortVersionString``, with ``CFBundleVersion``
    in parentheses where they differ.
    """
    import plistlib

    for leaf in ("version.plist", "Info.plist"):
        path = root / f"{name}.framework" / "Resources" / leaf
        try:
            with path.open("rb") as handle:
                data = plistlib.load(handle)
        except (OSError, plistlib.InvalidFileException, ValueError):
            continue
        short = data.get("CFBundleShortVersionString")
        build = data.get("CFBundleVersion") or data.get("ProjectVersion")
        if short and build and str(build) != str(short):
            return f"{short} ({build})"
        if short or build:
            return str(short or build)
    return None


def metal_device() -> dict[str, Any]:
    """The default Metal device's name and limits, through the Objective-C runtime.

    ctypes only (no PyObjC): ``MTLCreateSystemDefaultDevice`` then one
    ``objc_msgSend`` per property, each cast to its own signature (arm64
    needs that). Empty where anything fails.
    """
    import ctypes

    try:
        objc = ctypes.cdll.LoadLibrary("/usr/lib/libobjc.A.dylib")
        metal = ctypes.cdll.LoadLibrary(str(FRAMEWORKS / "Metal.framework" / "Metal"))
        metal.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
        device = metal.MTLCreateSystemDefaultDevice()
        if not device:
            return {}
        objc.sel_registerName.restype = ctypes.c_void_p
        objc.sel_registerName.argtypes = [ctypes.c_char_p]
        address = ctypes.cast(objc.objc_msgSend, ctypes.c_void_p).value
        if address is None:
            return {}

        def send(obj: int, selector: bytes, restype: Any) -> Any:
            call = ctypes.CFUNCTYPE(restype, ctypes.c_void_p, ctypes.c_void_p)(address)
            return call(obj, objc.sel_registerName(selector))

        name = send(device, b"name", ctypes.c_void_p)
        text = send(name, b"UTF8String", ctypes.c_char_p) if name else None
        return {
            "gpu": text.decode("utf-8", "replace") if text else None,
            "working_set": int(
                send(device, b"recommendedMaxWorkingSetSize", ctypes.c_uint64)
            ),
            "max_buffer": int(send(device, b"maxBufferLength", ctypes.c_uint64)),
        }
    except (OSError, AttributeError, ValueError, TypeError):
        return {}
