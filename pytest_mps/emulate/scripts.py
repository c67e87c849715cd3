"""TorchScript's outputs on the device of its inputs (the tags design).

TorchScript runs in C++, below every torch-function mode: :class:`.tagged.TagMode`
never sees a scripted or traced function's calls, and what it makes is untagged.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pytest_mps.emulate import patching, tags

Tensor = torch.Tensor


class ScriptCalls(patching.Patches):
    """TorchScript's outputs on the device of its inputs (tags design).

    A scripted or traced function runs in C++, below every torch-function
    mode: the mode never sees its calls, and what it makes is untagged (its
    ``x.device`` is the C++ device, the CPU). On a Mac those tensors are on
    mps. While installed, ``torch.jit.script`` and ``torch.jit.trace`` hand
    back a function whose outputs are tagged when one of its inputs is, and
    every ``ScriptModule`` call does the same. Inside the script nothing is
    judged (the emulation cannot see it).
    """

    def __init__(self) -> None:
        import torch.jit

        super().__init__()
        for name in ("script", "trace"):
            self.patch(torch.jit, name, _tagging_factory(getattr(torch.jit, name)))
        call = torch.jit.ScriptModule.__call__
        self.patch(torch.jit.ScriptModule, "__call__", _tagging_call(call))


def _any_tagged(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and tags.tagged(value):
            return True
        if type(value) is list or type(value) is tuple:
            if any(isinstance(v, Tensor) and tags.tagged(v) for v in value):
                return True
    return False


def _tagging_call(call: Callable[..., Any]) -> Callable[..., Any]:
    def tagging(*args: Any, **kwargs: Any) -> Any:
        out = call(*args, **kwargs)
        if _any_tagged(args, kwargs):
            tags.tag_outputs(out, (), frozenset())
        return out

    return tagging


class _ScriptFunction:
    """A scripted function whose outputs follow its inputs onto the device."""

    def __init__(self, function: Any) -> None:
        self.__dict__["_function"] = function
        self.__dict__["_call"] = _tagging_call(function)
        self.__dict__["__wrapped__"] = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def __repr__(self) -> str:
        return repr(self._function)


def _tagging_factory(factory: Callable[..., Any]) -> Callable[..., Any]:
    frames = "_frames_up" in inspect.signature(factory).parameters

    def make(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == "torch" or caller.startswith("torch."):
            # TorchScript compiling what a script calls: it wants its own
            return factory(*args, **kwargs)
        if frames:
            # script resolves the names in annotations from its caller's
            # frame: this one is one frame further down
            kwargs["_frames_up"] = kwargs.get("_frames_up", 0) + 1
        made = factory(*args, **kwargs)
        if isinstance(made, torch.jit.ScriptFunction):
            return _ScriptFunction(made)
        return made

    make.__wrapped__ = factory  # type: ignore[attr-defined]
    make.__doc__ = factory.__doc__
    return make
