"""Our unprefixed flags (``--device``, ``--mps``), yielded to a project with its own.

Where a project (its conftest.py, or another plugin) defines one of them, its
option wins and ours stays reachable as ``--mps-device`` (``--mps-device=mps``
for ``--mps``). :mod:`.startup` calls :func:`before_conftests` and
:func:`after_conftests` round pytest's own ``pytest_load_initial_conftests``.

This reads pytest's private parser API, and only behind :func:`parser_kind`,
which knows the layouts of pytest 8, 9.0 and 9.1+; on any other, our
unprefixed flags are not added at all (:func:`short_flags_allowed`), so no
project option can collide with them. ``tests/test_ownership.py`` fails
loudly if pytest moves what is read here.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest

#: Our flags that lack the ``--mps-`` prefix, with the spelling that stays ours.
SHORT_FLAGS = {"--device": "--mps-device", "--mps": "--mps-device=mps"}

#: The option group of pytest-mps's flags.
GROUP = "mps"

# The parser of each session, by plugin manager (pytester runs several sessions
# in one process); filled in pytest_addoption.
_parsers: weakref.WeakKeyDictionary[Any, pytest.Parser] = weakref.WeakKeyDictionary()
_flags_yielded: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def pytest_addoption(parser: pytest.Parser, pluginmanager: Any) -> None:
    _parsers[pluginmanager] = parser


def parser_of(config: pytest.Config) -> pytest.Parser | None:
    """The session's parser, as pytest gave it to ``pytest_addoption``."""
    return _parsers.get(config.pluginmanager)


def yielded(config: pytest.Config) -> list[str]:
    """Our flags that the project's own options took in this session."""
    return list(_flags_yielded.get(config.pluginmanager, ()))


def flag_yielded(config: pytest.Config, flag: str) -> bool:
    """True when the project's own option took ``flag`` (``--device``, ``--mps``)."""
    return flag in _flags_yielded.get(config.pluginmanager, ())


def parser_kind(parser: pytest.Parser) -> str | None:
    """Which of pytest's parser layouts this is, or None for one we do not know.

    Private pytest API, read only here and only behind this check:

    - ``"built-at-parse"`` (pytest 8): argparse is built from the groups' own
      ``Argument`` objects (``_long_opts``) at each parse;
    - ``"argparse-early"`` (pytest 9.0): argparse is built as options are added,
      and ``Argument`` still holds its own ``_long_opts``;
    - ``"argparse-actions"`` (pytest 9.1 and newer): ``Argument`` wraps the
      argparse action (``_action``).

    For a layout we do not know, :func:`short_flags_allowed` is False: our
    flags are then added under their ``--mps-`` spellings only, through the
    public ``addoption``, so no project option can collide with them.
    """
    try:
        groups: list[Any] = [parser._anonymous, *parser._groups]
        if not all(isinstance(group.options, list) for group in groups):
            return None
        if not hasattr(groups[0], "_arggroup"):
            # pytest 8 (whose parse() leaves an optparser behind: not this one)
            return "built-at-parse" if hasattr(groups[0], "_addoption") else None
        if not isinstance(parser.optparser._option_string_actions, dict):
            return None
        if hasattr(groups[0], "_addoption_inner"):
            return "argparse-actions"
        if hasattr(groups[0], "_addoption_instance"):
            return "argparse-early"
    except AttributeError:
        return None
    return None


def short_flags_allowed(parser: pytest.Parser) -> bool:
    """True when our unprefixed flags can be yielded to a project that has them."""
    return parser_kind(parser) is not None


def _long_opts(argument: Any) -> list[str] | None:
    """An ``Argument``'s own name list (pytest 8 and 9.0), else None (9.1)."""
    found = getattr(argument, "_long_opts", None)
    return found if isinstance(found, list) else None


def _detach_short_flags(parser: pytest.Parser) -> list[tuple[Any, Any, str]]:
    """Take our short flags out of the argparse parser; return what to put back.

    pytest 9 builds argparse as options are added, so a conftest adding
    ``--device`` after us would raise "conflicting option string" at once. On
    pytest 8 (argparse built at parse time) nothing is detached;
    :func:`_yield_pytest8` does the job after the conftests load.
    """
    kind = parser_kind(parser)
    if kind not in ("argparse-early", "argparse-actions"):
        return []
    optparser: Any = parser.optparser
    taken_out = []
    for argument in parser.getgroup(GROUP).options:
        for flag in [name for name in argument.names() if name in SHORT_FLAGS]:
            # 9.1 holds the action; 9.0 only argparse's index of it
            action: Any = getattr(argument, "_action", None)
            if action is None:
                action = optparser._option_string_actions.get(flag)
            if action is None or flag not in action.option_strings:
                continue
            action.option_strings.remove(flag)
            optparser._option_string_actions.pop(flag, None)
            if not action.option_strings:
                action.container._remove_action(action)
            taken_out.append((argument, action, flag))
    return taken_out


def _reattach_short_flags(
    parser: pytest.Parser, taken_out: list[tuple[Any, Any, str]]
) -> list[str]:
    """Put back the flags nobody else defined meanwhile; return the ones yielded."""
    optparser: Any = parser.optparser
    yielded = []
    for argument, action, flag in taken_out:
        if flag in optparser._option_string_actions:
            yielded.append(flag)
            names = _long_opts(argument)  # pytest 9.0: names() reads its own list
            if names is not None and flag in names:
                names.remove(flag)
            continue
        removed = not action.option_strings
        action.option_strings.insert(0, flag)
        if removed:
            action.container._add_action(action)  # indexes its option strings
        else:
            optparser._option_string_actions[flag] = action
    return yielded


def _yield_pytest8(parser: pytest.Parser) -> list[str]:
    """Pytest 8: drop our short flags that another option also names."""
    groups: list[Any] = [parser._anonymous, *parser._groups]
    ours = parser.getgroup(GROUP).options
    taken = {
        name
        for group in groups
        for argument in group.options
        if argument not in ours
        for name in argument.names()
    }
    yielded = []
    for argument in list(ours):
        names = _long_opts(argument)
        for flag in SHORT_FLAGS:
            if names is not None and flag in taken and flag in names:
                names.remove(flag)
                yielded.append(flag)
        if not argument.names():
            # argparse, built from these at each parse, would read an option
            # with no names as a positional argument
            ours.remove(argument)
    return yielded


class BeforeConftests:
    """What :func:`before_conftests` took out, for :func:`after_conftests`."""

    def __init__(self, parser: pytest.Parser) -> None:
        self.parser = parser
        self.kind = parser_kind(parser)
        self.taken_out = _detach_short_flags(parser)


def before_conftests(early_config: pytest.Config) -> BeforeConftests | None:
    """Before the conftest.py files load: take our short flags out of argparse.

    The command line was read once already (known args, with our flags in
    place); conftest.py files now add their options, and theirs must win.
    :mod:`.startup` calls this and :func:`after_conftests` round pytest's own
    ``pytest_load_initial_conftests``.
    """
    parser = _parsers.get(early_config.pluginmanager)
    return None if parser is None else BeforeConftests(parser)


def after_conftests(early_config: pytest.Config, before: BeforeConftests) -> None:
    """After the conftest.py files loaded: keep the flags nobody else took."""
    if before.taken_out:
        yielded = _reattach_short_flags(before.parser, before.taken_out)
    elif before.kind == "built-at-parse":
        yielded = _yield_pytest8(before.parser)
    else:
        yielded = []
    _flags_yielded[early_config.pluginmanager] = yielded
