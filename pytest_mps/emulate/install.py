"""Putting the emulated Mac into torch, and taking it out again.

On a Linux build, ``torch._C`` has the ``_mps_*`` functions that
``torch.mps`` and ``torch.backends.mps`` call, each raising "Cannot execute
... without MPS backend". The emulation replaces exactly those with
:class:`~.runtime.Runtime`'s and sets ``torch._C._has_mps``, so PyTorch's own Python
layer (``torch.mps.manual_seed``, ``torch.mps.Event``,
``torch.backends.mps.is_available``, autocast's macOS check) runs unchanged on
top. It also swaps in ``torch.Generator`` (``torch.Generator("mps")`` makes
an :class:`~.generator.EmulatedGenerator`), answers ``torch.accelerator``'s
questions with mps, registers the ``torch.save`` tag (:mod:`.serialization`)
and enters the session's :class:`~.tagged.TagMode`, in the calling thread
and in every thread started while it is installed (torch function modes are
thread-local: without this, ``torch.ones(3, device="mps")`` in a worker thread
would reach the dispatcher as on a Linux build). :meth:`Emulation.undo`
restores every attribute it replaced. The host answers ``platform``'s
questions as an Apple-silicon Mac (:mod:`.host`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from pytest_mps import ops as mps_ops
from pytest_mps.emulate import (
    backward,
    dlpack,
    explain,
    extensions,
    generator,
    host,
    lazy,
    memory,
    op_rules,
    patching,
    policy,
    runtime,
    scripts,
    serialization,
    tagged,
    tags,
    widen,
)


def generator_class(original: Any) -> Any:
    """``torch.Generator`` that makes an emulated generator for ``"mps"``.

    ``isinstance(g, torch.Generator)`` stays true for every generator.
    """

    class Meta(type(original)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, original)

    class Generator(original, metaclass=Meta):  # type: ignore[misc]
        __doc__ = original.__doc__

        def __new__(cls, device: Any = "cpu") -> Any:
            if generator.is_mps_device(device):
                return generator.EmulatedGenerator()
            return original(device)

    return Generator


def grouping(
    original: Callable[..., Any], is_emulated: Callable[[Any], bool]
) -> Callable[..., Any]:
    """``torch._C._group_tensors_by_device_and_dtype``, keyed by mps for ours.

    PyTorch's C++ groups by the C++ device, the CPU for an emulated tensor;
    optimizers and ``clip_grad_norm_`` then move values ``.to(device)`` of
    the group, which would be a copy to the host where a Mac stays on MPS.
    """

    def group(tensorlistlist: Any, with_indices: bool = False) -> Any:
        grouped = original(tensorlistlist, with_indices)
        firsts = tensorlistlist[0] if tensorlistlist else ()
        if not any(is_emulated(t) for t in firsts):
            return grouped
        regrouped: dict[Any, Any] = {}
        for (device, dtype), (lists, indices) in grouped.items():
            for j, first in enumerate(lists[0]):
                key = (policy.MPS if is_emulated(first) else device, dtype)
                entry = regrouped.get(key)
                if entry is None:
                    entry = regrouped[key] = ([[] for _ in lists], [])
                for k, values in enumerate(lists):
                    if values:  # an unused list (max_exp_avg_sqs) stays empty
                        entry[0][k].append(values[j])
                if with_indices:
                    entry[1].append(indices[j])
        return {key: (lists, indices) for key, (lists, indices) in regrouped.items()}

    return group


class AutocastPatch:
    """``torch.autocast("mps")`` also enters the CPU's autocast at its dtype.

    The emulated tensors are CPU tensors to the dispatcher, so the CPU's
    autocast kernels are the ones that cast them; they apply the CPU's op
    lists (torch/csrc/autocast: MPS's lists differ in a few ops). Plain CPU
    tensors in the block are cast too, which a Mac would not do.
    """

    def __init__(self) -> None:
        from torch.amp.autocast_mode import autocast

        self.owner = autocast
        enter, leave = autocast.__enter__, autocast.__exit__
        self.saved = enter, leave

        def patched_enter(block: Any) -> Any:
            result = enter(block)  # type: ignore[no-untyped-call]
            if block.device == "mps":
                widen.autocast_blocks[0] += 1
                inner = autocast(
                    "cpu",
                    dtype=block.fast_dtype,
                    enabled=block._enabled,
                    cache_enabled=block._cache_enabled,
                )
                enter(inner)  # type: ignore[no-untyped-call]
                block._pytest_mps_cpu = inner
            return result

        def patched_exit(block: Any, *exc: Any) -> Any:
            inner = block.__dict__.pop("_pytest_mps_cpu", None)
            if inner is not None:
                widen.autocast_blocks[0] -= 1
                leave(inner, *exc)
            return leave(block, *exc)

        autocast.__enter__ = patched_enter  # type: ignore[method-assign]
        autocast.__exit__ = patched_exit  # type: ignore[method-assign]

    def undo(self) -> None:
        """Put ``torch.autocast`` back."""
        self.owner.__enter__, self.owner.__exit__ = self.saved  # type: ignore[method-assign]


COMPILE_WARNING = (
    "torch.compile runs the function eagerly under --mps-emulate: the emulated "
    "device has no compiler (on a Mac, inductor generates Metal kernels)"
)


def compile_eagerly() -> Callable[..., Any]:
    """``torch.compile`` that runs what it is given eagerly, with one warning.

    Dynamo cannot trace the emulated tensors (it asks the C++ accelerator,
    which a Linux build lacks); running eagerly keeps every check of the
    emulation in place. A module comes back as PyTorch's ``OptimizedModule``
    with dynamo disabled, so ``_orig_mod``, its ``state_dict`` keys and
    ``isinstance`` checks are those of a compiled module; a function comes
    back as it is.
    """
    import warnings

    warned = [False]

    def compile(model: Any = None, **options: Any) -> Any:
        if not warned[0]:
            warned[0] = True
            warnings.warn(COMPILE_WARNING, UserWarning, stacklevel=2)
        if model is None:
            return lambda function: compile(function, **options)
        if isinstance(model, torch.nn.Module):
            from torch._dynamo.eval_frame import DisableContext, OptimizedModule

            return OptimizedModule(model, DisableContext())
        return model

    return compile


def thread_start(
    start: Callable[[threading.Thread], None], emulation: Emulation
) -> Callable[[threading.Thread], None]:
    """``Thread.start`` that runs the thread inside the session's mode.

    The thread's own ``run`` (a subclass's too) is wrapped on the instance, so
    ``threading.Thread``, ``concurrent.futures`` pools and DataLoader's
    pin-memory thread all see the emulated device; a thread started after
    :meth:`Emulation.undo` is left alone.
    """

    def start_emulated(thread: threading.Thread) -> None:
        mode = emulation.mode
        if mode is not None:
            run = thread.run

            def run_emulated() -> None:
                try:
                    with mode:
                        run()
                finally:
                    del thread.run

            thread.run = run_emulated  # type: ignore[method-assign]
        start(thread)

    return start_emulated


class Emulation:
    """One emulated session: the policy, the patches and the mode.

    Device tensors are plain CPU tensors whose storages are tagged
    (:mod:`.tags`), judged per torch call (:mod:`.tagged`) and per aten op
    where a kernel is missing or refuses arguments (:mod:`.op_rules`). See
    ``docs/emulation-design.md``.
    """

    def __init__(
        self,
        macos: tuple[int, int],
        fallback: bool,
        budget: memory.Budget | None = None,
    ) -> None:
        self.policy = policy.Policy(mps_ops.load_table(), fallback, macos)
        self.budget = budget
        self.runtime = runtime.Runtime(macos, budget)
        self.patches = patching.Patches()
        self.mode: tagged.TagMode | None = None
        self.serialization: serialization.Patches | None = None
        self.autocast: AutocastPatch | None = None
        self.lazy: lazy.Patches | None = None
        self.scripts: scripts.ScriptCalls | None = None
        self.explain: explain.ExplainCalls | None = None
        self.extensions: extensions.ExtensionCalls | None = None

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self.patches.patch(owner, name, value)

    def install(self) -> None:
        """Patch torch and enter the mode (in the calling thread)."""
        import torch.accelerator
        import torch.backends.mps
        import torch.utils.dlpack

        policy.current[0] = self.policy
        memory.current[0] = self.budget
        generator.default_generator.manual_seed(torch.initial_seed())
        self._set(torch._C, "_has_mps", True)
        tags.on_new[0] = None if self.budget is None else self.budget.track
        for name, function in self.runtime.functions().items():
            self._set(torch._C, name, function)
        host.present(self.patches, self.runtime.macos)
        host.note_processes(self.patches)
        backward.install(self.patches, lambda: self.mode)
        self._set(torch, "Generator", generator_class(torch.Generator))
        if hasattr(torch, "Event"):
            self._set(torch, "Event", runtime.event_class(torch.Event))
        self._set(torch, "range", self._range(torch.range))
        device = torch.UntypedStorage.device
        self._set(torch.UntypedStorage, "device", tags.storage_device(device))
        self._set(
            torch.UntypedStorage, "cpu", tags.storage_cpu(torch.UntypedStorage.cpu)
        )
        for owner in (torch._C, torch.utils.dlpack):  # older torch: a name of its own
            if hasattr(owner, "_from_dlpack"):
                self._set(owner, "_from_dlpack", dlpack.importer(owner._from_dlpack))
        self._set(torch, "compile", compile_eagerly())
        self._set(
            torch._C,
            "_group_tensors_by_device_and_dtype",
            grouping(torch._C._group_tensors_by_device_and_dtype, tags.tagged),
        )
        # torch.accelerator's C++ getter (a Linux CPU build has none)
        self._set(
            torch._C,
            "_accelerator_getDefaultGenerator",
            lambda index=0: generator.default_generator,
        )
        explain.accelerator_as_built.clear()
        for name, function in runtime.accelerator_functions().items():
            if hasattr(torch.accelerator, name):
                if name in vars(torch.accelerator):
                    explain.accelerator_as_built[name] = vars(torch.accelerator)[name]
                self._set(torch.accelerator, name, function)
        stream_base = runtime.dummy_stream_base()
        if stream_base is not None:  # torch 2.15+: torch.mps.Stream
            streams = runtime.Streams()
            for name, value in streams.base_methods().items():
                self._set(stream_base, name, value)
            for name, function in streams.functions().items():
                self._set(torch._C, name, function)
            # on a Mac, the accelerator's current stream is torch.mps's
            self._set(
                torch.accelerator,
                "current_stream",
                lambda device=None: torch.mps.current_stream(),  # type: ignore[attr-defined]
            )
        _clear_caches(torch.backends.mps)
        self.serialization = serialization.Patches(_tag_loaded)
        self.autocast = AutocastPatch()
        self.lazy = lazy.Patches()
        from pytest_mps.watch import device_mix

        op_rules.register(self.policy)
        op_rules.activate(self.policy)
        device_mix.on_host[0] = tagged.on_host
        device_mix.on_device[0] = tags.tagged
        device_mix.judged[0] = True
        self.scripts = scripts.ScriptCalls()
        self.mode = tagged.TagMode(self.policy)
        self.explain = explain.ExplainCalls(self.mode)
        self.extensions = extensions.ExtensionCalls()
        self._set(threading.Thread, "start", thread_start(threading.Thread.start, self))
        self.mode.__enter__()  # type: ignore[no-untyped-call]

    def _range(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.range``: C++ makes its tensor without asking the mode."""

        def range(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
            __tracebackhide__ = True
            device = kwargs.get("device")
            if self.mode is not None and device is not None:
                if generator.is_mps_device(device) or type(device) is int:
                    return self.mode._factory(original, args, kwargs)
            return original(*args, **kwargs)

        range.__doc__ = original.__doc__
        return range

    def undo(self) -> None:
        """Leave the mode and restore everything :meth:`install` replaced."""
        import torch.backends.mps
        import torch.utils.dlpack

        if self.mode is not None:
            self.mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            self.mode = None
        if self.serialization is not None:
            self.serialization.undo()
            self.serialization = None
        if self.lazy is not None:
            self.lazy.undo()
            self.lazy = None
        if self.scripts is not None:
            self.scripts.undo()
            self.scripts = None
        if self.explain is not None:
            self.explain.undo()
            self.explain = None
        explain.accelerator_as_built.clear()
        if self.extensions is not None:
            self.extensions.undo()
            self.extensions = None
        if self.autocast is not None:
            self.autocast.undo()
            self.autocast = None
        from pytest_mps.watch import device_mix

        device_mix.on_host[0] = None
        device_mix.on_device[0] = None
        device_mix.judged[0] = False
        op_rules.activate(None)
        tags.on_new[0] = None
        self.patches.undo()
        if self.runtime.events:
            # Events made under the emulation and still alive call
            # _mps_releaseEvent when collected: release ours quietly until
            # the last is gone, then leave torch's own function in place.
            torch._C._mps_releaseEvent = _draining(  # type: ignore[assignment]
                self.runtime.events, torch._C._mps_releaseEvent
            )
        _clear_caches(torch.backends.mps)
        policy.current[0] = None
        memory.current[0] = None


def _tag_loaded(host: torch.Tensor) -> torch.Tensor:
    """A tensor ``torch.load`` puts on the device."""
    __tracebackhide__ = True
    found = policy.current[0]
    if found is not None:
        error = found.dtype_error(host.dtype)
        if error is not None:
            raise error
    tags.tag(host)
    return host


def _draining(events: dict[int, Any], original: Any) -> Callable[[int], None]:
    def release(event: int) -> None:
        if event not in events:
            original(event)
            return
        del events[event]
        if not events and torch._C._mps_releaseEvent is release:
            torch._C._mps_releaseEvent = original

    return release


def _clear_caches(module: Any) -> None:
    # is_available, is_macos_or_newer, get_name... are lru_cached: an answer
    # read before (or during) the emulation must not outlive it
    for value in vars(module).values():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()
