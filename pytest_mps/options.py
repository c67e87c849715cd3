"""Validating option values: one parser per value, used for flags and ini twins.

A parser takes ``(value, where)`` and raises ValueError naming ``where`` (the
flag, or the ini file) when the value is bad. On the command line the error is
an argparse error, which already names the flag, so the prefix is not repeated.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def choice(choices: Sequence[str]) -> Callable[[str, str], str]:
    """A parser accepting one of ``choices``, case-insensitively."""

    def parse(value: str, where: str) -> str:
        text = value.strip().lower()
        if text not in choices:
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(choices)}")
        return text

    return parse


def _run(parse: Callable[[str, str], T], flag: str, value: str) -> T:
    try:
        return parse(value, flag)
    except ValueError as exc:
        message = str(exc).removeprefix(f"{flag}: ")
        raise argparse.ArgumentTypeError(message) from None


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
