"""What ``--mps-audit`` costs: one nanoGPT-sized training step, and the yaml parse.

The step is nanoGPT's shakespeare_char model (6 layers, 384 wide, 6 heads,
block 256, vocab 65) at batch 8 on the CPU: forward, backward, AdamW step.
It runs bare, under the shared watch mode with no callback (the mode's own
cost, paid by every watcher), and under the mode with the audit's recorder.
Variants are interleaved round by round so drift on a shared machine hits all
three alike; the medians are compared.

Run: ``.venv/bin/python benchmarks/audit_overhead.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import watch_overhead  # the same nanoGPT step, from this folder

from pytest_mps import ops as mps_ops
from pytest_mps.audit import hooks as plugin
from pytest_mps.audit.recorder import Recorder
from pytest_mps.watch import mode as watch


def make_step(batch: int) -> Callable[[], None]:
    """The nanoGPT shakespeare_char training step that watch_overhead.py times."""
    return watch_overhead.make_step(torch.device("cpu"), batch)


def timed(step: Callable[[], None], mode: Any | None) -> float:
    start = time.perf_counter()
    if mode is None:
        step()
    else:
        with mode:
            step()
    return time.perf_counter() - start


def expected(table: mps_ops.OpTable) -> dict[str, Any]:
    """PyTorch's MPS test lists as the audit attributes them (loaded once)."""
    if not _expected:
        _expected.append(plugin.load_expectations(table, plugin.NEWEST_MACOS).blamed)
    return _expected[0]


def expectations_cost(table: mps_ops.OpTable) -> float:
    """Seconds a session spends on PyTorch's lists: common_mps.py read, the
    traced OpInfo map read from its cache (traced first if it is not there),
    and the attribution; the median of 5."""
    passes = []
    for _ in range(5):
        start = time.perf_counter()
        plugin.load_expectations(table, plugin.NEWEST_MACOS)
        passes.append(time.perf_counter() - start)
    return statistics.median(passes)


_expected: list[dict[str, Any]] = []


def callback_cost(table: mps_ops.OpTable, ops: list[tuple[Any, Any, Any]]) -> float:
    """Seconds the audit's callback takes for one step's ops, a fresh recorder
    per pass as each test gets; the median of 20 passes.

    Timed apart from the step, so the noise of a shared machine does not hide it.
    """
    passes = []
    for _ in range(20):
        recorder = Recorder(table, keep_ops=False, expected=expected(table))
        start = time.perf_counter()
        for func, args, kwargs in ops:
            recorder(func, args, kwargs)
        passes.append(time.perf_counter() - start)
    return statistics.median(passes)


def parse_costs() -> dict[str, float]:
    start = time.perf_counter()
    import torchgen.gen  # noqa: F401

    costs = {"import torchgen": time.perf_counter() - start}
    mps_ops.table._memory.clear()
    costs["parse yaml + classify"] = mps_ops.load_table(use_cache=False).seconds
    mps_ops.table._memory.clear()
    table = mps_ops.load_table()
    costs[f"load ({table.source})"] = table.seconds
    costs["load (memory)"] = mps_ops.load_table().seconds
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    costs = parse_costs()
    table = mps_ops.load_table()
    expected(table)  # traces op_db into the cache on a first run
    costs["PyTorch's lists (cache)"] = expectations_cost(table)
    step = make_step(args.batch)

    ops: list[tuple[Any, Any, Any]] = []
    with watch.watch_mode([lambda func, a, k: ops.append((func, a, dict(k)))]):
        step()
    callback = callback_cost(table, ops)
    recorder = Recorder(table, keep_ops=False, expected=expected(table))
    with watch.watch_mode([recorder]):
        step()  # warm the recorder's per-op cache, as the first test would
    variants: dict[str, Callable[[], Any | None]] = {
        "bare": lambda: None,
        "watch mode, no callback": lambda: watch.watch_mode([]),
        "watch mode + audit": lambda: watch.watch_mode([recorder]),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, make_mode in variants.items():
            times[name].append(timed(step, make_mode()))

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"GPT 6x384, 6 heads, block 256, batch {args.batch}; "
        f"{len(ops)} aten ops per step; {args.rounds} interleaved rounds"
    )
    # On a shared machine the minimum is the least disturbed estimate.
    bare = min(times["bare"])
    print(f"{'variant':<26} {'median ms':>10} {'min ms':>8} {'min vs bare':>12}")
    for name, values in times.items():
        low = min(values)
        print(
            f"{name:<26} {statistics.median(values) * 1000:>10.1f} "
            f"{low * 1000:>8.1f} {low / bare:>11.3f}x"
        )
    mode = min(times["watch mode, no callback"])
    audit = min(times["watch mode + audit"])
    print(
        f"end to end (min): the audit adds {(audit - mode) * 1000:.1f} ms per step "
        f"to the bare watch mode, {(audit - bare) * 1000:.1f} ms to no mode"
    )
    print(
        f"audit callback alone: {callback * 1000:.2f} ms per step "
        f"({callback / len(ops) * 1e6:.2f} us per op) = "
        f"{callback / bare * 100:.2f}% of the bare step"
    )
    print(f"findings on this step: {sorted(recorder.findings) or 'none'}")
    print("op table:")
    for name, seconds in costs.items():
        print(f"  {name:<24} {seconds * 1000:>8.1f} ms")


if __name__ == "__main__":
    main()
