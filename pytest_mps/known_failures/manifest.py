"""The known-failure manifest: a text file of tests that fail, and how they fail.

One test per line, fields separated by ``" | "``::

    # node id | exception type | device | message substring (optional)
    tests/test_ops.py::test_svd[mps] | NotImplementedError | mps | aten::_linalg_svd
    tests/test_ops.py::test_linear[mps] | crash:SIGABRT | mps

The exception type is a builtin's name (``RuntimeError``), a dotted name
(``torch.OutOfMemoryError``), ``Failed`` (``pytest.fail``), ``crash:SIGABRT``
(an isolated test's child died on that signal) or ``timeout`` (it ran past its
limit). The device is ``mps``, ``cuda``, ``cpu`` or ``*``. Lines are sorted by
node id and device, so a refreshed file's diff shows only what changed.

kornia's format is read too (its ``testing/known_failure_xfails/*.txt``, the
best-known hand-made Mac CI's): ``<exception type><TAB><node id>``, one device
per file, named by the file's name (``mps_float32.txt`` is mps; a name that
names no device lists for every device). A file is in one format or the other;
a refreshed file keeps its format and its opening comments.
"""

from __future__ import annotations

import builtins
import difflib
import importlib
import os
import signal
import tempfile
from dataclasses import dataclass

import pytest

HEADER = (
    "# pytest-mps known failures (--mps-known-failures): a listed test that fails\n"
    "# this way is an xfail; one that passes, is skipped, or fails another way\n"
    "# fails the run. Refresh with --mps-known-failures-write.\n"
    "# node id | exception type | device | message substring (optional)\n"
)
DEVICES = ("mps", "cuda", "cpu", "xpu", "*")
#: The two formats, as the messages name them.
PIPES = "node id | exception type | device"
TABS = "kornia's <exception type><TAB><node id>"


class ManifestError(ValueError):
    """A line that does not parse; the message names the file and line."""


@dataclass(frozen=True)
class Entry:
    """One listed test: how it is known to fail, and where it is listed."""

    nodeid: str
    exception: str
    device: str
    message: str = ""
    line: int = 0

    def applies_to(self, device: str) -> bool:
        """True when the entry is for ``device`` (``mps``, ``cuda:0``, ...)."""
        return self.device == "*" or self.device == device.split(":")[0]

    def matches(self, exception: str, text: str) -> bool:
        """True when a failure of this type and message is the known one."""
        return exception == self.exception and self.message in text

    def describe(self) -> str:
        """``RuntimeError`` or ``RuntimeError with 'MPS does not support'``."""
        if self.message:
            return f"{self.exception} with {self.message!r}"
        return self.exception

    def format(self) -> str:
        """The entry as a line of the file."""
        fields = [self.nodeid, self.exception, self.device]
        if self.message:
            fields.append(self.message)
        return " | ".join(fields)


def _builtin_exceptions() -> list[str]:
    return [
        name
        for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    ]


def check_exception(name: str) -> str | None:
    """Why ``name`` is not an exception type this manifest knows, or None."""
    if name == "timeout" or name == "Failed":
        return None
    if name.startswith("crash:"):
        signame = name[len("crash:") :]
        if signame in signal.Signals.__members__ or signame == "server":
            return None
        if signame.startswith(("exit-", "signal-")):
            return None
        return f"unknown signal {signame!r} (crash:SIGABRT, crash:SIGSEGV, ...)"
    if "." not in name:
        if name in _builtin_exceptions():
            return None
        meant = difflib.get_close_matches(name, _builtin_exceptions(), 1)
        hint = f"did you mean {meant[0]}? " if meant else ""
        return (
            f"unknown exception type {name!r}; {hint}give a builtin's name, a "
            "dotted name (torch.OutOfMemoryError), Failed, crash:SIGNAL or timeout"
        )
    module_name, _, attribute = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return f"unknown exception type {name!r}: module {module_name!r} not found"
    value = getattr(module, attribute, None)
    if not (isinstance(value, type) and issubclass(value, BaseException)):
        return f"unknown exception type {name!r}: {module_name} has no such exception"
    return None


