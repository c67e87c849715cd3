"""How close pytest-mps's synced timer comes to CUDA events, on a real GPU.

For matmul and elementwise workloads from ~50 us to ~100 ms it prints, per size:

* ``events``: the reference, CUDA events around back-to-back calls (median of
  blocks of calls, warm caches: what a benchmark of steady-state work means);
* ``ours``: the median of ``pytest_mps.benchmark.timer.measure``, the code the
  ``mps_benchmark`` fixture runs, with its default settings;
* ``do_bench``: ``triton.testing.do_bench`` median (CUDA events, but it flushes
  the L2 cache before every call, so small workloads read slower there);
* ``Timer``: ``torch.utils.benchmark.Timer.blocked_autorange`` median;
* ``unsynced``: a plain ``perf_counter`` around one call, no sync (what
  pytest-benchmark reads for GPU work), and its ratio to the events.

Run on a CUDA machine:  python benchmarks/timing_accuracy.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_mps.benchmark.records import Settings
from pytest_mps.benchmark.timer import Probe, measure  # noqa: E402


def cuda_probe() -> Probe:
    def new_events() -> Any:
        return (
            torch.cuda.Event(enable_timing=True),
            torch.cuda.Event(enable_timing=True),
        )

    return Probe(
        synchronize=torch.cuda.synchronize,
        new_events=new_events,
        reset_peak_memory=torch.cuda.reset_peak_memory_stats,
        memory=lambda: int(torch.cuda.max_memory_allocated()),
        asynchronous=True,
    )


def events_reference(fn: Callable[[], Any], blocks: int = 9) -> float:
    """Median per-call seconds from CUDA events around blocks of calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = (
        torch.cuda.Event(enable_timing=True),
        torch.cuda.Event(enable_timing=True),
    )
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    per_call = start.elapsed_time(end) / 1000
    n = max(1, int(0.02 / max(per_call, 1e-7)))  # blocks of ~20 ms
    times = []
    for _ in range(blocks):
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000 / n)
    return statistics.median(times)


def unsynced(fn: Callable[[], Any], samples: int = 50) -> float:
    """Median of perf_counter around single calls with no sync."""
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times)


def do_bench(fn: Callable[[], Any]) -> float | None:
    try:
        import triton.testing
    except ImportError:
        return None
    ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    return float(ms) / 1000


def torch_timer(fn: Callable[[], Any], min_run_time: float) -> float:
    from torch.utils.benchmark import Timer

    m = Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(
        min_run_time=min_run_time
    )
    return float(m.median)


def workloads(quick: bool) -> list[tuple[str, str, Callable[[], Any]]]:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 for slow-enough GEMMs
    out: list[tuple[str, str, Callable[[], Any]]] = []
    sizes = [1024, 2048, 4096] if quick else [1024, 2048, 4096, 8192, 12288]
    for n in sizes:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        out.append(("matmul fp32", f"{n}x{n}", lambda a=a, b=b: torch.mm(a, b)))
    shapes = (
        [(24, 1), (26, 1), (28, 1)]
        if quick
        else [
            (24, 1),
            (26, 1),
            (28, 1),
            (28, 10),
            (28, 100),
        ]
    )
    for log2, ops in shapes:
        x = torch.randn(2**log2, device="cuda")

        def chain(x: torch.Tensor = x, ops: int = ops) -> torch.Tensor:
            for _ in range(ops):
                x.mul_(1.0000001)
            return x

        out.append(("elementwise mul_", f"2^{log2} x{ops}", chain))
    return out


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--max-time", type=float, default=1.0)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
        f"pytest-mps Settings(max_time={args.max_time}) defaults otherwise"
    )
    header = (
        f"{'workload':<17}{'size':>12}{'events':>12}{'ours':>12}{'ours/ev':>9}"
        f"{'do_bench':>12}{'ours/db':>9}{'Timer':>12}{'ours/T':>8}"
        f"{'unsynced':>12}{'unsync/ev':>10}{'our ev/wall':>12}{'iters':>7}"
        f"{'round':>10}{'sync':>9}{'disp/comp':>10}  verdict"
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    for kind, size, fn in workloads(args.quick):
        ref = events_reference(fn)
        result, _ = measure(
            fn, probe=cuda_probe(), settings=Settings(max_time=args.max_time)
        )
        ours = result.stats.median
        db = do_bench(fn)
        timer = torch_timer(fn, min_run_time=args.max_time)
        raw = unsynced(fn)
        own_events = result.device_time
        worst = max(worst, abs(ours / ref - 1))
        print(
            f"{kind:<17}{size:>12}{fmt(ref):>12}{fmt(ours):>12}{ratio(ours, ref):>9}"
            f"{fmt(db):>12}{ratio(ours, db):>9}{fmt(timer):>12}"
            f"{ratio(ours, timer):>8}{fmt(raw):>12}{ratio(raw, ref):>10}"
            f"{ratio(own_events, ours):>12}{result.stats.iterations:>7}"
            f"{fmt(ours * result.stats.iterations):>10}{fmt(result.sync_cost):>9}"
            f"{result.dispatch_ratio:>10.3f}  {result.verdict}"
        )
        torch.cuda.empty_cache()
    print(f"largest |ours/events - 1|: {worst * 100:.2f}% (goal: within 3%)")


if __name__ == "__main__":
    main()
