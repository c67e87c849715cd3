"""C++ extensions built against MPS or Metal: not emulated, said in one line.

An extension that includes PyTorch's MPS headers (``ATen/native/mps/...``)
or Metal, or compiles Objective-C++ (``.mm``) or Metal (``.metal``) sources,
runs only on a Mac: on Linux it fails to build, or to load with an undefined
symbol of the MPS backend, far from the cause. While the emulation is
installed, ``torch.utils.cpp_extension.load`` and ``load_inline`` given such
sources raise :class:`~.messages.NotEmulatedError` instead; every other
extension builds as it does without the emulation.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

from pytest_mps.emulate import messages, patching

MODULE = "torch.utils.cpp_extension"
#: Source text that needs a Mac: MPS's headers, Metal's, Objective-C.
MAC_ONLY = re.compile(
    r"#\s*(include|import)\s*[<\"](ATen/native/mps/|ATen/mps/|Metal/|"
    r"MetalPerformanceShaders|Foundation/)"
)
WHAT = "C++ extensions built against MPS or Metal (torch.utils.cpp_extension)"


def _texts(values: Any) -> Iterable[str]:
    if values is None:
        return ()
    if isinstance(values, str):
        return (values,)
    return (str(v) for v in values)


def mac_only_sources(sources: Iterable[str], files: Iterable[str] = ()) -> bool:
    """True when source texts or file names need a Mac to build."""
    for name in files:
        if name.endswith((".mm", ".metal")):
            return True
        try:
            with open(name, encoding="utf-8", errors="replace") as handle:
                if MAC_ONLY.search(handle.read()):
                    return True
        except OSError:
            continue
    return any(MAC_ONLY.search(text) for text in sources)


def _refusing_inline(load_inline: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load_inline)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        sources = [
            *_texts(args[1] if len(args) > 1 else kwargs.get("cpp_sources")),
            *_texts(args[2] if len(args) > 2 else kwargs.get("cuda_sources")),
        ]
        if mac_only_sources(sources):
            raise messages.not_emulated(WHAT)
        return load_inline(*args, **kwargs)

    return refusing


def _refusing_load(load: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        files = list(_texts(args[1] if len(args) > 1 else kwargs.get("sources")))
        if mac_only_sources((), (os.fspath(f) for f in files)):
            raise messages.not_emulated(WHAT)
        return load(*args, **kwargs)

    return refusing


class ExtensionCalls(patching.OnImport):
    """Replaces ``load`` and ``load_inline`` now, or when first imported."""

    def __init__(self) -> None:
        super().__init__(MODULE)

    def imported(self, module: Any) -> None:
        """Wrap ``load`` and ``load_inline`` to refuse Mac-only sources."""
        if hasattr(module, "load_inline"):
            self.patch(module, "load_inline", _refusing_inline(module.load_inline))
        if hasattr(module, "load"):
            self.patch(module, "load", _refusing_load(module.load))
