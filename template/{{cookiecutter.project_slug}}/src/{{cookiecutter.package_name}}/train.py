"""The training loop: no framework, just the steps.

Setup builds a `Trainer` (model, optimizer, batches on the device). Each iteration
sets the learning rate, evaluates and checkpoints at intervals, and runs one
`train_step`. The loss stays on the device and is read back only every
`log_interval` steps, so the host can queue the next step while the device works.
Under torchrun each process runs this same loop on its share of the micro-batches
(see distributed.py); rank 0 alone evaluates, logs and writes files.
"""

from __future__ import annotations

import contextlib
import csv
import inspect
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint, distributed
from .config import Config
from .config import replace as replace_config
from .data import Batches, load_dataset
from .device import (
    Runtime,
    cuda_fast_matmul,
    device_name,
    make_runtime,
    mps_available,
    peak_flops,
    pick_device,
    rng_state,
    set_rng_state,
    to_device,
)
from .distributed import Dist
from .errors import CheckpointError, ConfigError, DeviceError
from .model import GPT, GPTConfig

# GPT-2's 50257 tokens padded to a multiple of 64: faster matmuls (nanoGPT).
GPT2_PADDED_VOCAB = 50304


@dataclass
class Trainer:
    cfg: Config
    runtime: Runtime
    model: GPT  # the plain module: its state_dict is what checkpoints hold
    step_model: torch.nn.Module  # the same model, compiled when asked
    ddp: DistributedDataParallel | None  # step_model wrapped, under torchrun
    dist: Dist
    micro_steps: int  # this process's micro-batches per optimizer step
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    batches: Batches
    splits: dict[str, torch.Tensor]
    tokenizer_meta: dict[str, Any]
    iter_num: int = 0
    best_val_loss: float = math.inf
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[tuple[int, float, float]] = field(default_factory=list)
    compile_mode: str = "off"  # the torch.compile mode in use, or off

    @property
    def tokens_per_iter(self) -> int:
        """Tokens per optimizer step, over all processes."""
        c = self.cfg
        return c.batch_size * c.block_size * c.gradient_accumulation_steps

    def mfu(self, seconds_per_iter: float) -> float | None:
        """Model FLOPs utilisation against the devices' peak, None when unknown."""
        peak = peak_flops(self.runtime.device, self.runtime.dtype)
        if peak is None:
            return None
        flops = self.model.flops_per_token() * self.tokens_per_iter
        return flops / seconds_per_iter / (peak * self.dist.world_size)


