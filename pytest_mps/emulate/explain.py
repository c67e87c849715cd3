"""``torch._dynamo.explain`` under the tags design: traced outside the function mode.

Dynamo traces every torch-function mode on the stack into the graphs it
builds. The tags design's mode (:class:`.tagged.TagMode`) reads each tensor's
storage, which Dynamo cannot trace, so ``explain`` would count graph breaks
inside pytest-mps that a Mac never has (torch_geometric's
``test_compile_graph_breaks``). While installed, ``torch._dynamo.explain``
runs the function with the mode taken off the stack: Dynamo sees device
tensors as the CPU tensors they are, and counts the graphs and breaks of the
user's code alone. ``torch.compile`` already runs eagerly under the emulation.

``torch._dynamo`` takes seconds to import, so it is not imported here: its
``explain`` is replaced when something imports it, through an import hook.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pytest_mps.emulate import patching

MODULE = "torch._dynamo"


@contextlib.contextmanager
def outside(mode: Any) -> Iterator[None]:
    """Run the block with ``mode`` off the torch-function mode stack.

    The modes above it stay, in their order; ``mode`` goes back where it was.
    """
    stack = torch.overrides._get_current_function_mode_stack()  # type: ignore[no-untyped-call]
    if not any(m is mode for m in stack):
        yield
        return
    above: list[Any] = []
    while True:
        top = torch._C._pop_torch_function_stack()
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        torch._C._push_on_torch_function_stack(other)
    try:
        yield
    finally:
        for _ in above:
            torch._C._pop_torch_function_stack()
        torch._C._push_on_torch_function_stack(mode)
        for other in reversed(above):
            torch._C._push_on_torch_function_stack(other)


@contextlib.contextmanager
def as_built(owner: Any, originals: dict[str, Any]) -> Iterator[None]:
    """Run the block with ``owner``'s attributes ``originals`` put back.

    torch 2.15's Dynamo asks ``torch.accelerator.current_accelerator()`` and
    then C++ for that device's current stream, which refuses the emulated mps
    (``mps doesn't match the current accelerator cuda``); outside the mode
    Dynamo traces CPU tensors, so it gets the build's own answers too.
    """
    patched = {name: owner.__dict__[name] for name in originals}
    for name, value in originals.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in patched.items():
            setattr(owner, name, value)


#: ``torch.accelerator``'s own functions while the emulation answers in their
#: place (set by :mod:`.install`, emptied at its undo).
accelerator_as_built: dict[str, Any] = {}


@contextlib.contextmanager
def accelerator_of_the_build() -> Iterator[None]:
    """``torch.accelerator`` as the build answers, while Dynamo traces CPU tensors."""
    with as_built(torch.accelerator, dict(accelerator_as_built)):
        yield


def explaining(explain: Callable[..., Any], mode: Any) -> Callable[..., Any]:
    """``torch._dynamo.explain`` that traces outside ``mode``."""

    @contextlib.contextmanager
    def traced_as_the_cpu() -> Iterator[None]:
        with outside(mode), accelerator_of_the_build():
            yield

    @functools.wraps(explain)
    def wrapper(f: Any, *extra_args: Any, **extra_kwargs: Any) -> Any:
        if extra_args or extra_kwargs:  # the deprecated explain(f, *args)
            with traced_as_the_cpu():
                return explain(f, *extra_args, **extra_kwargs)
        inner = explain(f)

        @functools.wraps(inner)
        def run(*args: Any, **kwargs: Any) -> Any:
            with traced_as_the_cpu():
                return inner(*args, **kwargs)

        return run

    return wrapper


class ExplainCalls(patching.OnImport):
    """Replaces ``torch._dynamo.explain`` now, or when it is first imported."""

    def __init__(self, mode: Any) -> None:
        self.mode = mode
        super().__init__(MODULE)

    def imported(self, module: Any) -> None:
        """Wrap ``explain`` to trace outside the mode."""
        explain = getattr(module, "explain", None)
        if explain is not None:
            self.patch(module, "explain", explaining(explain, self.mode))
