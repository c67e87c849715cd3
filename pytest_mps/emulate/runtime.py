"""What a Mac's torch answers about its device, as the emulation answers it.

:class:`Runtime` holds the emulated ``torch._C._mps_*`` functions behind
``torch.mps`` and ``torch.backends.mps`` (availability, the macOS check,
memory, events); ``accelerator_functions`` answers ``torch.accelerator`` with
mps, whose :class:`EmulatedStream` is the device's one stream;
:class:`Streams` gives torch 2.15's ``torch.mps`` streams. :mod:`.install`
puts them into torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from pytest_mps.emulate import generator, memory, messages, tags, unreproduced

#: The name ``torch.backends.mps.get_name()`` gives the emulated GPU.
NAME = "Apple GPU (emulated by pytest-mps on the CPU)"


class Runtime:
    """The emulated ``torch._C._mps_*`` functions: device, memory, events."""

    def __init__(
        self, macos: tuple[int, int], budget: memory.Budget | None = None
    ) -> None:
        self.macos = macos
        self.budget = budget
        self.events: dict[int, float | None] = {}
        self.next_event = 1
        self.fraction = 1.0

    def functions(self) -> dict[str, Callable[..., Any]]:
        """``torch._C`` attribute name -> its emulation."""
        return {
            "_mps_is_available": lambda: True,
            "_mps_is_on_macos_or_newer": self.is_on_macos_or_newer,
            "_mps_is_in_bad_fork": lambda: False,
            "_mps_get_default_generator": lambda: generator.default_generator,
            "_mps_deviceSynchronize": lambda: None,
            "_mps_emptyCache": lambda: None,
            "_mps_setMemoryFraction": self.set_memory_fraction,
            "_mps_currentAllocatedMemory": unreproduced.allocator_statistic(
                "current_allocated_memory", tags.allocated_bytes
            ),
            "_mps_driverAllocatedMemory": unreproduced.allocator_statistic(
                "driver_allocated_memory", tags.allocated_bytes
            ),
            "_mps_recommendedMaxMemory": self.recommended_max_memory,
            "_mps_acquireEvent": self.acquire_event,
            "_mps_releaseEvent": self.release_event,
            "_mps_recordEvent": self.record_event,
            "_mps_waitForEvent": lambda event: None,
            "_mps_queryEvent": lambda event: True,
            "_mps_synchronizeEvent": lambda event: None,
            "_mps_elapsedTimeOfEvents": self.elapsed_time,
            "_mps_get_name": lambda: NAME,
            "_mps_get_core_count": lambda: 0,
            "_mps_maxBufferLength": self.max_buffer_length,
            # MTL_CAPTURE_ENABLED unset, as on a Mac out of the box
            "_mps_isCaptureEnabled": lambda: False,
            "_mps_isCapturing": lambda: False,
            "_mps_startCapture": messages.refuses(
                "Metal GPU capture (torch.mps.profiler.metal_capture)"
            ),
            "_mps_stopCapture": messages.refuses(
                "Metal GPU capture (torch.mps.profiler.metal_capture)"
            ),
            "_mps_profilerStartTrace": messages.refuses(
                "the Metal profiler (torch.mps.profiler)"
            ),
            "_mps_profilerStopTrace": messages.refuses(
                "the Metal profiler (torch.mps.profiler)"
            ),
            "_mps_compileShader": messages.refuses(
                "Metal shaders (torch.mps.compile_shader)"
            ),
            "_mps_loadMetallibFromPath": messages.refuses(
                "Metal libraries (torch.mps.load_metallib)"
            ),
            "_mps_loadMetalllib": messages.refuses(
                "Metal libraries (torch.mps.load_metallib)"
            ),
            "_mps_host_alias_storage": messages.refuses("host aliases of MPS storages"),
        }

    def is_on_macos_or_newer(self, major: int, minor: int) -> bool:
        """Against the emulated macOS (``--mps-emulate-macos``; default newest)."""
        return (major, minor) <= self.macos

    def set_memory_fraction(self, fraction: float) -> None:
        """The limit's ratio, as PyTorch's allocator takes it (with a memory size)."""
        if self.budget is not None:
            self.budget.set_fraction(float(fraction))
        self.fraction = float(fraction)

    def recommended_max_memory(self) -> int:
        """The emulated Mac's working set, or the host's memory without a size."""
        if self.budget is not None:
            return self.budget.recommended
        return host_memory()

    def max_buffer_length(self) -> int:
        """The largest buffer Metal allocates: the emulated working set."""
        return self.recommended_max_memory()

    def acquire_event(self, enable_timing: bool) -> int:
        """A new event id; its time is the host clock when it is recorded."""
        event = self.next_event
        self.next_event += 1
        self.events[event] = None
        return event

    def release_event(self, event: int) -> None:
        """Forget an event (``torch.mps.Event.__del__``)."""
        self.events.pop(event, None)

    def record_event(self, event: int) -> None:
        """Every queued op has already run: recording reads the clock."""
        self.events[event] = time.perf_counter()

    def elapsed_time(self, start: int, end: int) -> float:
        """Milliseconds between two recorded events, as ``Event.elapsed_time``."""
        first, last = self.events.get(start), self.events.get(end)
        if first is None or last is None:
            raise RuntimeError(
                "Both events must be recorded before calculating elapsed time."
            )
        return (last - first) * 1000.0


def host_memory() -> int:
    """The host's memory, where a Mac reports its GPU's working set (no limit)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class EmulatedStream:
    """The emulated device's one stream, as a Mac's ``current_stream()`` gives it.

    ``torch.accelerator.current_stream()`` and ``torch.mps.current_stream()``
    return it. The emulated device runs every op at once, so the stream has nothing in
    flight; MPS has no graph capture, so it never captures (torch 2.15's
    optimizers ask, in ``_accelerator_graph_capture_health_check``).
    """

    device_type = "mps"
    device_index = 0
    stream_id = 0

    @property
    def device(self) -> torch.device:
        """``mps:0``."""
        return torch.device("mps", 0)

    def is_capturing(self) -> bool:
        """Never: MPS has no graph capture."""
        return False

    def query(self) -> bool:
        """Always done: every op ran when it was called."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""
        return None

    def wait_stream(self, stream: Any) -> None:
        """Nothing to wait for: there is one stream."""
        return None

    def wait_event(self, event: Any) -> None:
        """Nothing to wait for: events are recorded done."""
        return None

    def record_event(self, event: Any = None) -> Any:
        """Record ``event`` (a new one when None) on this stream."""
        if event is None:
            event = torch.Event(self.device)
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmulatedStream)

    def __hash__(self) -> int:
        return hash(("mps", 0, 0))

    def __repr__(self) -> str:
        return "<emulated torch.mps.Stream stream_id=0>"


STREAM = EmulatedStream()


class EmulatedEvent(torch.mps.Event):
    """``torch.Event("mps")`` (or with no device) on the emulated device.

    The generic event of ``torch.Event``'s API over ``torch.mps.Event``, whose
    ``_mps_*`` functions the emulation answers (recorded at once, timed by the
    host clock).
    """

    def __init__(
        self,
        device: Any = None,
        *,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
    ) -> None:
        super().__init__(enable_timing=enable_timing)

    @property
    def device(self) -> torch.device:
        """``mps:0``."""
        return torch.device("mps", 0)

    @property
    def event_id(self) -> int:
        """The emulated event's number."""
        return int(self._Event__eventId)  # type: ignore[attr-defined]

    def record(self, stream: Any = None) -> None:
        """Record on the device's one stream."""
        super().record()

    def wait(self, stream: Any = None) -> None:
        """Nothing to wait for: every op has run."""
        super().wait()


