"""Two benchmark processes taking turns, block by block (the A/B gate's pairs).

A cloud or shared host changes speed on a scale of seconds (this project's
2-core machine flips between two speeds 1.8x apart every 0.25 to 3 s): two
processes run one after the other see different hosts, and no number of
rounds inside a process fixes that. So the A/B gate (:mod:`.ab`) runs the
baseline's process and ours at the same time, and lets only one of them work
at a time: each measures a short block of rounds, then hands the turn over.
Block *k* of one side is then a few milliseconds from block *k* of the other,
on the same host, and their ratio cancels the host's speed.

The controller (:func:`serve`) holds the turn. A worker asks for it by
writing a line (``ready``) and waits for ``go``; its turn lasts until it asks
again or exits, so whatever it does between blocks (a test's setup, pytest's
reporting) never overlaps the other's measurement. The two processes start
together and run their start-up side by side; nothing is measured before a
worker's first turn.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import IO

#: The variable that hands a worker its pipe ends and core: "READ,WRITE,CPU".
ENV = "PYTEST_MPS_AB_BATON"
#: Blocks each benchmark measures after its main measurement, under the baton.
BLOCKS = 10
#: Seconds one block aims to take.
BLOCK_TIME = 0.01


class Baton:
    """A worker's end: :meth:`take` waits for this process's turn."""

    def __init__(self, read_fd: int, write_fd: int, cpu: int | None = None) -> None:
        self._read = os.fdopen(read_fd, "r", buffering=1)
        self._write = os.fdopen(write_fd, "w", buffering=1)
        #: The core both workers of a pair time their blocks on.
        self.cpu = cpu

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """The calling thread on :attr:`cpu` while open (Linux), as it was after.

        The two processes of a pair otherwise run on cores of their own, and
        a shared host's cores differ in speed at the same moment: pure-Python
        blocks read up to 1.6x apart between the processes of one pair. Only
        the calling thread moves: torch's worker threads, made by the full
        measurement before, keep every core.
        """
        if self.cpu is None or not hasattr(os, "sched_setaffinity"):
            yield
            return
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)

    def take(self) -> None:
        """Ask for the turn and wait for it; the turn lasts until the next ask."""
        self._write.write("ready\n")
        self._write.flush()
        if self._read.readline() != "go\n":
            raise RuntimeError("pytest-mps A/B: the controller went away")


_baton: list[Baton | None] = []


def current() -> Baton | None:
    """The baton of a worker the A/B gate started; else None.

    The variable is taken out of the environment, so processes the tests
    start do not inherit pipe ends they were never given.
    """
    if not _baton:
        found = os.environ.pop(ENV, None)
        if found:
            read_fd, write_fd, cpu = found.split(",")
            _baton.append(Baton(int(read_fd), int(write_fd), int(cpu) if cpu else None))
        else:
            _baton.append(None)
    return _baton[0]


class Worker:
    """The controller's end of one worker's two pipes."""

    def __init__(self, label: str, cpu: int | None = None) -> None:
        self.label = label
        self.cpu = cpu
        to_read, self._to_write = os.pipe()  # controller -> worker
        self._from_read, from_write = os.pipe()  # worker -> controller
        self.child_fds = (to_read, from_write)
        self.alive = True
        self.waiting = False
        self._in: IO[str] | None = None
        self._out: IO[str] | None = None

    @property
    def env_value(self) -> str:
        """What the worker finds in :data:`ENV`."""
        cpu = "" if self.cpu is None else str(self.cpu)
        return f"{self.child_fds[0]},{self.child_fds[1]},{cpu}"

    def started(self) -> None:
        """Close the worker's ends here, once it has them."""
        for fd in self.child_fds:
            os.close(fd)
        self._in = os.fdopen(self._from_read, "r", buffering=1)
        self._out = os.fdopen(self._to_write, "w", buffering=1)

    def wait_ready(self) -> None:
        """Block until the worker asks for its turn, or exits."""
        assert self._in is not None
        line = self._in.readline()
        if line == "ready\n":
            self.waiting = True
        else:
            self.alive = False
            self.waiting = False

    def go(self) -> None:
        """Give the worker its turn."""
        assert self._out is not None
        self.waiting = False
        try:
            self._out.write("go\n")
            self._out.flush()
        except BrokenPipeError:
            self.alive = False

    def close(self) -> None:
        """Close the controller's ends."""
        for stream in (self._in, self._out):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def shared_cpu() -> int | None:
    """The core a pair's blocks run on: the first this process may use."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return min(os.sched_getaffinity(0))


def serve(workers: Sequence[Worker]) -> list[str]:
    """Give the turn to each live worker in order, one at a time, until all exit.

    Returns who had each turn, by label (the tests read the alternation).
    """
    turns: list[str] = []
    while any(w.alive for w in workers):
        for worker in workers:
            if not worker.alive:
                continue
            if not worker.waiting:
                worker.wait_ready()  # the others are idle: their turns ended
            if not worker.alive:
                continue
            worker.go()
            turns.append(worker.label)
            worker.wait_ready()  # its turn ends when it asks again or exits
    return turns