def lr_at(cfg: Config, it: int) -> float:
    """Linear warmup, then cosine decay to min_lr; constant when decay_lr is off."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= cfg.lr_decay_steps:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / max(1, cfg.lr_decay_steps - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def model_config(cfg: Config, tokenizer_meta: dict[str, Any]) -> GPTConfig:
    vocab_size = int(tokenizer_meta["vocab_size"])
    if tokenizer_meta["kind"] == "gpt2":
        vocab_size = GPT2_PADDED_VOCAB
    return GPTConfig(
        vocab_size=vocab_size,
        block_size=cfg.block_size,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        dropout=cfg.dropout,
        bias=cfg.bias,
    )


def create(
    cfg: Config,
    runtime: Runtime,
    splits: dict[str, torch.Tensor],
    tokenizer_meta: dict[str, Any],
    gpt_config: GPTConfig | None = None,
    dist: Dist | None = None,
) -> Trainer:
    """A fresh Trainer over token tensors that are already on the device.

    Under torchrun (`dist` of several processes) the process group must exist.
    """
    dist = dist or Dist()
    micro_steps = distributed.micro_steps(cfg.gradient_accumulation_steps, dist)
    torch.manual_seed(cfg.seed)  # seeds the CPU and every accelerator
    gpt_config = gpt_config or model_config(cfg, tokenizer_meta)
    model = GPT(gpt_config).to(runtime.device)
    optimizer = model.make_optimizer(
        cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2)
    )
    scaler = None
    if runtime.needs_grad_scaler:
        try:
            scaler = torch.amp.GradScaler(runtime.device.type)
        except (RuntimeError, ValueError) as exc:
            raise DeviceError(
                f"float16 training needs loss scaling, which PyTorch"
                f" {torch.__version__} lacks on {runtime.device} ({exc});"
                " use --dtype=bfloat16 or --dtype=float32"
            ) from exc
    step_model: torch.nn.Module = model
    compile_mode = "off"
    if runtime.compile:
        compile_mode = pick_compile_mode(
            cfg, micro_steps, runtime.device.type, dist.enabled
        )
        mode = None if compile_mode == "default" else compile_mode
        step_model = torch.compile(model, mode=mode)  # type: ignore[assignment]
    ddp = None
    if dist.enabled:
        # DDP copies rank 0's weights to every process and averages gradients.
        # The position buffer is a constant: nothing to broadcast per step.
        on_gpu = runtime.device.type == "cuda"
        ddp = DistributedDataParallel(
            step_model,
            device_ids=[runtime.device.index] if on_gpu else None,
            **_no_buffer_sync(),
        )
        torch.manual_seed(cfg.seed + dist.rank)  # each process its own dropout
    # This process's micro-batch slots of each optimizer step (see Batches).
    first = dist.rank * micro_steps
    batches = Batches(
        splits["train"], gpt_config.block_size, cfg.batch_size, cfg.seed, "train",
        slots=range(first, first + micro_steps),
    )  # fmt: skip
    return Trainer(
        cfg, runtime, model, step_model, ddp, dist, micro_steps, optimizer, scaler,
        batches, splits, tokenizer_meta, compile_mode=compile_mode,
    )  # fmt: skip


def pick_compile_mode(
    cfg: Config, micro_steps: int, device_type: str, distributed: bool
) -> str:
    """The torch.compile mode: `auto` resolved, CUDA graphs refused while accumulating.

    reduce-overhead replays the step's ~600 kernels as CUDA graphs. In full
    `train` runs on an H200 (shakespeare_char, 1000 iterations with evaluations
    and checkpoints) it took 5.4 ms/iter against 11.3 ms in the default mode,
    reaching the same losses (val 1.451 vs 1.449), so `auto` picks it for one
    CUDA process stepping once per micro-batch; DDP runs keep the default mode
    (CUDA graphs under DDP were not measured). A graph's outputs are
    overwritten by its next replay, and accumulating gradients keeps the
    previous micro-batch's in .grad: PyTorch then fails with "accessing tensor
    output of CUDAGraphs that has been overwritten".
    """
    if cfg.compile_mode == "auto":
        graphs = device_type == "cuda" and micro_steps == 1 and not distributed
        return "reduce-overhead" if graphs else "default"
    if cfg.compile_mode == "reduce-overhead" and micro_steps > 1:
        raise ConfigError(
            f"compile_mode='reduce-overhead' with gradient_accumulation_steps="
            f"{cfg.gradient_accumulation_steps} ({micro_steps} micro-batches per"
            " process): CUDA graphs overwrite the gradients being accumulated;"
            " use --compile_mode=default, or a larger --batch_size with"
            " --gradient_accumulation_steps=1 per process"
        )
    return cfg.compile_mode


def _no_buffer_sync() -> dict[str, Any]:
    # The model's one buffer (positions) is a constant: no broadcast per forward.
    # Newer PyTorch renamed DDP's broadcast_buffers to forward_sync_buffers.
    names = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in names:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def setup(cfg: Config, log: Any = print, dist: Dist | None = None) -> Trainer:
    """Load the dataset onto the device and build or resume the Trainer."""
    dist = dist or Dist()
    runtime = make_runtime(cfg.device, cfg.dtype, cfg.compile)
    dataset = load_dataset(cfg)
    splits = {
        "train": to_device(dataset.train, runtime.device),
        "val": to_device(dataset.val, runtime.device),
    }
    if cfg.init_from == "scratch":
        return create(cfg, runtime, splits, dataset.tokenizer_meta, dist=dist)
    path = checkpoint.path_in(cfg.out_dir)
    state = checkpoint.load(path)
    if state["tokenizer"] != dataset.tokenizer_meta:
        raise CheckpointError(
            f"{path} was trained with another vocabulary than dataset"
            f" {cfg.dataset!r} in {dataset.folder}; pass the run's --dataset"
        )
    saved = GPTConfig(**state["model_config"])
    trainer = create(cfg, runtime, splits, dataset.tokenizer_meta, saved, dist)
    try:
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        if trainer.scaler is not None and state.get("scaler"):
            trainer.scaler.load_state_dict(state["scaler"])
        trainer.batches.load_state_dict(state["batches"])
        # Each process's dropout stream, when the run had as many processes.
        rngs = state.get("rng_by_rank") or [state["rng"]]
        if len(rngs) == dist.world_size:
            set_rng_state(runtime.device, rngs[dist.rank])
    except (KeyError, RuntimeError, ValueError) as exc:
        raise CheckpointError(
            f"{path} does not fit this run ({type(exc).__name__}: {exc})"
        ) from exc
    trainer.iter_num = int(state["iter_num"])
    trainer.best_val_loss = float(state["best_val_loss"])
    trainer.losses = [(int(i), float(v)) for i, v in state["losses"]]
    trainer.evals = [(int(i), float(t), float(v)) for i, t, v in state["evals"]]
    log(f"resumed from {path} at iteration {trainer.iter_num}")
    return trainer


def train_step(t: Trainer) -> torch.Tensor:
    """One optimizer step over gradient_accumulation_steps micro-batches.

    Under torchrun this process does its micro_steps share, and DDP averages the
    gradients across processes in the last micro-step's backward (the others run
    under no_sync, with no communication). Returns this process's mean loss as a
    device tensor; reading it is the caller's choice.
    """
    steps = t.micro_steps
    model = t.ddp if t.ddp is not None else t.step_model
    total: torch.Tensor | None = None
    for i in range(steps):
        x, y = t.batches.next()
        last = i == steps - 1
        sync = t.ddp.no_sync() if t.ddp is not None and not last else _no_op()
        with sync:
            with t.runtime.autocast:
                _, loss = model(x, y)
            if steps > 1:  # x / 1 is exact: skip its kernel, forward and backward
                loss = loss / steps
            if t.scaler is not None:
                t.scaler.scale(loss).backward()
            else:
                loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    if t.cfg.grad_clip > 0:
        if t.scaler is not None:
            t.scaler.unscale_(t.optimizer)
        torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.cfg.grad_clip)
    if t.scaler is not None:
        t.scaler.step(t.optimizer)
        t.scaler.update()
    else:
        t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    assert total is not None  # gradient_accumulation_steps >= 1
    return total


def _no_op() -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(t: Trainer) -> dict[str, float]:
    """Mean loss over eval_iters batches per split, from a fixed random stream.

    Its own generators leave the training batches and dropout untouched, so
    evaluating never changes what training does next. It uses no collective
    operation (the model without its DDP wrapper), so rank 0 runs it alone.
    """
    t.model.eval()
    means = {}
    for i, (name, tokens) in enumerate(t.splits.items()):
        batches = Batches(
            tokens, t.model.cfg.block_size, t.cfg.batch_size, t.cfg.seed + 1 + i, name
        )
        total = torch.zeros((), device=t.runtime.device)
        for _ in range(t.cfg.eval_iters):
            x, y = batches.next()
            with t.runtime.autocast:
                _, loss = t.step_model(x, y)
            total += loss.float()
        means[name] = total.item() / t.cfg.eval_iters
    t.model.train()
    return means


def save(t: Trainer, streams: list[tuple[dict[int, torch.Tensor], Any]]) -> Path:
    """Write the checkpoint (rank 0's job); `streams` is every rank's
    (batch stream state, random state), from `distributed.gather`."""
    path = checkpoint.path_in(t.cfg.out_dir)
    batches: dict[int, torch.Tensor] = {}
    for batch_state, _ in streams:
        batches.update(batch_state)
    checkpoint.save(
        {
            "model": t.model.state_dict(),
            "optimizer": t.optimizer.state_dict(),
            "scaler": t.scaler.state_dict() if t.scaler is not None else {},
            "model_config": t.model.cfg.to_dict(),
            "config": t.cfg.to_dict(),
            "tokenizer": t.tokenizer_meta,
            "iter_num": t.iter_num,
            "best_val_loss": t.best_val_loss,
            "batches": batches,
            "rng": streams[0][1],
            "rng_by_rank": [rng for _, rng in streams],
            "world_size": t.dist.world_size,
            "written_by_rank": t.dist.rank,
            "losses": t.losses,
            "evals": t.evals,
        },
        path,
    )
    return path


class Progress:
    """A one-line bar on a terminal; plain log lines anywhere else."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.drawn = 0

    def update(self, it: int, loss: float, ms: float, mfu: float | None) -> None:
        extra = f", mfu {mfu:.1%}" if mfu is not None else ""
        if not self.tty:
            self.print(f"iter {it}: loss {loss:.4f}, {ms:.1f} ms/iter{extra}")
            return
        width = 30
        filled = int(width * it / max(1, self.total))
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {it}/{self.total}"
            f" loss {loss:.4f} {ms:.1f} ms/iter{extra}"
        )
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
            self.drawn = 0


