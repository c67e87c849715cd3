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
    #: the newest ``MTLGPUFamilyAppleN`` the GPU supports: 7 for M1, 9 for M4
    #: (Apple's Metal feature set tables); 5 for hosted runners' paravirtual
    #: GPU (qvac#3775: "GPU family: MTLGPUFamilyApple5 (1005)")
    gpu_family: int | None = None
    #: Metal's ``bfloat`` type: Apple6 and newer (Apple's tables; qvac#3788)
    bfloat16: bool | None = None
    #: where the GPU's facts came from: ``MTLCreateSystemDefaultDevice``,
    #: ``MTLCopyAllDevices`` (a command-line process that has not loaded
    #: CoreGraphics gets no default device) or ``torch``
    gpu_source: str | None = None


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


#: ``MTLGPUFamilyApple1`` is 1001, ``...Apple10`` 1010 (MTLDevice.h).
APPLE_FAMILIES = range(1010, 1000, -1)
#: The first family with Metal's ``bfloat`` type (Apple's feature set tables).
BFLOAT_FAMILY = 6


class ObjC:
    """The few Objective-C calls read here, through ctypes (no PyObjC).

    One ``objc_msgSend`` per call, cast to its own signature (arm64 needs
    that). Tests give an object with the same methods (the MPS shim).
    """

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.objc = ctypes.cdll.LoadLibrary("/usr/lib/libobjc.A.dylib")
        self.metal = ctypes.cdll.LoadLibrary(
            str(FRAMEWORKS / "Metal.framework" / "Metal")
        )
        self.objc.sel_registerName.restype = ctypes.c_void_p
        self.objc.sel_registerName.argtypes = [ctypes.c_char_p]
        address = ctypes.cast(self.objc.objc_msgSend, ctypes.c_void_p).value
        if address is None:
            raise OSError("objc_msgSend has no address")
        self.address = address

    def send(self, obj: int, selector: bytes, restype: Any, *args: Any) -> Any:
        """``objc_msgSend(obj, selector, *args)`` returning ``restype``."""
        c = self.ctypes
        types = [c.c_void_p, c.c_void_p] + [type(a) for a in args]
        call = c.CFUNCTYPE(restype, *types)(self.address)
        return call(obj, self.objc.sel_registerName(selector), *args)

    def default_device(self) -> int | None:
        """``MTLCreateSystemDefaultDevice()``: NULL in many command-line processes."""
        self.metal.MTLCreateSystemDefaultDevice.restype = self.ctypes.c_void_p
        found: int | None = self.metal.MTLCreateSystemDefaultDevice()
        return found or None

    def all_devices(self) -> list[int]:
        """``MTLCopyAllDevices()``, as PyTorch enumerates them (MPSDevice.mm)."""
        c = self.ctypes
        self.metal.MTLCopyAllDevices.restype = c.c_void_p
        array = self.metal.MTLCopyAllDevices()
        if not array:
            return []
        count = int(self.send(array, b"count", c.c_ulong))
        return [
            self.send(array, b"objectAtIndex:", c.c_void_p, c.c_ulong(i))
            for i in range(count)
        ]

    def text(self, obj: int, selector: bytes) -> str | None:
        """An ``NSString`` property as text."""
        c = self.ctypes
        string = self.send(obj, selector, c.c_void_p)
        raw = self.send(string, b"UTF8String", c.c_char_p) if string else None
        return raw.decode("utf-8", "replace") if raw else None

    def size(self, obj: int, selector: bytes) -> int:
        """A ``uint64_t``/``NSUInteger`` property."""
        return int(self.send(obj, selector, self.ctypes.c_uint64))

    def supports_family(self, obj: int, family: int) -> bool:
        """``[device supportsFamily:family]``."""
        c = self.ctypes
        return bool(self.send(obj, b"supportsFamily:", c.c_bool, c.c_long(family)))


def metal_device(objc: Any = None) -> dict[str, Any]:
    """The Metal GPU's name, limits, family and bfloat16 support; empty on failure.

    The default device, else the first of ``MTLCopyAllDevices`` (a process
    that has not loaded CoreGraphics, over SSH or in CI, gets NULL from
    ``MTLCreateSystemDefaultDevice``: Apple's documentation, pyobjc#390,
    candle#3449; PyTorch enumerates all devices itself). ``objc``: an
    :class:`ObjC` (made here where None).
    """
    try:
        runtime = objc if objc is not None else ObjC()
        source = "MTLCreateSystemDefaultDevice"
        device = runtime.default_device()
        if not device:
            source = "MTLCopyAllDevices"
            devices = runtime.all_devices()
            device = devices[0] if devices else None
        if not device:
            return {}
        family = next(
            (f - 1000 for f in APPLE_FAMILIES if runtime.supports_family(device, f)),
            None,
        )
        return {
            "gpu": runtime.text(device, b"name"),
            "working_set": runtime.size(device, b"recommendedMaxWorkingSetSize"),
            "max_buffer": runtime.size(device, b"maxBufferLength"),
            "gpu_family": family,
            "bfloat16": None if family is None else family >= BFLOAT_FAMILY,
            "gpu_source": source,
        }
    except (OSError, AttributeError, ValueError, TypeError):
        return {}
