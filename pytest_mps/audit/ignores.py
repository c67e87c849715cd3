"""Silencing audit findings on purpose: the ``mps_audit_ignore`` marker and ini lines.

``@pytest.mark.mps_audit_ignore("float64", "aten::equal", reason="...")``
silences these findings in one test; the ini list ``mps_audit_ignore`` does it
for the code of a file or folder, one line each::

    mps_audit_ignore =
        mypkg/legacy.py: float64, host-sync  # old checkpoints are float64

A name is a finding's kind (``dtype``, ``host-sync``, ``mixed-devices``,
``op``, ``op-dtype``), a dtype (``float64``, ``torch.float64``) or an op
(``aten::index.Tensor``, ``aten::index``, ``index``: without an overload it
names every overload). A path is a suffix of the finding's file
(``mypkg/legacy.py``) or, ending in ``/``, a folder (``mypkg/legacy/``).
Every silence says why: the report shows the reason beside the finding, and
a silenced finding never fails ``--mps-audit=error``.
"""

from __future__ import annotations

import pytest

from pytest_mps import ownership

KINDS = ("op", "op-dtype", "dtype", "host-sync", "mixed-devices")


class Ignore:
    """Findings silenced, why, and where (None: in every file).

    A plain class: a NamedTuple costs 0.2-0.4 ms at every pytest start-up.
    """

    __slots__ = ("names", "path", "reason")

    def __init__(
        self, names: frozenset[str], reason: str, path: str | None = None
    ) -> None:
        self.names = names
        self.reason = reason
        self.path = path

    def covers(self, kind: str, name: str, filename: str) -> bool:
        """True when this silences a ``kind`` finding ``name`` made in ``filename``."""
        if self.path is not None and not _in_path(filename, self.path):
            return False
        return bool(self.names & _forms(kind, name))


ignore_key = pytest.StashKey["Ignore | None"]()


def _forms(kind: str, name: str) -> frozenset[str]:
    """The names a finding answers to: its kind, its name with and without prefixes."""
    bare = name.removeprefix("torch.").removeprefix("aten::")
    forms = {kind, name, bare, bare.partition(".")[0]}
    namespace, sep, op = name.rpartition("::")
    if sep:  # aten::add names aten::add.Tensor too
        forms.add(f"{namespace}::{op.partition('.')[0]}")
    return frozenset(forms)


def _in_path(filename: str, path: str) -> bool:
    file = "/" + filename.replace("\\", "/").lstrip("/")
    if path.endswith("/"):
        return ("/" + path.lstrip("/")) in file
    return file.endswith("/" + path.lstrip("/"))


def check_name(name: object) -> str | None:
    """Why ``name`` names no finding, or None when it does."""
    if not isinstance(name, str) or not name.strip():
        return f"{name!r} is not a name"
    text = name.strip()
    if text in KINDS:
        return None
    import torch

    bare = text.removeprefix("torch.")
    if isinstance(getattr(torch, bare, None), torch.dtype):
        return None
    namespace, sep, op = text.rpartition("::")
    packet = op.partition(".")[0]
    space = getattr(torch.ops, namespace if sep else "aten", None)
    if packet and space is not None and hasattr(space, packet):
        return None
    return (
        f"{name!r} is neither a kind ({', '.join(KINDS)}), a torch dtype "
        "(float64) nor an op (aten::equal)"
    )


def parse_marker(item: pytest.Item) -> Ignore | None:
    """The test's ``mps_audit_ignore`` marks as one, cached; ValueError if bad."""
    if ignore_key in item.stash:
        return item.stash[ignore_key]
    marks = ownership.iter_markers(item, "mps_audit_ignore")
    names: set[str] = set()
    reasons: list[str] = []
    for mark in marks:
        where = f"@pytest.mark.mps_audit_ignore on {item.nodeid}"
        extra = sorted(set(mark.kwargs) - {"reason"})
        if extra:
            raise ValueError(f"{where}: unknown argument {', '.join(extra)}")
        reason = mark.kwargs.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"{where}: give reason='why these findings are fine'")
        if not mark.args:
            raise ValueError(f"{where}: name what to ignore (float64, host-sync, ...)")
        for name in mark.args:
            problem = check_name(name)
            if problem is not None:
                raise ValueError(f"{where}: {problem}")
            names.add(name.strip())
        reasons.append(reason.strip())
    parsed = Ignore(frozenset(names), "; ".join(reasons)) if marks else None
    item.stash[ignore_key] = parsed
    return parsed


def parse_ini(config: pytest.Config) -> tuple[Ignore, ...]:
    """The ``mps_audit_ignore`` lines; UsageError naming the ini file if bad."""
    found = []
    for line in config.getini("mps_audit_ignore"):
        where = f"ini option mps_audit_ignore in {config.inipath}: {line!r}"
        body, hash_sign, reason = str(line).partition("#")
        path, colon, names = body.partition(":")
        if not colon or not path.strip() or not names.strip():
            raise pytest.UsageError(
                f"{where} is not 'path: name, name  # reason' "
                "(mypkg/legacy.py: float64  # old checkpoints)"
            )
        if not hash_sign or not reason.strip():
            raise pytest.UsageError(f"{where} has no reason: end it with '# why'")
        parsed = [n.strip() for n in names.split(",")]
        for name in parsed:
            problem = check_name(name)
            if problem is not None:
                raise pytest.UsageError(f"{where}: {problem}")
        source = config.inipath.name if config.inipath else "ini"
        found.append(
            Ignore(
                frozenset(parsed),
                f"{reason.strip()} ({source})",
                path.strip().replace("\\", "/"),
            )
        )
    return tuple(found)
