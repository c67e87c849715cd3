"""One benchmark measures at a time on a machine: a lock across processes.

pytest-xdist runs tests in several processes at once; two benchmarks timed at
the same moment share the cores (and, on a Mac, the one GPU), and both read
slow. pytest-benchmark turns itself off under xdist; we let the workers run
every other test in parallel and take turns only for the measured sections,
through an advisory file lock (``filelock``: ``fcntl.flock`` on POSIX,
``msvcrt.locking`` on Windows), which the OS releases when a process dies, so
a killed worker never leaves it held. The default lock is one file per user in
the temp folder, so separate sessions of the same user on this machine (two CI
jobs, two terminals) take turns too.
"""

from __future__ import annotations

import contextlib
import getpass
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_locks: dict[Path, Any] = {}


def lock_path(setting: str) -> Path | None:
    """The lock file that ``--mps-benchmark-lock`` names; None for ``off``."""
    if setting == "off":
        return None
    if setting != "auto":
        return Path(setting)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        user = "user"
    safe = "".join(c if c.isalnum() else "_" for c in user)
    return Path(tempfile.gettempdir()) / f"pytest-mps-benchmark-{safe}.lock"


@contextlib.contextmanager
def measuring(path: Path | None) -> Iterator[float]:
    """Hold the machine's benchmark lock; yields the seconds spent waiting."""
    if path is None:
        yield 0.0
        return
    from filelock import FileLock

    lock = _locks.get(path)
    if lock is None:
        # One object per file: it counts re-entries, so a benchmark measured
        # inside another's function does not wait for itself.
        lock = _locks[path] = FileLock(path, thread_local=False)
    started = time.perf_counter()
    try:
        lock.acquire(poll_interval=0.005)
    except OSError as exc:
        raise RuntimeError(
            f"--mps-benchmark-lock: cannot use the lock file {path}: {exc}; "
            "name another with --mps-benchmark-lock=PATH or turn it off with "
            "--mps-benchmark-lock=off"
        ) from None
    try:
        yield time.perf_counter() - started
    finally:
        lock.release()


def header_line(setting: str, workers: int) -> str | None:
    """The header's word on taking turns, when several processes measure."""
    path = lock_path(setting)
    if workers < 2:
        return None
    if path is None:
        return (
            f"benchmarks: {workers} xdist workers measure at the same time "
            "(--mps-benchmark-lock=off): their timings disturb each other"
        )
    return (
        f"benchmarks: {workers} xdist workers take turns, one benchmark "
        f"measures at a time ({path}); other tests run in parallel"
    )
