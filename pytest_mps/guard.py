"""A guest never takes a session down: a fault of pytest-mps's own, caught at its door.

pytest loads pytest-mps into every suite of the environment it is installed
in. Every hook :mod:`.startup` and :mod:`.plugin` give pytest runs its work
through a :class:`Door`; an unexpected exception there (a bug of ours, or a
torch or pytest that moved under us) is handled in one of two ways:

- **The run has not asked for pytest-mps** (no option or ini setting of
  ours, no ``--mps`` on the command line): one line on stderr, ``pytest-mps
  0.1.0: ValueError: ... (in pytest_configure); pytest-mps is off for this
  session``, and every hook of ours does nothing from then on, so the session
  runs as if pytest-mps were not installed.
- **The run asked for it**: a ``pytest.UsageError`` (a final class: it
  cannot be subclassed), so pytest prints it as one ``ERROR:`` line naming
  pytest-mps (exit 4) followed by our traceback, instead of a page of
  ``INTERNALERROR>``; inside a test's setup, that test's error, with the
  same line and traceback.

Not caught: ``pytest.UsageError`` (our deliberate messages for a bad value),
pytest's outcomes (skip, fail, exit: not ``Exception`` subclasses), a
collector's ``CollectError`` and ``KeyboardInterrupt``.
"""

from __future__ import annotations

import sys
import traceback
import weakref
from types import TracebackType
from typing import Any

import pytest

from pytest_mps import __version__, ownership

# The reason line of each session that turned pytest-mps off, by plugin
# manager (pytester runs several sessions in one process; the early hooks have
# no config yet).
_off: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

_NOT_OURS = (pytest.UsageError, pytest.Collector.CollectError)


def is_off(manager: Any) -> bool:
    """True once a fault has turned pytest-mps off for this session."""
    return manager in _off


def off_line(manager: Any) -> str | None:
    """The line that turned pytest-mps off for this session, or None."""
    return _off.get(manager)


def _asked(manager: Any, config: pytest.Config | None) -> bool:
    """Whether this run asked for pytest-mps, as far as it can be told now."""
    if config is not None:
        try:
            if ownership.opted_in(config):
                return True
        except Exception:
            pass  # the check itself failed: the command line below decides
        args = [str(arg) for arg in config.invocation_params.args]
    else:
        args = [str(arg) for arg in sys.argv[1:]]
    # --device alone may be the project's own flag (ownership.py)
    return any(arg.startswith("--mps") for arg in args)


def fault(
    manager: Any,
    hook: str,
    exc: BaseException,
    config: pytest.Config | None = None,
    in_test: bool = False,
) -> None:
    """Handle a fault of ours: turn pytest-mps off, or raise one usage error."""
    text = str(exc).strip().splitlines()
    line = f"pytest-mps {__version__}: {type(exc).__name__}"
    line += f": {text[0]}" if text else ""
    line += f" (in {hook})"
    if manager in _off:
        return  # reported already; a later hook of ours tripped over the first
    if not _asked(manager, config):
        _off[manager] = line
        _say(manager, f"{line}; pytest-mps is off for this session")
        return
    where = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = (
        f"{line}: a bug in pytest-mps, not in your suite (please report it with "
        f"this traceback)\n{where.rstrip()}"
    )
    if in_test:
        # the test's own report: our line and traceback, not guard.py's frames
        raise pytest.fail.Exception(message, pytrace=False) from None
    raise pytest.UsageError(message) from exc


# The line a session's fault left for the terminal summary, by plugin manager.
_pending: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _say(manager: Any, line: str) -> None:
    """One line where the user reads it, whatever pytest is capturing now.

    Before the terminal reporter exists (the first hooks) the line goes to
    stderr at once. After, pytest may be capturing (a collector, a test's
    setup: stderr and the reporter's own stdout then land in that report, shown
    only for a failure), so the line waits for :func:`say_pending`, called
    from the terminal summary and, where no summary came, at the session's end.
    """
    if manager.get_plugin("terminalreporter") is None:
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
    else:
        _pending[manager] = line


def say_pending(manager: Any, reporter: Any = None) -> None:
    """Write the line a fault left waiting, once: to ``reporter``, else stderr."""
    line = _pending.pop(manager, None)
    if line is None:
        return
    if reporter is not None:
        reporter.write_line(line)
        return
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


class Door:
    """``with Door(manager, hook, config):`` handles a fault of ours (:func:`fault`)."""

    __slots__ = ("config", "hook", "in_test", "manager")

    def __init__(
        self,
        manager: Any,
        hook: str,
        config: pytest.Config | None = None,
        in_test: bool = False,
    ) -> None:
        self.manager = manager
        self.hook = hook
        self.config = config
        self.in_test = in_test

    def __enter__(self) -> Door:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, _NOT_OURS):
            return False
        fault(self.manager, self.hook, exc, self.config, self.in_test)
        return True  # turned off: the session goes on without us


def door(config: pytest.Config, hook: str, in_test: bool = False) -> Door:
    """A :class:`Door` for a hook that has the session's config.

    ``in_test``: the hook runs inside a test's setup or call, where pytest
    reports an exception as that test's error (a ``pytest.fail`` then, whose
    report holds our line and traceback without the guard's frames).
    """
    return Door(config.pluginmanager, hook, config, in_test)