def exception_name(exc: BaseException) -> str:
    """The name a manifest gives ``exc``'s type (see the module docstring)."""
    kind = getattr(exc, "mps_failure_type", None)
    if isinstance(kind, str):
        return kind  # an isolated test's crash or timeout
    cls = type(exc)
    if cls is pytest.fail.Exception:
        return "Failed"  # pytest.fail's exception, by its public name
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Manifest:
    """A file's entries, the format it is in and, for kornia's, its device."""

    entries: list[Entry]
    style: str = PIPES
    #: where a tab-format file's device came from (its name), or ""
    device_from: str = ""

    def describe(self) -> str:
        """The format, as the report header says it."""
        if self.style == PIPES:
            return f"format: {PIPES}"
        return f"format: {TABS}, {self.device_from}"


def _style(lines: list[str]) -> str:
    for raw in lines:
        line = raw.strip()
        if line and not line.startswith("#"):
            return TABS if "\t" in line and " | " not in line else PIPES
    return PIPES


def file_device(path: str) -> tuple[str, str]:
    """The device a tab-format file lists for, and how its name says so."""
    name = os.path.basename(path)
    first = name.split(".")[0].split("_")[0].split("-")[0].lower()
    if first in DEVICES and first != "*":
        return first, f"device {first} from the file's name ({name})"
    return "*", f"every device (its name, {name}, names none)"


def parse(text: str, where: str, path: str = "") -> Manifest:
    """A manifest's text read; ManifestError names ``where`` and the line."""
    lines = text.splitlines()
    style = _style(lines)
    device, device_from = file_device(path or where) if style == TABS else ("", "")
    entries: list[Entry] = []
    seen: dict[tuple[str, str], int] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if style == TABS:
            fields = [field.strip() for field in line.split("\t")]
            if len(fields) != 2 or not all(fields):
                raise ManifestError(
                    f"{where}, line {number}: {raw!r} is not '<exception type>"
                    "<TAB><node id>', the format of the file's first entry"
                )
            fields = [fields[1], fields[0], device]
        else:
            fields = [field.strip() for field in line.split(" | ")]
        if len(fields) not in (3, 4) or not all(fields[:3]):
            raise ManifestError(
                f"{where}, line {number}: {raw!r} is not 'node id | exception type "
                "| device' with an optional '| message substring' (or kornia's "
                "'<exception type><TAB><node id>')"
            )
        nodeid, exception, device_field = fields[:3]
        why = check_exception(exception)
        if why is not None:
            raise ManifestError(f"{where}, line {number}: {why}")
        if device_field not in DEVICES:
            raise ManifestError(
                f"{where}, line {number}: device {device_field!r} is not one of "
                f"{', '.join(DEVICES)}"
            )
        key = (nodeid, device_field)
        if key in seen:
            raise ManifestError(
                f"{where}, line {number}: {nodeid} on {device_field} is listed "
                f"already, on line {seen[key]}"
            )
        seen[key] = number
        message = fields[3] if len(fields) == 4 else ""
        entries.append(Entry(nodeid, exception, device_field, message, number))
    return Manifest(entries, style, device_from)


def read(path: str) -> Manifest:
    """The manifest at ``path``."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); a manifest "
            "is a text file written by --mps-known-failures-write"
        ) from None
    return parse(text, path, path)


def _opening(path: str) -> str:
    """The comment lines a file opens with (kept when it is rewritten)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    kept = []
    for line in lines:
        if not line.startswith("#"):
            break
        kept.append(line + "\n")
    return "".join(kept)


def write(path: str, entries: list[Entry], style: str = PIPES) -> None:
    """Write ``entries`` sorted, atomically (a crash leaves the old file whole).

    In kornia's format (``style`` TABS) the file keeps its opening comments.
    """
    if style == TABS:
        ordered = sorted({e.nodeid: e for e in entries}.values(), key=_by_node)
        body = "".join(f"{e.exception}\t{e.nodeid}\n" for e in ordered)
        text = (_opening(path) or "# Format: <exception type>\\t<node id>\n") + body
    else:
        lines = sorted(
            {(e.nodeid, e.device): e.format() for e in entries}.items(),
            key=lambda pair: pair[0],
        )
        text = HEADER + "".join(line + "\n" for _, line in lines)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".known-failures-", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _by_node(entry: Entry) -> str:
    return entry.nodeid
