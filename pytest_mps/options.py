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