def event_class(original: Any) -> Any:
    """``torch.Event`` that makes an :class:`EmulatedEvent` for mps (or none).

    ``isinstance(e, torch.Event)`` stays true for PyTorch's events and ours.
    """

    class Meta(type):
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, (original, EmulatedEvent))

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, (original, EmulatedEvent))

    class Event(metaclass=Meta):
        __doc__ = original.__doc__
        __module__ = "torch"

        def __new__(cls, device: Any = None, **options: Any) -> Any:
            if device is None or generator.is_mps_device(device):
                return EmulatedEvent(device, **options)
            return original(device, **options)

    return Event


def accelerator_functions() -> dict[str, Callable[..., Any]]:
    """``torch.accelerator``'s answers with an MPS device present."""

    def current_accelerator(check_available: bool = False) -> torch.device:
        return torch.device("mps")

    def synchronize(device: Any = None) -> None:
        return None

    def current_stream(device: Any = None) -> EmulatedStream:
        return STREAM

    return {
        "current_accelerator": current_accelerator,
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device_index": lambda: 0,
        "current_device_idx": lambda: 0,
        "synchronize": synchronize,
        "current_stream": current_stream,
    }


class Streams:
    """torch 2.15's MPS streams, below ``torch.mps.Stream`` as a Mac's ``torch._C``.

    torch 2.15 defines ``torch.mps.Stream`` over ``torch._C._MPSStreamBase``,
    which a Linux build lacks (``torch/mps/streams.py`` puts a dummy base there
    that refuses to be made), and reads and sets the current stream through
    ``torch._C._mps_getCurrentStream`` / ``_mps_setStream`` (pytorch#190375,
    #191415). The emulation gives the dummy base a stream's methods and answers
    those two, so torch's own Python runs unchanged: ``torch.mps.stream(s)``,
    ``current_stream()``, ``default_stream()`` (``stream_id=0``) and
    ``torch.mps.Event``'s refusal of a non-default stream, with 2.15's own text.
    ``Stream()`` makes a new stream (ids 1, 2, ...); as on the emulated device
    every op runs when it is called, no stream ever has work in flight.
    """

    def __init__(self) -> None:
        self.current = 0
        self.next = 1

    def functions(self) -> dict[str, Callable[..., Any]]:
        """``torch._C`` attribute name -> its emulation (torch 2.15's additions)."""
        return {
            "_mps_getCurrentStream": self.get_current,
            "_mps_setStream": self.set_current,
            # MPSAllocator's wait for the events on these buffers: nothing is
            # ever in flight, so nothing is waited for
            "_mps_allocator_waitForEvents": lambda ptrs: False,
        }

    def get_current(self) -> Any:
        """The current stream, as ``torch._C._mps_getCurrentStream()``."""
        return torch._C._MPSStreamBase(stream_id=self.current)  # type: ignore[attr-defined]

    def set_current(self, stream: Any) -> None:
        """Make ``stream`` current, as ``torch._C._mps_setStream(stream)``."""
        if not isinstance(stream, torch._C._MPSStreamBase):  # type: ignore[attr-defined]
            raise TypeError(
                "_mps_setStream(): argument 'stream' must be torch._C._MPSStreamBase, "
                f"not {type(stream).__name__}"
            )
        self.current = stream.stream_id

    def base_methods(self) -> dict[str, Any]:
        """What the dummy ``_MPSStreamBase`` gets: a constructor, a stream's methods."""
        streams = self

        def new(cls: type, *, stream_id: int | None = None) -> Any:
            stream: Any = object.__new__(cls)
            if stream_id is None:
                stream_id = streams.next
                streams.next += 1
            stream.__dict__[_STREAM_ID] = int(stream_id)
            return stream

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            return None

        def eq(self: Any, other: object) -> bool:
            if not isinstance(other, torch._C._MPSStreamBase):  # type: ignore[attr-defined]
                return NotImplemented  # type: ignore[no-any-return]
            return bool(self.stream_id == other.stream_id)

        def record_event(self: Any, event: Any = None) -> Any:
            if event is None:
                event = torch.Event(torch.device("mps", 0))
            event.record(self)
            return event

        return {
            "__new__": staticmethod(new),
            "__init__": init,
            "stream_id": property(lambda self: self.__dict__[_STREAM_ID]),
            "device": property(lambda self: torch.device("mps", 0)),
            "device_type": "mps",
            "device_index": 0,
            "synchronize": lambda self: None,
            "query": lambda self: True,
            # MPS has no graph capture (2.15's optimizers ask before a step)
            "is_capturing": lambda self: False,
            "wait_stream": lambda self, stream: None,
            "wait_event": lambda self, event: None,
            "record_event": record_event,
            "__eq__": eq,
            "__hash__": lambda self: hash(("mps", 0, self.stream_id)),
        }


