"""One dispatch mode per test, shared by every concern that watches aten ops.

pytest-mps watches what a test does on the device (host syncs, mixed devices,
MPS readiness, memory) by looking at the aten ops it runs. A Python
``TorchDispatchMode`` costs several microseconds per op, so there is exactly
one per test, and none at all when nobody asked to watch that test.

API for other modules and plugins
---------------------------------
``OpCallback``
    ``callback(func, args, kwargs) -> None``: called *before* each aten op runs,
    with ``func`` a ``torch._ops.OpOverload`` (compare by identity with
    ``torch.ops.aten.nonzero.default``; ``func._schema.name`` is
    ``"aten::nonzero"``), and the op's positional and keyword arguments
    (``kwargs`` may be an empty read-only mapping: do not mutate it).
    Raising fails the op at the user's line (``forbid_host_sync`` does this).
    Callbacks must be cheap: they run for every op, unless the callback has
    an ``ops`` attribute (a collection of OpOverloads): then it runs only for
    those, at the cost of one dict lookup per op shared by all such callbacks.
    A callback with ``every_op = False`` only needs the ops of calls that could
    sync or mix devices: when every callback of a mode says so, the mode is
    entered through :mod:`pytest_mps.watch.front`, which lets calls known to
    be clean (``F.linear`` on one device) run unwatched; ``watches_cpu =
    False`` adds that reading a CPU tensor (``t.item()``) is no concern of
    that callback. A callback with a ``host_read(func, args, kwargs)``
    method is also shown the torch calls that read tensor data back to
    Python (``Tensor.tolist``, ``Tensor.__repr__``, ``Tensor.cpu``, ...),
    before they run, whether or not they run an aten op. Ops whose
    CompositeImplicitAutograd kernel the dispatcher hands over undecomposed
    (under ``torch.inference_mode()``: ``aten::linear``, ``aten::item``) are
    decomposed first, so callbacks see the ops that really run.

``pytest_mps_watch_ops(item)`` (hook, in :mod:`pytest_mps.hookspecs`)
    Return an ``OpCallback`` to watch ``item``'s call phase, or None. Every
    returned callback is registered on the test's one mode; when all
    implementations return None no mode is installed. Example::

        def pytest_mps_watch_ops(item):
            if item.get_closest_marker("mps_audit") is None:
                return None
            seen = item.stash.setdefault(ops_key, set())
            return lambda func, args, kwargs: seen.add(func)

``watching(callbacks, every_op=False)``
    Context manager: watches the block with a new mode calling ``callbacks``,
    through the front unless ``every_op`` or a callback needs every op.

``op_watch(callback)``
    Context manager: adds ``callback`` to the running watch mode (the test's),
    or enters a fresh one when none runs (or when the running one skips clean
    calls and ``callback`` needs every op). ``forbid_host_sync`` is built on it.

``user_location()``
    ``"path:line"`` of the innermost frame outside torch, pytest-mps and
    pluggy/pytest: the user's line that issued the current op or warning.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_mps.watch import OpCallback

_NO_KWARGS: Mapping[str, Any] = types.MappingProxyType({})

#: The watch modes entered and not yet exited, innermost last.
_active: list[Any] = []


def _cheap_dynamo_skip() -> Callable[[types.CodeType], None] | None:
    """Mark a code object (and what it calls) as skipped by Dynamo, at no per-call cost.

    TorchDispatchMode wraps ``__torch_dispatch__`` in ``torch._dynamo.disable``,
    which costs several Python calls per op; the C-level frame strategy does the
    same job once. None where this torch lacks it (then the wrapper stays).
    """
    try:
        from torch._C._dynamo import eval_frame

        action = eval_frame._FrameAction.SKIP
        strategy = eval_frame._FrameExecStrategy(action, action)
        setter = eval_frame.set_code_exec_strategy
    except (ImportError, AttributeError, TypeError):
        return None
    return lambda code: setter(code, strategy)


@lru_cache(maxsize=1)
def _mode_class() -> type[Any]:
    """The ``TorchDispatchMode`` subclass, built on first use (torch is lazy)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from pytest_mps.watch.attribution import plugin_running

    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    op_overload = torch._ops.OpOverload
    skip = _cheap_dynamo_skip()
    # id(OpOverload) -> True when it has a CompositeImplicitAutograd kernel to
    # decompose into; filled once per op. Keyed by id(): OpOverload.__hash__ is
    # a Python method, and ops are long-lived singletons.
    composite: dict[int, bool] = {}

    class WatchMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Runs each registered callback before every aten op."""

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return skip is None

        def __init__(self, callbacks: list[OpCallback]) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.callbacks = callbacks
            self.every: tuple[OpCallback, ...] = ()
            self.by_op: dict[int, tuple[OpCallback, ...]] = {}
            self.fronted = False  # entered through the front (see watching)
            self.reading = False  # a reads front shows it host reads (see watching)
            self.rebuild()

        def rebuild(self) -> None:
            """Split callbacks into every-op ones and op-filtered ones (``.ops``)."""
            every: list[OpCallback] = []
            by_op: dict[int, list[OpCallback]] = {}
            for callback in self.callbacks:
                ops = getattr(callback, "ops", None)
                if ops is None:
                    every.append(callback)
                else:
                    for op in ops:
                        by_op.setdefault(id(op), []).append(callback)
            self.every = tuple(every)
            self.by_op = {op: tuple(cbs) for op, cbs in by_op.items()}
            # whether some callback cares about calls on CPU tensors alone
            self.watches_cpu = any(
                getattr(cb, "watches_cpu", True) for cb in self.callbacks
            )
            #: the callbacks' ``host_read`` methods, shown calls that read data
            #: back (``t.tolist()``) by the front before they run
            self.readers = tuple(
                cb.host_read for cb in self.callbacks if hasattr(cb, "host_read")
            )

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            __tracebackhide__ = True
            if plugin_running[0]:  # the plugin's own work: not watched
                return func(*args, **(kwargs or _NO_KWARGS))
            key = id(func)
            is_composite = composite.get(key)
            if is_composite is None:
                is_composite = composite[key] = bool(
                    has_kernel(func.name(), "CompositeImplicitAutograd")
                )
            if is_composite:
                # Under inference_mode the dispatcher skips the Autograd keys
                # where composites decompose, so the mode sees `aten::item`
                # and not `aten::_local_scalar_dense`: decompose here, inside
                # the mode, so its parts are watched too.
                with self:
                    out = func.decompose(*args, **(kwargs or _NO_KWARGS))
                if out is not NotImplemented:
                    return out
            seen = kwargs or _NO_KWARGS
            for callback in self.every:
                callback(func, args, seen)
            chosen = self.by_op.get(key)
            if chosen is not None:
                for callback in chosen:
                    callback(func, args, seen)
            # OpOverload.__call__ is a Python frame around ._op: skip it
            run = func._op if type(func) is op_overload else func
            if kwargs:
                return run(*args, **kwargs)
            return run(*args)

        def __enter__(self) -> Any:
            _active.append(self)
            return super().__enter__()  # type: ignore[no-untyped-call]

        def __exit__(self, *exc: object) -> None:
            super().__exit__(*exc)  # type: ignore[no-untyped-call]
            _active.remove(self)

        @property
        def skips_clean_calls(self) -> bool:
            """True when every callback can do without the ops of clean calls."""
            return all(not needs_every_op(cb) for cb in self.callbacks)

    if skip is not None:
        skip(WatchMode.__torch_dispatch__.__code__)
    return WatchMode


def needs_every_op(callback: OpCallback) -> bool:
    """False when ``callback`` says it can skip clean calls (``every_op = False``)."""
    return bool(getattr(callback, "every_op", True))


def watch_mode(callbacks: list[OpCallback]) -> Any:
    """A new (not yet entered) watch mode calling ``callbacks`` before each op."""
    return _mode_class()(callbacks)


def active_mode() -> Any | None:
    """The innermost watch mode currently entered, or None."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def watching(callbacks: list[OpCallback], every_op: bool = False) -> Iterator[Any]:
    """Watch the block with a new mode calling ``callbacks``; yields the mode.

    Entered through the front (only calls not known to be clean are watched op
    by op) unless ``every_op`` is true or some callback needs every op.
    """
    mode = watch_mode(callbacks)
    if every_op or not mode.skips_clean_calls:
        with mode, _reads_shown(mode):
            yield mode
        return
    from pytest_mps.watch.front import front

    mode.fronted = True
    _active.append(mode)
    try:
        with front(mode):
            yield mode
    finally:
        _active.remove(mode)


