"""A small benchmark of the training step on random tokens: no dataset needed."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import torch

from .config import Config
from .device import (
    cuda_fast_matmul,
    device_name,
    make_runtime,
    peak_memory,
    synchronize,
)
from .progress import per_iter
from .tokenizers import GPT2_VOCAB_SIZE
from .train import train_step
from .trainer import create

CHAR_VOCAB_SIZE = 96  # a generous character vocabulary


@dataclass(frozen=True)
class BenchResult:
    device: str
    ms_per_iter: float  # median over bench_iters timed steps
    tokens_per_s: float
    mfu: float | None
    final_loss: float
    peak_memory: int | None
    peak_memory_source: str | None = None


def bench(cfg: Config, stream: TextIO | None = None) -> BenchResult:
    """Time cfg.bench_iters training steps after a warmup and print the numbers."""
    stream = stream or sys.stdout
    runtime = make_runtime(cfg.device, cfg.dtype, cfg.compile)
    kind = "gpt2" if cfg.tokenizer == "gpt2" else "char"
    vocab = GPT2_VOCAB_SIZE if kind == "gpt2" else CHAR_VOCAB_SIZE
    generator = torch.Generator().manual_seed(cfg.seed)
    n_tokens = max(100_000, 4 * cfg.batch_size * (cfg.block_size + 1))
    splits = {
        name: torch.randint(vocab, (n_tokens,), generator=generator).to(runtime.device)
        for name in ("train", "val")
    }
    t = create(cfg, runtime, splits, {"kind": kind, "vocab_size": vocab})
    warmup = 10 if runtime.compile else 3
    times = []
    with cuda_fast_matmul(runtime.device):
        for _ in range(warmup):
            train_step(t)
        synchronize(runtime.device)
        for _ in range(cfg.bench_iters):
            start = time.perf_counter()
            loss = train_step(t)
            # Timing each step needs a sync; the training loop itself never does.
            synchronize(runtime.device)
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    peak = peak_memory(runtime.device)
    result = BenchResult(
        device=f"{device_name(runtime.device)} ({runtime.device})",
        ms_per_iter=1000 * seconds,
        tokens_per_s=t.tokens_per_iter / seconds,
        mfu=t.mfu(seconds),
        final_loss=loss.item(),
        peak_memory=peak[0] if peak is not None else None,
        peak_memory_source=peak[1] if peak is not None else None,
    )
    mfu = f"{result.mfu:.1%}" if result.mfu is not None else "unknown for this device"
    memory = (
        f"{result.peak_memory / 2**20:.0f} MiB ({result.peak_memory_source})"
        if result.peak_memory is not None
        else "not measured on CPU"
    )
    print(
        f"preset {cfg.preset}, {t.model.num_params() / 1e6:.2f}M parameters on"
        f" {runtime.describe()}\n"
        f"  median {per_iter(result.ms_per_iter)} over {cfg.bench_iters} steps"
        f" (after {warmup} warmup), {result.tokens_per_s:,.0f} tokens/s\n"
        f"  MFU {mfu}; peak memory {memory}; loss {result.final_loss:.4f}",
        file=stream,
    )
    return result
