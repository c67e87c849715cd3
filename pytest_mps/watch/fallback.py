"""Fallback-leak detection: every op that left the GPU, per test.

With ``PYTORCH_ENABLE_MPS_FALLBACK=1`` an op without an MPS kernel runs on the
CPU and PyTorch warns (aten/src/ATen/mps/MPSFallback.mm, ``mps_fallback``)::

    The operator 'aten::nonzero' is not currently supported on the MPS backend
    and will fall back to run on the CPU. This may have performance implications.

followed by `` (Triggered internally at .../MPSFallback.mm:NN.)``. It is a
``TORCH_WARN_ONCE``: one static per C++ call site, so without
``torch.set_warn_always(True)`` only the first op that ever falls back in the
process is announced. The variable is read once, when torch loads; without it
the op raises ``NotImplementedError`` (``mps_error_fallback``, same file).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from pytest_mps import devices, ownership
from pytest_mps.watch import settings
from pytest_mps.watch.findings import TestFindings, describe, findings_for
from pytest_mps.watch.locations import user_location
from pytest_mps.watch.settings import VARIABLE

# MPSFallback.mm, mps_fallback(): TORCH_WARN_ONCE("The operator '", name, "' is
# not currently supported on the MPS backend and will fall back to run on the
# CPU. This may have performance implications."). Not anchored at the end:
# PyTorch appends " (Triggered internally at .../MPSFallback.mm:NN.)".
FALLBACK_RE = re.compile(
    r"The operator '(?P<op>[^']+)' is not currently supported on the MPS backend"
)
# Kernels that exist but hand the work to the CPU announce it themselves, e.g.
# Indexing.mm: "MPS: nonzero op is not supported for complex datatypes. Falling
# back on CPU. This may have performance implications."
MPS_FALLBACK_RE = re.compile(r"MPS: (?P<text>.*?Falling back on CPU)", re.DOTALL)
# ReduceOps.mm: "MPS: no support for int64 reduction ops, casting it to int32"
DOWNCAST_RE = re.compile(
    r"MPS: no support for int64 (?P<what>.+?), casting it to int32"
)
# MPSFallback.mm, mps_error_fallback(): TORCH_CHECK_NOT_IMPLEMENTED(false, "The
# operator '", name, "' is not currently implemented for the MPS device. ...")
NOT_IMPLEMENTED_RE = re.compile(
    r"The operator '(?P<op>[^']+)' is not currently implemented for the MPS device"
)
# One Python filter for all three kinds: warnings' `message` is matched at the start.
_FILTER = r"(The operator '[^']+' is not currently supported on the MPS backend|MPS: )"
_SUFFIX = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")


class FallbackState:
    """What the session changed, to say so in the header and undo it after."""

    def __init__(
        self,
        mode: str,
        variable_before: str | None,
        torch_was_imported: bool,
    ) -> None:
        self.mode = mode
        self.variable_before = variable_before
        self.torch_was_imported = torch_was_imported
        self.warn_always_before: bool | None = None
        self.seen_other: set[tuple[type[Warning], str]] = set()


state_key = pytest.StashKey[FallbackState]()


def _set_variable(state: FallbackState) -> None:
    if state.mode != "off":
        os.environ[VARIABLE] = "1"
    elif state.variable_before is None:
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = state.variable_before


def set_up(config: pytest.Config, early: bool = False) -> FallbackState:
    """Decide the mode and set the variable; once per session (state in the stash)."""
    if state_key in config.stash:
        return config.stash[state_key]
    mode = settings.fallback_mode(config, early)
    before = os.environ.get(VARIABLE)
    state = FallbackState(
        mode=mode,
        variable_before=before,
        torch_was_imported="torch" in sys.modules,
    )
    _set_variable(state)
    config.stash[state_key] = state
    return state


def pytest_configure(config: pytest.Config) -> None:
    # Set up early (watch.plugin) or now, when the plugin is loaded late.
    state = set_up(config)
    # Read again now that the command line is parsed whole: a --mps or --device
    # read early may have been the project's own flag.
    mode = settings.fallback_mode(config)
    if mode != state.mode:
        state.mode = mode
        _set_variable(state)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(state_key, None)
    if state is None:
        return
    if state.variable_before is None:
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = state.variable_before
    if state.warn_always_before is not None and "torch" in sys.modules:
        import torch

        torch.set_warn_always(state.warn_always_before)
    del config.stash[state_key]


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(state_key, None)
    if state is None or state.mode == "off":
        return []
    line = f"pytest-mps fallback: {state.mode} ({VARIABLE}=1 set by pytest-mps)"
    # The emulated device reads the variable when it starts, after this.
    emulated = devices.emulated(config)
    if "mps" not in config.stash.get(devices.devices_key, []):
        # Only an MPS tensor falls back: a CPU or CUDA run lists nothing.
        line += "; no test runs on MPS, so nothing can fall back (--mps-emulate)"
    lines = [line]
    if state.torch_was_imported and state.variable_before != "1" and not emulated:
        lines.append(
            f"pytest-mps WARNING: torch was imported before pytest-mps could set "
            f"{VARIABLE}=1, and torch reads it only when it loads: on MPS the first "
            "op without a kernel raises NotImplementedError instead of falling back, "
            f"so a test stops there. Set {VARIABLE}=1 in the environment to collect "
            "every fallback op."
        )
    return lines


def _op_name(name: str) -> str:
    name = name.strip()
    return name if "::" in name else f"aten::{name}"


_allow_error_key = pytest.StashKey[str]()


def _parse_allowed(item: pytest.Item) -> frozenset[str] | None:
    allowed = {_op_name(o) for o in item.config.getini("mps_allow_fallback")}
    for mark in ownership.iter_markers(item, "mps_allow_fallback"):
        if not mark.args:
            return None
        for arg in mark.args:
            if not isinstance(arg, str):
                raise ValueError(
                    f"@pytest.mark.mps_allow_fallback on {item.nodeid}: "
                    f"{arg!r} is not an op name such as 'aten::_linalg_svd'"
                )
            allowed.add(_op_name(arg))
    return frozenset(allowed)


def allowed_ops_for(item: pytest.Item) -> frozenset[str] | None:
    """Ops allowed to fall back in ``item`` (marker and ini list); None: every op.

    A bad marker allows nothing here and fails the test at setup, naming the
    marker and the test, instead of stopping the session.
    """
    try:
        return _parse_allowed(item)
    except ValueError as exc:
        item.stash[_allow_error_key] = str(exc)
        return frozenset()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    error = item.stash.get(_allow_error_key, None)
    if error is not None:
        pytest.fail(error, pytrace=False)


def is_allowed(op: str, allowed: frozenset[str] | None) -> bool:
    """True when ``allowed`` lets ``op`` fall back; an op name covers its overloads."""
    # "aten::linalg_svd" also allows its overloads ("aten::linalg_svd.U")
    return allowed is None or op in allowed or op.split(".", 1)[0] in allowed


def classify(text: str) -> tuple[str, str, str] | None:
    """``(kind, op, detail)`` for one of PyTorch's MPS fallback messages."""
    match = FALLBACK_RE.search(text)
    if match:
        return "fallback", match.group("op"), ""
    match = DOWNCAST_RE.search(text)
    if match:
        return "int64-downcast", f"int64 {match.group('what')}", ""
    match = MPS_FALLBACK_RE.search(text)
    if match:
        detail = _SUFFIX.sub("", match.group("text"))
        op = re.match(r"(\w+) op\b", detail)
        return "mps-fallback", f"aten::{op.group(1)}" if op else detail, detail
    return None


