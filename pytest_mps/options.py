"""Validating option values: one parser per value, used for flags and ini twins.

A parser takes ``(value, where)`` and raises ValueError naming ``where`` (the
flag, or the ini file) when the value is bad. Every option that takes one of a
fixed set of values is parsed by :func:`choice` or :func:`choices`, which name
the closest valid value and list them all.

On the command line the parser runs as argparse's ``type=``; a bad value is a
``pytest.UsageError`` raised from there, which pytest prints as one line,
rather than an argparse error, which pytest prints with four lines of usage.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

T = TypeVar("T")


def closest(word: str, valid: Sequence[str]) -> str | None:
    """The valid value ``word`` was most likely meant to be, or None."""
    import difflib  # only for a bad value: 0.6 ms at every start-up otherwise

    found = difflib.get_close_matches(word.strip().lower(), list(valid), 1, 0.6)
    return found[0] if found else None


def did_you_mean(word: str, valid: Sequence[str], where: str) -> str:
    """``"did you mean --flag=value? "`` (or ``'value'`` for an ini), or ``""``."""
    meant = closest(word, valid)
    if meant is None:
        return ""
    return (
        f"did you mean {where}={meant}? "
        if where.startswith("--")
        else (f"did you mean {meant!r}? ")
    )


def choice(valid: Sequence[str], what: str = "") -> Callable[[str, str], str]:
    """A parser accepting one of ``valid``, case-insensitively.

    ``what`` names the kind of value (``"time unit"``) in the message.
    """

    def parse(value: str, where: str) -> str:
        text = value.strip().lower()
        if text not in valid:
            kind = f"a {what}" if what else "valid"
            raise ValueError(
                f"{where}: {value!r} is not {kind}; {did_you_mean(text, valid, where)}"
                f"choose from {', '.join(valid)}"
            )
        return text

    return parse


def choices(
    valid: Sequence[str], what: str, extra: Callable[[str], bool] = lambda _: False
) -> Callable[[str, str], tuple[str, ...]]:
    """A parser of a comma list, each name one of ``valid`` or ``extra(name)``."""

    def parse(value: str, where: str) -> tuple[str, ...]:
        names = [v.strip().lower() for v in value.replace(" ", ",").split(",")]
        names = [n for n in names if n]
        bad = [n for n in names if n not in valid and not extra(n)]
        if bad or not names:
            meant = closest(bad[0], valid) if bad else None
            hint = f"did you mean {meant!r}? " if meant else ""
            raise ValueError(
                f"{where}: {', '.join(bad) or repr(value)} is not a {what}; "
                f"{hint}choose from {', '.join(valid)}"
            )
        return tuple(dict.fromkeys(names))

    return parse


def _run(parse: Callable[[str, str], T], flag: str, value: str) -> T:
    try:
        return parse(value, flag)
    except ValueError as exc:
        # argparse catches ValueError and ArgumentTypeError only: a UsageError
        # leaves parsing at once and pytest prints it as "ERROR: <message>"
        raise pytest.UsageError(str(exc)) from None


def argparse_type(parse: Callable[[str, str], T], flag: str) -> Callable[[str], T]:
    """An argparse ``type=`` that stores what ``parse`` returns."""

    def convert(value: str) -> T:
        return _run(parse, flag, value)

    return convert


def argparse_check(
    parse: Callable[[str, str], object], flag: str
) -> Callable[[str], str]:
    """An argparse ``type=`` that validates with ``parse`` and stores the text."""

    def check(value: str) -> str:
        _run(parse, flag, value)
        return value

    return check


def read_setting(
    config: pytest.Config,
    name: str,
    parse: Callable[[str, str], T],
    default: T | None = None,
) -> T | None:
    """An option stored as text (``argparse_check``), else its ini twin, parsed.

    The command line wins, read in the early config too; an ini key of a
    blocked family reads ``default``. A bad value is one usage line naming the
    flag, or the ini key and its file.
    """
    value = config.getoption(name, None)
    if value is None:
        value = getattr(config.known_args_namespace, name, None)
    where = "--" + name.replace("_", "-")
    if value is None:
        try:
            value = config.getini(name)
        except ValueError:  # not registered: the family is blocked
            return default
        where = f"ini option {name} in {config.inipath}"
    if value is None or value == "":
        return default
    try:
        return parse(str(value), where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


#: The ini names pytest-mps registered (filled by :func:`recording_ini_names`).
INI_NAMES: list[str] = []


class recording_ini_names:  # noqa: N801 - used as a context manager, read as one
    """``with recording_ini_names(parser):`` keeps every ini name added inside."""

    def __init__(self, parser: pytest.Parser) -> None:
        self.parser = parser
        self.real = parser.addini

    def __enter__(self) -> None:
        def addini(name: str, *args: object, **kwargs: object) -> None:
            if name not in INI_NAMES:
                INI_NAMES.append(name)
            self.real(name, *args, **kwargs)  # type: ignore[arg-type]

        self.parser.addini = addini  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        del self.parser.addini  # the class's method again


def unknown_ini_keys(config: pytest.Config) -> list[str]:
    """One line per ``mps_*`` key of the ini file that pytest-mps does not know.

    pytest's own warning ("Unknown config option") names the key only, and the
    suite then runs as if it were not set (``mps_emualte = true`` runs on the
    CPU): this names the file and the key meant.
    """
    path = config.inipath
    if path is None or not INI_NAMES:
        return []
    keys = [k for k in _ini_keys(str(path)) if k.startswith("mps_")]
    lines = []
    for key in keys:
        if key in INI_NAMES or _registered(config, key):
            continue  # ours, or another plugin's (a project's own name wins)
        meant = closest(key, INI_NAMES)
        hint = f"; did you mean {meant}?" if meant else ""
        lines.append(
            f"ini option {key} in {path} is not one of pytest-mps's, so it does "
            f"nothing{hint}"
        )
    return lines


def _registered(config: pytest.Config, key: str) -> bool:
    try:
        config.getini(key)
    except ValueError:  # "unknown configuration value"
        return False
    return True


def _ini_keys(path: str) -> list[str]:
    """The keys of pytest's section in the ini file at ``path``."""
    if path.endswith(".toml"):
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pytest requires tomli before 3.11
            import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]

        try:
            with open(path, "rb") as file:
                data = tomllib.load(file)
        except (OSError, ValueError):
            return []
        tool = data.get("tool", {}).get("pytest", {})
        section = tool.get("ini_options", tool)
        return [k for k in section if isinstance(k, str)]
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return []
    for name in ("pytest", "tool:pytest"):
        if parser.has_section(name):
            return list(parser.options(name))
    return []
