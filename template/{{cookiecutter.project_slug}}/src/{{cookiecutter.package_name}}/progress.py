"""Progress while a person waits: a redrawn bar on a terminal, a line in a log.

On a terminal the bar is redrawn in place (at most ten times a second for work
counted item by item). Anywhere else (a CI log, a pipe) redrawing makes no sense:
work that ends within a few seconds prints nothing extra, and longer work prints a
line after QUIET_SECONDS and then every LOG_SECONDS, so a log is never silent for
minutes. Counting happens on the host: showing progress never waits on the device.
"""

from __future__ import annotations

import time
from typing import TextIO

QUIET_SECONDS = 5.0
LOG_SECONDS = 30.0
REDRAW_SECONDS = 0.1
WIDTH = 30


def duration(seconds: float) -> str:
    """`45s`, `3m12s`, `2h05m`: short enough for a progress line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def per_iter(ms: float) -> str:
    """`12.3 ms/iter`, or `17.3 s/iter` from a second on: digits a person reads."""
    if round(ms, 1) < 1000:
        return f"{ms:.1f} ms/iter"
    return f"{ms / 1000:.{2 if ms < 9995 else 1}f} s/iter"


def bar(done: int, total: int) -> str:
    filled = min(WIDTH, int(WIDTH * done / max(1, total)))
    return f"[{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{total}"


class Bar:
    """One line of progress on `stream`; `print` writes a line above it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.drawn = 0  # length of the bar on screen, 0 when none is

    def draw(self, line: str) -> None:
        """Redraw the bar (terminal only)."""
        if not self.tty:
            return
        self.stream.write("\r" + line.ljust(self.drawn))
        self.stream.flush()
        self.drawn = len(line)

    def print(self, text: str) -> None:
        if self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.drawn = 0
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = 0


class Task:
    """Progress through `total` items of one piece of work, with an ETA.

    `advance(done)` after each item; on a terminal it redraws the bar, elsewhere
    it prints a line once the work has taken QUIET_SECONDS (then every
    LOG_SECONDS). `finish()` clears the bar, leaving what `Bar.print` wrote.
    """

    def __init__(self, out: Bar, what: str, total: int, unit: str) -> None:
        self.out = out
        self.what = what
        self.total = total
        self.unit = unit
        self.start = time.monotonic()
        self.shown = 0.0  # when the bar was last drawn
        self.logged = self.start + QUIET_SECONDS - LOG_SECONDS
        self.first: float | None = None  # when the first item was done

    def left(self, done: int, now: float) -> float | None:
        """Seconds still to go at the pace since the first item, None before the
        second: the first carries warm-up and compilation (16 s of a compiled
        model's first evaluation batch on an H200), which the rest do not."""
        if done <= 1 or self.first is None:
            return None
        return (now - self.first) / (done - 1) * (self.total - done)

    def advance(self, done: int) -> None:
        now = time.monotonic()
        if done == 1 or self.first is None:
            self.first = now
        left = self.left(done, now)
        eta = f", ETA {duration(left)}" if left is not None and left >= 1 else ""
        if self.out.tty:
            if now - self.shown >= REDRAW_SECONDS or done >= self.total:
                self.shown = now
                self.out.draw(f"{self.what} {bar(done, self.total)} {self.unit}{eta}")
        elif now - self.logged >= LOG_SECONDS and done < self.total:
            self.logged = now
            self.out.print(
                f"{self.what}: {done}/{self.total} {self.unit} after"
                f" {duration(now - self.start)}{eta}"
            )

    def finish(self) -> None:
        if self.out.drawn:
            self.out.stream.write("\r" + " " * self.out.drawn + "\r")
            self.out.stream.flush()
            self.out.drawn = 0