_STREAM_ID = "_pytest_mps_stream_id"


def dummy_stream_base() -> Any:
    """Torch 2.15+'s ``torch._C._MPSStreamBase`` where it is a dummy, else None.

    On torch before 2.15 there is none: nothing of the stream API appears.
    """
    import torch.mps

    if not hasattr(torch.mps, "Stream"):
        return None
    base = getattr(torch._C, "_MPSStreamBase", None)
    if base is None or base.__module__ != "torch._utils":  # _dummy_type's
        return None
    return base


#: The ``torch.mps`` names the emulation was written against (torch 2.6-2.15):
#: ``benchmarks/torch_facts.py`` names any other a new torch adds.
KNOWN_MPS_API = frozenset(
    {
        "Event",
        "Stream",
        "compile_shader",
        "current_allocated_memory",
        "current_stream",
        "default_stream",
        "device_count",
        "driver_allocated_memory",
        "empty_cache",
        "get_rng_state",
        "is_available",
        "load_metallib",
        "manual_seed",
        "profiler",
        "recommended_max_memory",
        "seed",
        "set_per_process_memory_fraction",
        "set_rng_state",
        "set_stream",
        "stream",
        "synchronize",
    }
)

#: Likewise for ``torch.backends.mps``.
KNOWN_BACKENDS_MPS_API = frozenset(
    {
        "get_core_count",
        "get_name",
        "is_available",
        "is_built",
        "is_macos13_or_newer",
        "is_macos_or_newer",
    }
)