@dataclass
class TrainResult:
    iter_num: int
    losses: list[tuple[int, float]]  # (iteration, train loss) at log steps
    evals: list[tuple[int, float, float]]  # (iteration, train, val)
    checkpoint: Path | None
    ms_per_iter: float | None


def train(cfg: Config, stream: TextIO | None = None) -> TrainResult:
    """Train from scratch or resume, as `cfg` says; return what happened.

    Under torchrun (WORLD_SIZE > 1 in the environment) this is one of the
    processes of a DistributedDataParallel run; only rank 0 prints.
    """
    dist = distributed.from_env()
    device = distributed.device_for(
        cfg.device, dist, mps_available(), torch.cuda.device_count()
    )
    if device != cfg.device:
        cfg = replace_config(cfg, device=device)
    with contextlib.ExitStack() as stack:
        if not dist.is_main:
            stream = stack.enter_context(open(os.devnull, "w"))
        progress = Progress(cfg.max_iters, stream or sys.stdout)
        stack.enter_context(distributed.process_group(dist, pick_device(cfg.device)))
        t = setup(cfg, log=progress.print, dist=dist)
        with cuda_fast_matmul(t.runtime.device):
            result = _loop(t, progress)
    return result


def _loop(t: Trainer, progress: Progress) -> TrainResult:
    cfg, rt = t.cfg, t.runtime
    processes = ""
    if t.dist.enabled:
        processes = (
            f"; {t.dist.world_size} DDP processes, {t.micro_steps} micro-batch(es) each"
        )
    mode = f" ({t.compile_mode})" if rt.compile else ""
    progress.print(
        f"{t.model.num_params() / 1e6:.2f}M parameters on {rt.describe()}{mode}"
        f"{processes};"
        f" {t.tokens_per_iter:,} tokens per iteration"
    )
    if peak_flops(rt.device, rt.dtype) is None:
        progress.print(
            f"MFU unknown for {device_name(rt.device)} ({rt.device}): no peak-FLOPS"
            " entry for it in device.py"
        )
    start = t.iter_num
    saved: Path | None = None
    ms_per_iter = None
    last_time, last_iter = time.perf_counter(), t.iter_num
    while True:
        it = t.iter_num
        if (it % cfg.eval_interval == 0 or it >= cfg.max_iters) and not (
            it == start and start > 0
        ):
            # A resumed run starts where its checkpoint's evaluation left off.
            # Every rank hands rank 0 its stream states; rank 0 alone evaluates.
            streams = distributed.gather(
                (t.batches.state_dict(), rng_state(rt.device)), t.dist
            )
            if t.dist.is_main:
                losses = evaluate(t)
                t.evals.append((it, losses["train"], losses["val"]))
                progress.print(
                    f"step {it}: train loss {losses['train']:.4f},"
                    f" val loss {losses['val']:.4f}"
                )
                improved = losses["val"] < t.best_val_loss
                t.best_val_loss = min(t.best_val_loss, losses["val"])
                if it > 0 and (improved or cfg.always_save_checkpoint):
                    saved = save(t, streams)
            last_time, last_iter = time.perf_counter(), it
        if it >= cfg.max_iters:
            break
        lr = lr_at(cfg, it)
        for group in t.optimizer.param_groups:
            group["lr"] = lr
        loss = train_step(t)
        t.iter_num += 1
        if t.iter_num % cfg.log_interval == 0 or t.iter_num == cfg.max_iters:
            # The one host read, every log_interval steps (the mean over ranks).
            value = distributed.mean(loss, t.dist).item()
            now = time.perf_counter()
            seconds = (now - last_time) / (t.iter_num - last_iter)
            last_time, last_iter = now, t.iter_num
            ms_per_iter = 1000 * seconds
            t.losses.append((it, value))
            progress.update(t.iter_num, value, ms_per_iter, t.mfu(seconds))
    progress.close()
    if t.dist.is_main:
        _report(t, progress, start)
    return TrainResult(t.iter_num, t.losses, t.evals, saved, ms_per_iter)


