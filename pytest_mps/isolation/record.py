r"""The last device op a process started, kept where its parent can read it.

A child that dies on SIGABRT or is killed past its time limit cannot say what it
was doing; a small shared file can. Each torch call the test makes overwrites
it with ``"torch.mm\tpath:line"`` (the call and the user's line that made it),
so after the child is gone the parent reads the op in flight, or the last one
the test started. In the main process the same record lives in memory, for the
watchdog thread.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mmap

SIZE = 4096
_HEADER = struct.Struct("<I")


class OpRecord:
    """The last op started, in a shared file (``path``) or in memory."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._text = ""
        self._map: mmap.mmap | None = None
        if path is not None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                import mmap  # only for an isolated test's record

                os.ftruncate(fd, SIZE)
                self._map = mmap.mmap(fd, SIZE)
            finally:
                os.close(fd)

    def note(self, func: Any) -> None:
        """Note the torch call ``func`` and the user's line, as the call starts."""
        from torch.overrides import resolve_name

        from pytest_mps.watch.locations import user_location

        name = resolve_name(func) or getattr(func, "__name__", repr(func))
        self.write(f"{name}\t{user_location()}")

    def write(self, text: str) -> None:
        """Keep ``text`` as the last op started."""
        if self._map is None:
            self._text = text
            return
        data = text.encode("utf-8", "replace")[: SIZE - _HEADER.size]
        self._map[_HEADER.size : _HEADER.size + len(data)] = data
        self._map[: _HEADER.size] = _HEADER.pack(len(data))

    def read(self) -> tuple[str, str] | None:
        """``(op, "path:line")`` of the last op started, or None."""
        return parse(self._text if self._map is None else _read_map(self._map))

    def close(self) -> None:
        """Unmap the file (it stays on disk for the parent)."""
        if self._map is not None:
            self._map.close()
            self._map = None


def _read_map(mapped: mmap.mmap) -> str:
    (length,) = _HEADER.unpack(mapped[: _HEADER.size])
    length = min(length, SIZE - _HEADER.size)
    return mapped[_HEADER.size : _HEADER.size + length].decode("utf-8", "replace")


def read_file(path: str) -> tuple[str, str] | None:
    """The record a (dead) child left in ``path``, or None."""
    try:
        with open(path, "rb") as file:
            data = file.read(SIZE)
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(data[: _HEADER.size])
    return parse(data[_HEADER.size : _HEADER.size + length].decode("utf-8", "replace"))


def parse(text: str) -> tuple[str, str] | None:
    if not text:
        return None
    op, _, where = text.partition("\t")
    return op, where


#: The record of the running test, when one is kept (a child, or the watchdog).
current: list[OpRecord | None] = [None]


def recording(into: OpRecord) -> Any:
    """A ``TorchFunctionMode`` noting each torch call the test makes in ``into``.

    At the torch-function level, not the dispatcher's: the test's own calls
    (``torch.Tensor.add``, ``torch.nn.functional.linear``) with its lines, at a
    few microseconds each, and nothing inside TorchScript, whose interpreter a
    Python dispatch mode disturbed under ``--mps-emulate`` (kornia's
    ``test_jit`` tests failed with an empty RuntimeError).
    """
    from torch.overrides import TorchFunctionMode

    class Recording(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            into.note(func)
            return func(*args, **(kwargs or {}))

    return Recording()
