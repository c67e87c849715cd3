"""Isolation and watchdog settings: options, markers, and each test's choice.

Light on purpose: pytest imports it at start-up (through :mod:`.plugin`).
"""

from __future__ import annotations

import math

import pytest

from pytest_mps import ownership
from pytest_mps.options import choice

ISOLATE_HELP = (
    "run every test in a child process: a test that dies (SIGABRT from Metal, "
    "SIGSEGV, SIGBUS, any exit) fails naming the signal and the last device op "
    "it started, and the session goes on. @pytest.mark.mps_isolate isolates one "
    "test without it"
)
START_HELP = (
    "how an isolated test's child starts: 'forkserver' (default) forks it from a "
    "server process that collected the suite before any device was touched (safe "
    "with Metal and CUDA; the test's module is imported once, by the server), "
    "'fork' forks the pytest process itself (cheapest, but a child forked after "
    "Metal or CUDA started in the parent can crash or refuse the device), "
    "'spawn' starts a new pytest process per test, which runs it without forking "
    "(nothing inherited; seconds per test)"
)
TIMEOUT_HELP = (
    "per-test time limit in seconds (a positive number): past it the test fails "
    "naming the device op in flight or the last one it started, the line that "
    "called it, and the limit. An isolated test's child is killed and the "
    "session goes on; a test in the main process ends the session there, with "
    "its reports and junit file written. @pytest.mark.mps_timeout(seconds) sets "
    "one test's limit"
)
STARTS = ("forkserver", "fork", "spawn")

MARKERS = (
    "mps_isolate: run this test in a child process, so a crash (SIGABRT, "
    "SIGSEGV, ...) fails it alone, naming the signal and its last device op.",
    "mps_timeout(seconds): fail this test past `seconds`, naming the device op "
    "in flight; overrides --mps-timeout.",
)

parse_start = choice(STARTS, "start method")


def parse_timeout(value: object, where: str) -> float:
    """A positive number of seconds, or ValueError naming ``where``."""
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(
            f"{where}: {value!r} is not a time limit; give a positive number of "
            "seconds (2.5)"
        )
    return seconds


class Limit:
    """A test's time limit and where it was set (``--mps-timeout``, a marker).

    A plain class: a NamedTuple costs 0.2-0.4 ms at every pytest start-up.
    """

    __slots__ = ("seconds", "where")

    def __init__(self, seconds: float, where: str) -> None:
        self.seconds = seconds
        self.where = where

    def describe(self) -> str:
        """``"5 s (--mps-timeout=5)"``."""
        return f"{self.seconds:g} s ({self.where})"


_limit_key: pytest.StashKey[Limit | None] = pytest.StashKey()


def session_limit(config: pytest.Config) -> Limit | None:
    """The ``--mps-timeout`` / ``mps_timeout`` limit, or None."""
    seconds = config.getoption("mps_timeout", None)
    if seconds is not None:
        return Limit(seconds, f"--mps-timeout={seconds:g}")
    text = config.getini("mps_timeout")
    if not text:
        return None
    where = f"mps_timeout in {config.inipath or 'the ini file'}"
    try:
        seconds = parse_timeout(text, where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return Limit(seconds, f"mps_timeout = {seconds:g}")


def limit_of(item: pytest.Item) -> Limit | None:
    """The test's limit: its ``mps_timeout`` marker's, else the session's.

    A marker whose value is not a positive number raises ValueError naming it.
    """
    found = item.stash.get(_limit_key, False)
    if found is not False:
        return found  # type: ignore[return-value]
    limit = None
    marker = ownership.closest_marker(item, "mps_timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("seconds")
        where = f"@pytest.mark.mps_timeout({value!r}) on {item.nodeid}"
        seconds = parse_timeout(value, where)  # a ValueError fails the test
        limit = Limit(seconds, f"mps_timeout({seconds:g}) marker")
    else:
        limit = session_limit(item.config)
    item.stash[_limit_key] = limit
    return limit


def isolate_all(config: pytest.Config) -> bool:
    """True when ``--mps-isolate`` or ``mps_isolate = true`` isolates every test."""
    if config.getoption("mps_isolate", None):
        return True
    return bool(config.getini("mps_isolate"))


def is_isolated(item: pytest.Item) -> bool:
    """True when ``item`` runs in a child process."""
    if isolate_all(item.config):
        return True
    return ownership.closest_marker(item, "mps_isolate") is not None


def start_method(config: pytest.Config) -> str:
    """``forkserver`` or ``fork``, from the option, the ini key, or the default."""
    value = config.getoption("mps_isolate_start", None)
    if value is not None:
        return str(value)
    text = config.getini("mps_isolate_start")
    if not text:
        return "forkserver"
    where = f"mps_isolate_start in {config.inipath or 'the ini file'}"
    try:
        return parse_start(str(text), where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
