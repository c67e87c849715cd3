"""``assert_no_graph_breaks`` and ``assert_no_recompiles``: what Dynamo did, and why.

A graph break splits a compiled function into several graphs, each launched on
its own (on MPS, each a round of Metal kernel launches); a recompile traces
the function again because a guard failed (a new shape, a Python value that
changed). Both are silent: the function still returns the right numbers, only
slower. These assertions fail naming each break or recompile with Dynamo's
reason and the line of the user's code it happened at.

Both reset Dynamo's caches first (``torch._dynamo.reset()``), so an earlier
compilation of the same code in the session does not hide a recompile. They
trace outside pytest-mps's own torch modes (:func:`_outside_pytest_mps`):
under ``--mps-emulate``, where ``torch.compile`` runs eagerly, Dynamo sees the
user's code on the CPU tensors the emulated device holds; under the audit and
the guards it sees the user's code alone.
"""

from __future__ import annotations

import contextlib
import linecache
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["assert_no_graph_breaks", "assert_no_recompiles"]


def _name(fn: Any) -> str:
    import torch

    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", fn))


def _ours(mode: Any) -> bool:
    return type(mode).__module__.startswith("pytest_mps.")


@contextlib.contextmanager
def _outside_pytest_mps() -> Iterator[None]:
    """Take pytest-mps's own torch modes off the stacks while Dynamo traces.

    Dynamo traces a torch-function mode into its graphs and compiles nothing
    under a dispatch mode (``explain`` then counts 0 graphs): the emulation's,
    the audit's and the guards' modes would judge pytest-mps, not the user's
    code. The user's own function modes stay; the dispatch modes go while
    one of ours is among them.
    """
    import torch
    from torch.utils import _python_dispatch

    from pytest_mps.emulate.explain import accelerator_of_the_build, outside

    functions = torch.overrides._get_current_function_mode_stack()  # type: ignore[no-untyped-call]
    dispatch = _python_dispatch._get_current_dispatch_mode_stack()
    with contextlib.ExitStack() as stack:
        for mode in [m for m in functions if _ours(m)]:
            stack.enter_context(outside(mode))
        if any(_ours(m) for m in dispatch):
            stack.enter_context(_python_dispatch._disable_current_modes())
        # torch 2.15's Dynamo asks C++ for the accelerator's current stream
        stack.enter_context(accelerator_of_the_build())
        yield


def _where(user_stack: Any) -> str:
    """``file:line in function: source`` of the innermost user frame."""
    if not user_stack:
        return "no user frame"
    frame = user_stack[-1]
    line = linecache.getline(frame.filename, frame.lineno).strip()
    place = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return f"{place}: {line}" if line else place


def assert_no_graph_breaks(fn: Any, /, *args: Any, **kwargs: Any) -> None:
    """Fail if Dynamo splits ``fn(*args, **kwargs)`` into more than one graph.

    ``fn`` is a function or an ``nn.Module``; it is traced once with these
    inputs (``torch._dynamo.explain``). The message lists every break with
    Dynamo's reason and the user's line it happened at.
    """
    __tracebackhide__ = True
    import torch._dynamo

    with _outside_pytest_mps():
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(fn)(*args, **kwargs)
    if not explanation.graph_count:
        raise RuntimeError(
            f"{_name(fn)}: Dynamo compiled no graph (torch {torch.__version__}), so "
            "there is nothing to judge; seen with torch 2.6 under --mps-audit"
        )
    count = explanation.graph_break_count
    if not count:
        return
    lines = [
        f"  {i}. {reason.reason.strip().splitlines()[0]} at {_where(reason.user_stack)}"
        for i, reason in enumerate(explanation.break_reasons, 1)
    ]
    raise AssertionError(
        f"{_name(fn)}: {count} graph break(s), {explanation.graph_count} graphs "
        f"where one was expected:\n" + "\n".join(lines)
    )


def _call_args(call: Any) -> tuple[Any, ...]:
    return call if isinstance(call, tuple) else (call,)


def assert_no_recompiles(fn: Any, calls: Iterable[Any]) -> None:
    """Fail if ``fn`` is compiled again for any of ``calls`` after the first.

    Each item of ``calls`` is one call's positional arguments: a tuple, or a
    single argument. ``fn`` is compiled once (Dynamo with the ``eager``
    backend: what is checked is tracing, not code generation) and called with
    each in turn; the first recompile fails the assertion with the call that
    caused it and the guard that failed, as Dynamo words it.
    """
    __tracebackhide__ = True
    import torch._dynamo
    from torch._dynamo.exc import RecompileError

    items = list(calls)
    if len(items) < 2:
        raise ValueError(
            f"assert_no_recompiles needs at least 2 calls to compare, got {len(items)}"
        )
    with _outside_pytest_mps():
        torch._dynamo.reset()
        compiled = torch._dynamo.optimize("eager")(fn)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for index, call in enumerate(items):
                try:
                    compiled(*_call_args(call))
                except RecompileError as error:
                    detail = str(error).strip()
                    raise AssertionError(
                        f"{_name(fn)}: call {index} of {len(items)} recompiled it "
                        f"(calls are counted from 0):\n{detail}"
                    ) from None
