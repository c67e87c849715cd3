"""What ``--mps-emulate`` costs on a nanoGPT training step on the CPU, side by side.

The step is the template's GPT (``template/.../model.py``: nanoGPT's model)
in nanoGPT's ``shakespeare_char`` shape (6 layers, 384 wide, 6 heads, block
256, vocab 65, dropout 0.2) at batch 8 — forward, loss, backward, fused
AdamW — and, with ``--preset tiny``, the template's ``tiny`` preset (4 layers,
128 wide, block 64, batch 32), where per-op costs weigh most. Two
configurations run interleaved, round after round, so drift hits both alike:

- ``plain``: CPU tensors, no emulation installed;
- ``emulated``: the emulation installed (``pytest_mps.emulate.install``), the
  model and batch on ``mps`` (the emulated device);
- with ``--watch``, also ``watched``: emulated, with the watchers a test gets
  from ``@pytest.mark.no_host_sync`` and ``--mps-mixed-devices`` (their
  ``TorchFunctionMode`` front and dispatch mode, as in a pytest run).

All compute the same numbers (the script checks the losses bit for bit).
Reported: each configuration's median step, and the median of the per-round
ratios emulated / plain (and watched / plain). Goal: <= 1.3x on the nanoGPT
step with the watchers off (issue "--mps-emulate").

Usage: ``python benchmarks/emulation_overhead.py [--preset nanogpt|tiny|both]
[--rounds N] [--steps N] [--threads N] [--watch]``.

Measured on this workplace's 2-core CPU machine (torch 2.13.0+cpu, 2 threads),
``python benchmarks/emulation_overhead.py --preset both --rounds 11 --steps 2``:
nanogpt 1.05x (1159 against 1207 ms/step), tiny 1.14x (79 against 90 ms).
With ``--watch --threads 2`` on a lent H200 machine's CPU (torch 2.11):
nanogpt 1.06x emulated, 1.08x with the watchers; tiny 1.26x and 1.24x.
docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_mps.emulate.install import Emulation  # noqa: E402

MODEL = (
    ROOT
    / "template"
    / "{{cookiecutter.project_slug}}"
    / "src"
    / "{{cookiecutter.package_name}}"
    / "model.py"
)
SHAPES = {
    # name: (n_layer, n_head, n_embd, block_size, dropout, batch)
    "nanogpt": (6, 6, 384, 256, 0.2, 8),
    "tiny": (4, 4, 128, 64, 0.0, 32),
}


def load_gpt() -> Any:
    spec = importlib.util.spec_from_file_location("template_gpt", MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["template_gpt"] = module
    spec.loader.exec_module(module)
    return module


def make_step(gpt: Any, shape: str, device: str) -> Callable[[], torch.Tensor]:
    n_layer, n_head, n_embd, block, dropout, batch = SHAPES[shape]
    config = gpt.GPTConfig(
        vocab_size=65,
        block_size=block,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        dropout=dropout,
    )
    torch.manual_seed(0)
    model = gpt.GPT(config).to(device)
    optimizer = model.make_optimizer(0.1, 1e-3, (0.9, 0.99))
    torch.manual_seed(1)
    x = torch.randint(0, 65, (batch, block)).to(device)
    y = torch.randint(0, 65, (batch, block)).to(device)

    def step() -> torch.Tensor:
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def timed(
    step: Callable[[], torch.Tensor], steps: int, host: bool = True
) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    if host:  # the watchers would rightly call this read a host sync
        loss = loss.cpu()
    return (time.perf_counter() - start) / steps, loss


def watchers() -> Callable[[], Any]:
    """A context of the watchers ``no_host_sync`` and ``--mps-mixed-devices`` add."""
    from pytest_mps.watch.findings import TestFindings
    from pytest_mps.watch.host_sync import SyncGuard
    from pytest_mps.watch.mixed_devices import DeviceGuard
    from pytest_mps.watch.mode import watching

    def context() -> Any:
        guards = [
            SyncGuard(False, "benchmark", TestFindings()),
            DeviceGuard(TestFindings()),
        ]
        return watching(guards)  # type: ignore[arg-type]

    return context


def run(shape: str, rounds: int, steps: int, watch: bool = False) -> dict[str, float]:
    gpt = load_gpt()
    emulation = Emulation((99, 0), fallback=False)
    plain_step = make_step(gpt, shape, "cpu")
    emulation.install()
    try:
        emulated_step = make_step(gpt, shape, "mps")
        torch.manual_seed(2)
        timed(emulated_step, 1)  # the first step imports modules
        # its own model, stepped in lockstep with the others
        watched_step = make_step(gpt, shape, "mps")
        torch.manual_seed(2)
        timed(watched_step, 1)
    finally:
        emulation.undo()
    torch.manual_seed(2)
    timed(plain_step, 1)
    plain: list[float] = []
    emulated: list[float] = []
    watched: list[float] = []
    watching = watchers() if watch else None
    drift = 0.0
    for round_ in range(rounds):
        # dropout draws from the CPU's generator in one and the device's in
        # the other: the same seed before each makes them draw the same masks
        torch.manual_seed(3 + round_)
        seconds, plain_loss = timed(plain_step, steps)
        plain.append(seconds)
        emulation.install()
        try:
            torch.manual_seed(3 + round_)
            seconds, emulated_loss = timed(emulated_step, steps)
        finally:
            emulation.undo()
        emulated.append(seconds)
        if not torch.equal(plain_loss, emulated_loss):
            raise SystemExit(
                f"the emulated step computed another loss: {emulated_loss.item()} "
                f"against {plain_loss.item()} on the CPU"
            )
        if watching is not None:
            emulation.install()
            try:
                with watching():
                    torch.manual_seed(3 + round_)
                    seconds, watched_loss = timed(watched_step, steps, host=False)
                watched_loss = watched_loss.cpu()
            finally:
                emulation.undo()
            watched.append(seconds)
            # a dispatch mode makes composites take other paths (attention's
            # math kernel): close to the CPU's numbers, not always equal
            drift = max(drift, (plain_loss - watched_loss).abs().item())
    ratios = [e / p for e, p in zip(emulated, plain, strict=True)]
    found = {
        "plain_ms": statistics.median(plain) * 1000,
        "emulated_ms": statistics.median(emulated) * 1000,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    if watched:
        watched_ratios = [w / p for w, p in zip(watched, plain, strict=True)]
        found["watched_ms"] = statistics.median(watched) * 1000
        found["watched_ratio"] = statistics.median(watched_ratios)
        found["watched_drift"] = drift
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=[*SHAPES, "both"], default="nanogpt")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--watch", action="store_true", help="also time the watchers")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = list(SHAPES) if args.preset == "both" else [args.preset]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.rounds} rounds x {args.steps} steps, interleaved"
    )
    for shape in shapes:
        found = run(shape, args.rounds, args.steps, args.watch)
        print(
            f"{shape}: plain {found['plain_ms']:.1f} ms/step, emulated "
            f"{found['emulated_ms']:.1f} ms/step: {found['ratio']:.2f}x (paired "
            f"rounds {found['ratio_min']:.2f}-{found['ratio_max']:.2f}x); losses "
            "equal bit for bit"
        )
        if "watched_ms" in found:
            print(
                f"{shape}: emulated with the watchers on {found['watched_ms']:.1f} "
                f"ms/step: {found['watched_ratio']:.2f}x plain (median of rounds); "
                f"largest loss difference from the CPU {found['watched_drift']:.2e}"
            )


if __name__ == "__main__":
    main()