def _report(t: Trainer, progress: Progress, start: int) -> None:
    out_dir = Path(t.cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ran = [loss for it, loss in t.losses if it >= start]
    if ran:
        progress.print(
            f"trained iterations {start}..{t.iter_num}: loss {ran[0]:.4f} ->"
            f" {ran[-1]:.4f}"
        )
    csv_path = out_dir / "loss.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["iter", "train_loss", "eval_train_loss", "eval_val_loss"])
        writer.writerows((it, loss, "", "") for it, loss in t.losses)
        writer.writerows((it, "", tr, val) for it, tr, val in t.evals)
    if t.cfg.plot:
        progress.print(plot_losses(t, out_dir / "loss.png", csv_path))
    if checkpoint.path_in(out_dir).is_file():
        progress.print(f"checkpoint: {checkpoint.path_in(out_dir)}")


def plot_losses(t: Trainer, png: Path, csv_path: Path) -> str:
    """Draw the loss curve if matplotlib is installed; say what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return (
            f"no loss curve: matplotlib is not installed (pip install matplotlib);"
            f" the numbers are in {csv_path}"
        )
    fig, ax = plt.subplots(figsize=(7, 4))
    if t.losses:
        its, losses = zip(*t.losses, strict=True)
        ax.plot(its, losses, label="train (batch)", alpha=0.6)
    if t.evals:
        its, train_losses, val_losses = zip(*t.evals, strict=True)
        ax.plot(its, train_losses, "o-", label="train (eval)")
        ax.plot(its, val_losses, "o-", label="val (eval)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cross-entropy loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return f"loss curve: {png}"
