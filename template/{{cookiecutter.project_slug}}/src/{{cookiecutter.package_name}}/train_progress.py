"""What a training run shows while it runs: the bar, evaluation progress, and a
warning when the model is far too large for the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from . import runs
from .config import PRESETS
from .device import device_name, synchronize
from .progress import Bar, Task, bar, duration, per_iter
from .trainer import Trainer


class Progress(Bar):
    """The training bar (iteration, loss, speed, ETA); log lines off a terminal."""

    def __init__(self, total: int, stream: TextIO) -> None:
        super().__init__(stream)
        self.total = total
        self.first: tuple[float, int] | None = None  # (time, iteration) of 1st update
        self.last = ""

    def eta(self, it: int) -> str:
        """', ETA 3m12s' at the pace since the first update (evaluations included)."""
        now = time.monotonic()
        if self.first is None:
            self.first = (now, it)
        start, first = self.first
        if it <= first or it >= self.total:
            return ""
        left = (now - start) / (it - first) * (self.total - it)
        return f", ETA {duration(left)}" if left >= 1 else ""

    def update(self, it: int, loss: float, ms: float, mfu: float | None) -> None:
        extra = f", mfu {mfu:.1%}" if mfu is not None else ""
        text = f"loss {loss:.4f} {per_iter(ms)}{extra}"
        if not self.tty:
            self.print(
                f"iter {it}: loss {loss:.4f}, {per_iter(ms)}{extra}{self.eta(it)}"
            )
            return
        self.last = text
        self.draw(f"{bar(it, self.total)} {text}{self.eta(it)}")

    def complete(self, done: int) -> None:
        """Show the bar full once the last step is done (it is drawn before)."""
        if self.tty and self.last:
            self.draw(f"{bar(done, self.total)} {self.last}")


def evaluation_progress(
    t: Trainer, out: Bar, it: int, stop: runs.StopSignal, measure: bool
) -> Callable[[int], bool]:
    """evaluate's on_batch: a bar, a speed estimate from the first evaluation,
    and the answer to "go on?" (no, once Ctrl-C was pressed)."""
    total = t.cfg.eval_batches("train") + t.cfg.eval_batches("val")
    task = Task(out, f"step {it}: evaluating", total, "batches")
    marks: dict[int, float] = {}
    # The batches after the first pass time a forward pass (the first may
    # include warm-up); a compiled model compiles during its first evaluations,
    # so it is not timed. A pass may hold several batches (eval_chunk).
    measure = measure and total >= 3 and not t.runtime.compile

    def on_batch(done: int) -> bool:
        if measure and (not marks or (len(marks) == 1 and done - min(marks) >= 2)):
            synchronize(t.runtime.device)  # once per run, outside training steps
            marks[done] = time.perf_counter()
            if len(marks) == 2:
                first, last = sorted(marks)
                seconds = (marks[last] - marks[first]) / (last - first)
                warning = size_warning(t, seconds)
                if warning:
                    out.print(warning)
        task.advance(done)
        if done == total or stop.signum:
            task.finish()
        return not stop.signum

    return on_batch


# A training step slower than this, in a run longer than LONG_RUN_SECONDS, makes
# the model far too large for the device: the presets run thousands of steps.
SLOW_STEP_SECONDS = 1.0
LONG_RUN_SECONDS = 600.0
# The settings that make a model (and its step) larger.
SIZE_SETTINGS = ("n_layer", "n_embd", "block_size", "batch_size")


def size_warning(t: Trainer, batch_seconds: float) -> str | None:
    """A warning, with the measured figure, when each step takes seconds and the
    run would take more than LONG_RUN_SECONDS; it names what to change.

    A step is about three forward passes (forward and backward) per micro-batch;
    `batch_seconds` is one forward pass of an evaluation batch, measured here
    during the evaluation at t.iter_num.
    """
    cfg = t.cfg
    step = 3 * t.micro_steps * batch_seconds
    iters_left = cfg.max_iters - t.iter_num
    # This evaluation, those at later multiples of eval_interval, and the last.
    evaluations = len(range(t.iter_num, cfg.max_iters + 1, cfg.eval_interval))
    evaluations += cfg.max_iters % cfg.eval_interval != 0 and iters_left > 0
    batches = cfg.eval_batches("train") + cfg.eval_batches("val")
    total = iters_left * step + evaluations * batches * batch_seconds
    if step < SLOW_STEP_SECONDS or total < LONG_RUN_SECONDS:
        return None
    preset = PRESETS.get(cfg.preset, {})
    own = [n for n in SIZE_SETTINGS if getattr(cfg, n) != preset.get(n)]
    if own:  # the user sized the model: name those settings, not the preset
        settings = ", ".join(f"{n}={getattr(cfg, n)}" for n in own)
        what = f"the model set here ({settings})"
    else:
        what = f"preset {cfg.preset!r}"
    sizes = " ".join(f"--{n}={getattr(cfg, n)}" for n in SIZE_SETTINGS)
    change = (
        "--preset=tiny suits this device"
        if cfg.preset != "tiny" and not own
        else f"a smaller model suits it (now {sizes})"
    )
    return (
        f"warning: {what} is far too large for"
        f" {device_name(t.runtime.device)} ({t.runtime.device}): one evaluation"
        f" batch took {batch_seconds:.2f} s here, so a training step takes about"
        f" {duration(step)} and this run ({iters_left} iterations,"
        f" {evaluations} evaluations of {batches} batches) about"
        f" {duration(total)}; {change}, or fewer --max_iters (now"
        f" {cfg.max_iters}), or a GPU"
    )
