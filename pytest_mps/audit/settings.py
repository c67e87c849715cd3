"""The audit's settings: its options' help, their parsers, and what a run chose.

Imported at start-up through :mod:`.plugin`: no torch, nothing heavy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_mps.options import choice, closest

AUDIT_HELP = (
    "predict what the suite would do on MPS from the ops each test runs here: "
    "ops that fall back to the CPU or raise, dtypes MPS cannot hold, host syncs "
    "and mixed devices, in the code under test (the tests' own asserts are "
    "listed apart). "
    "--mps-audit=off (default), --mps-audit=report (list findings), "
    "--mps-audit=error (also fail those tests). A bare --mps-audit means report."
)
AUDIT_CHECK_HELP = (
    "on a Mac (torch built with MPS): compare the audit's prediction for every "
    "op the suite ran with the MPS dispatcher's registrations; print differences."
)
MACOS_HELP = (
    "the macOS version the audit predicts for, like 14.4 (default: the newest): "
    "bfloat16 and complex need 14.0, some PyTorch expectations depend on it"
)
LEVELS = ("off", "report", "error")
#: Major macOS versions MPS runs on (12.3 is the first with MPS).
MACOS_MAJORS = (12, 13, 14, 15, 26)
NEWEST_MACOS = (99, 0)


class AuditSettings:
    """The session's audit level and whether to check against the dispatcher.

    A plain class: a NamedTuple costs 0.2-0.4 ms at every pytest start-up.
    """

    __slots__ = ("check", "level", "macos")

    def __init__(
        self, level: str, check: bool, macos: tuple[int, int] = NEWEST_MACOS
    ) -> None:
        self.level = level
        self.check = check
        self.macos = macos


parse_level = choice(LEVELS, "level")


def parse_macos(value: str, where: str) -> tuple[int, int]:
    """``"14.4"`` -> (14, 4); ``"newest"``/``""`` -> the newest; else ValueError."""
    text = value.strip().lower()
    if text in ("", "newest", "latest"):
        return NEWEST_MACOS
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{where}: {value!r} is not a macOS version (like 14.4 or 15)")
    major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    known = ", ".join(str(m) for m in MACOS_MAJORS)
    if major > max(MACOS_MAJORS):
        raise ValueError(
            f"{where}: {value!r} is newer than any macOS known here (known: "
            f"{known}); give 'newest' for the newest"
        )
    if major not in MACOS_MAJORS:
        raise ValueError(f"{where}: {value!r} is not a macOS version (known: {known})")
    if (major, minor) < (12, 3):
        raise ValueError(f"{where}: {value!r}: MPS needs macOS 12.3 or newer")
    return major, minor


def level_mistake(args: list[str], where: Path, source: str = "") -> str | None:
    """What is wrong with ``--mps-audit=eror`` or ``--mps-audit error``, or None.

    ``source`` names where ``args`` come from when not the command line.
    """
    values = f"{', '.join(LEVELS)}, given as --mps-audit=LEVEL"
    for index, arg in enumerate(args):
        if arg.startswith("--mps-audit="):
            word = arg.partition("=")[2]
            spaced = False
        elif arg == "--mps-audit" and index + 1 < len(args):
            word = args[index + 1]
            # a path after a bare --mps-audit is the usual case
            if (where / word).exists() or word.startswith("-"):
                continue
            spaced = True
        else:
            continue
        if word in LEVELS and not spaced:
            continue
        close = closest(word, LEVELS)
        if spaced and close is None:
            continue  # a path that does not exist: pytest says so
        meant = f"did you mean `--mps-audit={close}`? " if close else ""
        given = f"--mps-audit {word}" if spaced else arg
        if source:
            given += f" (in {source})"
        return f"{given}: {meant}the audit's levels are {values}"
    return None


def read_settings(config: pytest.Config) -> AuditSettings:
    """The level, check and macOS: command line > ini; UsageError when bad."""
    level = config.getoption("mps_audit")
    if level is None:
        where = f"ini option mps_audit in {config.inipath}"
        try:
            level = parse_level(str(config.getini("mps_audit")), where)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    check = config.getoption("mps_audit_check")
    if check is None:
        check = bool(config.getini("mps_audit_check"))
    if check and level == "off":
        level = "report"
    macos = config.getoption("mps_audit_macos")
    if macos is None:
        where = f"ini option mps_audit_macos in {config.inipath}"
        try:
            macos = parse_macos(str(config.getini("mps_audit_macos") or ""), where)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return AuditSettings(level, bool(check), macos)