def _enable_warn_always(state: FallbackState) -> None:
    if state.warn_always_before is not None or "torch" not in sys.modules:
        return
    import torch

    state.warn_always_before = bool(torch.is_warn_always_enabled())
    torch.set_warn_always(True)


@contextlib.contextmanager
def capture_fallbacks(
    found: TestFindings,
    allowed: frozenset[str] | None = frozenset(),
    seen_other: set[tuple[type[Warning], str]] | None = None,
) -> Iterator[None]:
    """Record PyTorch's MPS fallback warnings raised in the block into ``found``.

    Needs ``torch.set_warn_always(True)`` to see more than the first one.
    ``seen_other``: when given, torch's other C++ warnings are passed on once
    per text (warn-always would repeat them).
    """
    with warnings.catch_warnings():
        previous = warnings.showwarning

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            text = str(message)
            kind = classify(text)
            if kind is not None:
                where = user_location(sys._getframe(1))
                ok = is_allowed(kind[1], allowed)
                found.add(kind[0], kind[1], where, allowed=ok, detail=kind[2])
                return
            if seen_other is not None and "(Triggered internally at" in text:
                key = (category, text)
                if key in seen_other:
                    return
                seen_other.add(key)
            previous(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        warnings.filterwarnings("always", message=_FILTER)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    state = item.config.stash.get(state_key, None)
    if state is None or state.mode == "off":
        return (yield)
    _enable_warn_always(state)
    # warn-always (which we turned on) repeats torch's other warn-once
    # warnings: pass each on once per session, as torch would.
    dedupe = state.seen_other if state.warn_always_before is False else None
    with capture_fallbacks(findings_for(item), allowed_ops_for(item), dedupe):
        return (yield)


def _raising_frame(exc: BaseException) -> Any:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    state = item.config.stash.get(state_key, None)
    if state is None or state.mode == "off":
        return (yield)
    try:
        result = yield
    except NotImplementedError as exc:
        match = NOT_IMPLEMENTED_RE.search(str(exc))
        if match:
            where = user_location(_raising_frame(exc))
            findings_for(item).add("not-implemented", match.group("op"), where)
        raise
    finally:
        # torch may have been imported by this test: later tests get warn-always
        _enable_warn_always(state)
    if state.mode != "error":
        return result
    leaks = [
        f
        for f in findings_for(item).of_kind("fallback", "mps-fallback")
        if not f.allowed
    ]
    if leaks:
        pytest.fail(
            f"{len(leaks)} op(s) fell back from MPS to the CPU (--mps-fallback=error):"
            "\n  "
            + "\n  ".join(describe(leaks, item.config.rootpath))
            + "\nallow known ones with @pytest.mark.mps_allow_fallback('aten::...') "
            "or the mps_allow_fallback ini list",
            pytrace=False,
        )
    return result


#: PyTorch's MPS op tracker since 2.6 (its error text names it; #77764 before)
TRACKER = "https://github.com/pytorch/pytorch/issues/141287"


def not_implemented_note(text: str) -> str | None:
    """One line for PyTorch's "not currently implemented for the MPS device" error."""
    match = NOT_IMPLEMENTED_RE.search(text)
    if match is None:
        return None
    return (
        f"{match.group('op')} has no MPS kernel: run with --mps-fallback=warn, or "
        f"set {VARIABLE}=1, to run on and list every op that falls back to the "
        f"CPU\n(ask for the kernel on PyTorch's MPS op tracker, {TRACKER})"
    )