@contextlib.contextmanager
def op_watch(callback: OpCallback) -> Iterator[None]:
    """Call ``callback`` before every aten op run inside the block.

    Joins the running watch mode when there is one (one mode per test), else
    enters a fresh one for the block. A callback that needs every op does not
    join a mode that skips clean calls: it gets its own mode for the block.
    """
    mode = active_mode()
    if mode is not None and not (
        getattr(mode, "fronted", False) and needs_every_op(callback)
    ):
        mode.callbacks.append(callback)
        mode.rebuild()
        try:
            with _reads_shown(mode):
                yield
        finally:
            mode.callbacks.remove(callback)
            mode.rebuild()
        return
    with watching([callback]):
        yield


@contextlib.contextmanager
def _reads_shown(mode: Any) -> Iterator[None]:
    """Show host reads to a mode watched op by op, when a callback looks at them.

    On the CPU no aten op tells that ``t.tolist()`` or ``repr(t)`` reads data
    back; the front shows such calls to ``host_read`` callbacks, and a mode
    without the front gets a small function mode that does only that.
    """
    if mode.fronted or mode.reading or not mode.readers:
        yield
        return
    from pytest_mps.watch.front import reads_front

    mode.reading = True
    try:
        with reads_front(mode):
            yield
    finally:
        mode.reading = False
