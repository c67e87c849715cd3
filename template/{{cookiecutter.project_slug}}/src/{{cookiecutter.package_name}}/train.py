"""The training loop: no framework, just the steps.

Setup builds a `Trainer` (model, optimizer, batches on the device). Each iteration
sets the learning rate, evaluates and checkpoints at intervals, and runs one
`train_step`. The loss stays on the device and is read back only every
`log_interval` steps, so the host can queue the next step while the device works.
Under torchrun each process runs this same loop on its share of the micro-batches
(see distributed.py); rank 0 alone evaluates, logs and writes files. What a run may
do to out_dir (never replace another run's checkpoint; resume only a matching one;
save on Ctrl-C) is in runs.py.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint, compile_cache, distributed, eval_graph, optim, report, runs
from .config import PRESETS, Config
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
    synchronize,
    to_device,
)
from .distributed import Dist
from .errors import CheckpointError, ConfigError, DeviceError
from .files import ensure_writable
from .model import GPT, GPTConfig
from .progress import Bar, Task, bar, duration, per_iter

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
    # evaluation passes as CUDA graphs of `model` (--eval_graph); None: step_model
    graphed_loss: eval_graph.GraphedLoss | None = None
    # The run's clock: seconds since train() began, plus earlier processes' time
    # (resumed runs), at each evaluation's end and each logged loss.
    eval_seconds: dict[int, float] = field(default_factory=dict)
    log_seconds: dict[int, float] = field(default_factory=dict)
    seconds_before: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def seconds(self) -> float:
        """Seconds this run has taken so far, earlier processes' included."""
        return self.seconds_before + time.perf_counter() - self.started

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
    optimizer = optim.make(
        model, cfg.optimizer, cfg.learning_rate, cfg.weight_decay,
        (cfg.beta1, cfg.beta2), cfg.muon_lr, cfg.muon_momentum,
    )  # fmt: skip
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
        compile_cache.keep_layouts(runtime.device.type)
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
    graphed = None
    if eval_graph.wanted(cfg.eval_graph, runtime.device):
        graphed = eval_graph.GraphedLoss(model, runtime.dtype)
    return Trainer(
        cfg, runtime, model, step_model, ddp, dist, micro_steps, optimizer, scaler,
        batches, splits, tokenizer_meta, compile_mode=compile_mode,
        graphed_loss=graphed,
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


def setup(
    cfg: Config,
    log: Any = print,
    dist: Dist | None = None,
    typed: frozenset[str] | None = None,
) -> Trainer:
    """Load the dataset onto the device and build or resume the Trainer.

    Resuming takes the checkpoint's settings except those in `typed` (given on
    the command line; None: all of `cfg`), and refuses a checkpoint whose run
    differs from them (runs.check_resume).
    """
    dist = dist or Dist()
    runtime = make_runtime(cfg.device, cfg.dtype, cfg.compile)
    if runtime.compile:
        # before anything compiles: a later run of out_dir starts warm
        folder, warm = compile_cache.use(cfg.out_dir)
        log(compile_cache.describe(folder, warm))
        if not warm:  # a warm start's kernels are compiled already
            compile_cache.start_workers()  # while the data loads
    if cfg.init_from == "scratch":
        dataset = load_dataset(cfg)
        splits = _to_device(dataset.train, dataset.val, runtime)
        return create(cfg, runtime, splits, dataset.tokenizer_meta, dist=dist)
    path = checkpoint.path_in(cfg.out_dir)
    state = checkpoint.load(path)
    cfg = runs.resume_request(cfg, state["config"], typed)
    dataset = load_dataset(cfg)
    if state["tokenizer"] != dataset.tokenizer_meta:
        raise CheckpointError(
            f"{path} was trained with another vocabulary than dataset"
            f" {cfg.dataset!r} in {dataset.folder}; pass the run's --dataset"
        )
    changed = runs.check_resume(cfg, state, path)
    splits = _to_device(dataset.train, dataset.val, runtime)
    # The saved shape; dropout is a training choice (--allow_changes=dropout).
    saved = GPTConfig(**{**state["model_config"], "dropout": cfg.dropout})
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
    # Checkpoints from before the run's clock have none: it starts at 0 then.
    trainer.seconds_before = float(state.get("seconds", 0.0))
    trainer.eval_seconds = {int(i): float(s) for i, s in state.get("eval_seconds", [])}
    trainer.log_seconds = {int(i): float(s) for i, s in state.get("log_seconds", [])}
    log(f"resumed from {path} at iteration {trainer.iter_num} ({runs.describe(state)})")
    if changed:
        log(f"changed on resuming (--allow_changes): {', '.join(changed)}")
    return trainer


def _to_device(train: Any, val: Any, runtime: Runtime) -> dict[str, torch.Tensor]:
    return {
        "train": to_device(train, runtime.device),
        "val": to_device(val, runtime.device),
    }


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
def evaluate(
    t: Trainer, on_batch: Callable[[int], bool] | None = None
) -> dict[str, float] | None:
    """Mean loss over eval_iters batches per split, from a fixed random stream.

    Its own generators leave the training batches and dropout untouched, so
    evaluating never changes what training does next. It uses no collective
    operation (the model without its DDP wrapper), so rank 0 runs it alone.
    `on_batch(batches done)` follows progress; when it returns False the
    evaluation stops and returns None (Ctrl-C: the checkpoint matters more).
    """
    t.model.eval()
    means: dict[str, float] = {}
    done = 0
    try:
        for i, (name, tokens) in enumerate(t.splits.items()):
            batches = Batches(
                tokens,
                t.model.cfg.block_size,
                t.cfg.batch_size,
                t.cfg.seed + 1 + i,
                name,
            )
            total = torch.zeros((), device=t.runtime.device)
            left = t.cfg.eval_iters
            while left:
                # eval_chunk batches in one pass: the same batches, and (equal
                # sizes) the same mean, in fewer and larger forward passes
                n = min(t.cfg.eval_chunk, left)
                drawn = [batches.next() for _ in range(n)]
                x = torch.cat([b[0] for b in drawn]) if n > 1 else drawn[0][0]
                y = torch.cat([b[1] for b in drawn]) if n > 1 else drawn[0][1]
                if t.graphed_loss is not None:
                    loss = t.graphed_loss(x, y)  # overwritten by the next pass
                else:
                    with t.runtime.autocast:
                        _, loss = t.step_model(x, y)
                total += loss.float() * n
                left -= n
                done += n
                if on_batch is not None and not on_batch(done):
                    return None
            # One read-back per split and evaluation, by design: the mean is
            # printed and decides whether to checkpoint.
            means[name] = total.item() / t.cfg.eval_iters
    finally:
        if t.graphed_loss is not None:
            t.graphed_loss.release()  # its memory is training's again
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
            "seconds": t.seconds(),
            "eval_seconds": sorted(t.eval_seconds.items()),
            "log_seconds": sorted(t.log_seconds.items()),
        },
        path,
    )
    return path


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
    total = 2 * t.cfg.eval_iters
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
    total = iters_left * step + evaluations * 2 * cfg.eval_iters * batch_seconds
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
        f" {evaluations} evaluations of {2 * cfg.eval_iters} batches) about"
        f" {duration(total)}; {change}, or fewer --max_iters (now"
        f" {cfg.max_iters}), or a GPU"
    )


@dataclass
class TrainResult:
    iter_num: int
    losses: list[tuple[int, float]]  # (iteration, train loss) at log steps
    evals: list[tuple[int, float, float]]  # (iteration, train, val)
    checkpoint: Path | None
    ms_per_iter: float | None
    stopped_by: str = ""  # SIGINT or SIGTERM when a signal ended the run early
    stop_reason: str = ""  # why patience or target_val_loss ended it early
    # (iteration, val loss, seconds into the run) of the lowest val loss
    best: tuple[int, float, float | None] | None = None


def train(
    cfg: Config, stream: TextIO | None = None, typed: frozenset[str] | None = None
) -> TrainResult:
    """Train from scratch or resume, as `cfg` says; return what happened.

    `typed`: the settings given on the command line, for resuming (the others
    come from the checkpoint); None: all of `cfg` is the request.
    Under torchrun (WORLD_SIZE > 1 in the environment) this is one of the
    processes of a DistributedDataParallel run; only rank 0 prints.
    """
    dist = distributed.from_env()
    device = distributed.device_for(
        cfg.device, dist, mps_available(), torch.cuda.device_count()
    )
    if device != cfg.device:
        cfg = replace_config(cfg, device=device)
    # Before anything slow: where the run writes, and whose checkpoint is there.
    ensure_writable(cfg.out_dir, "out_dir")
    earlier = runs.refuse_overwrite(cfg) if cfg.init_from == "scratch" else None
    with contextlib.ExitStack() as stack:
        if not dist.is_main:
            stream = stack.enter_context(open(os.devnull, "w"))
        progress = Progress(cfg.max_iters, stream or sys.stdout)
        stack.enter_context(distributed.process_group(dist, pick_device(cfg.device)))
        began = time.perf_counter()  # the run's clock includes loading and compiling
        t = setup(cfg, log=progress.print, dist=dist, typed=typed)
        t.started = began
        progress.total = t.cfg.max_iters
        if earlier is not None and dist.is_main:
            runs.remove_previous(t.cfg.out_dir, earlier, progress.print)
        if t.iter_num >= t.cfg.max_iters > 0 and dist.is_main:
            progress.print(
                f"the run is complete (iteration {t.iter_num} of max_iters="
                f"{t.cfg.max_iters}); to train on, pass --max_iters=N"
                f" --allow_changes=max_iters (and --lr_decay_iters="
                f"{t.cfg.lr_decay_steps} to keep the learning-rate schedule)"
            )
        stop = stack.enter_context(
            runs.StopSignal(announce=dist.is_main, repeat_quits=not dist.enabled)
        )
        with cuda_fast_matmul(t.runtime.device):
            result = _loop(t, progress, stop)
        # DDP's reducer holds the process group: it goes first, as PyTorch's
        # shutdown notes ask (a gloo rank outliving it aborted at exit, rarely)
        del t
        gc.collect()
    return result


def _loop(t: Trainer, progress: Progress, stop: runs.StopSignal) -> TrainResult:
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
    saved_at = start  # the iteration out_dir's checkpoint holds (resumed: start)
    ms_per_iter = None
    measured = False  # the device's speed is timed in the first evaluation
    agreed = False  # under torchrun: every rank has heard the stop signal
    reason = ""  # why patience or target_val_loss stopped the run
    early = cfg.patience > 0 or cfg.target_val_loss > 0
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
                on_batch = evaluation_progress(t, progress, it, stop, not measured)
                measured = True
                losses = evaluate(t, on_batch)
                if losses is not None:
                    t.evals.append((it, losses["train"], losses["val"]))
                    t.eval_seconds[it] = t.seconds()
                    progress.print(
                        f"step {it}: train loss {losses['train']:.4f},"
                        f" val loss {losses['val']:.4f}"
                    )
                    improved = losses["val"] < t.best_val_loss
                    t.best_val_loss = min(t.best_val_loss, losses["val"])
                    if it > 0 and (improved or cfg.always_save_checkpoint):
                        saved, saved_at = save(t, streams), it
                    reason = report.early_stop(cfg, t.evals) if early else ""
            if early:  # rank 0 decides; every rank stops at the same iteration
                reason = distributed.broadcast(reason, t.dist)
            last_time, last_iter = time.perf_counter(), it
        if it >= cfg.max_iters:
            break
        if reason:
            if t.dist.is_main:
                progress.print(_stopped_early(t, reason, saved_at))
            break
        # Checked between steps: an attribute read, nothing on the device.
        if agreed if t.dist.enabled else stop.signum:
            saved = _save_on_stop(t, progress, stop, saved, saved_at)
            break
        lr = lr_at(cfg, it)
        for group in t.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon's: muon_lr's share
        loss = train_step(t)
        t.iter_num += 1
        if it % cfg.log_interval == 0 or t.iter_num == cfg.max_iters:
            # The one host read, every log_interval steps (the mean over ranks;
            # under torchrun the same collective tells whether any rank stops).
            if t.dist.enabled:
                value, agreed = distributed.mean_and_any(loss, stop.signum > 0, t.dist)
            else:
                value = loss.item()
            now = time.perf_counter()
            seconds = (now - last_time) / (t.iter_num - last_iter)
            last_time, last_iter = now, t.iter_num
            ms_per_iter = 1000 * seconds
            # Logged as the iteration this step ran (0 is the first): the same
            # number in the log, in loss.csv and in a resumed run.
            t.losses.append((it, value))
            t.log_seconds[it] = t.seconds()
            progress.update(it, value, ms_per_iter, t.mfu(seconds))
    progress.complete(t.iter_num)
    progress.close()
    if t.dist.is_main:
        _report(t, progress, start)
    return TrainResult(
        t.iter_num, t.losses, t.evals, saved, ms_per_iter, stopped_by=stop.name,
        stop_reason=reason, best=report.best_eval(t.evals, t.eval_seconds),
    )  # fmt: skip


def _stopped_early(t: Trainer, reason: str, saved_at: int) -> str:
    """The line that says why the run stopped before max_iters and what it kept."""
    kept = ""
    if checkpoint.path_in(t.cfg.out_dir).is_file():
        kept = f"; the checkpoint holds iteration {saved_at}"
    return f"stopped at iteration {t.iter_num} of {t.cfg.max_iters}: {reason}{kept}"


def _save_on_stop(
    t: Trainer,
    progress: Progress,
    stop: runs.StopSignal,
    saved: Path | None,
    saved_at: int,
) -> Path | None:
    """Checkpoint where a signal stopped the run and say how to resume it."""
    streams = distributed.gather(
        (t.batches.state_dict(), rng_state(t.runtime.device)), t.dist
    )
    if not t.dist.is_main:
        return saved
    it = t.iter_num
    path = checkpoint.path_in(t.cfg.out_dir)
    if it == 0:
        progress.print(f"stopped by {stop.name} before the first step: nothing to save")
        return saved
    if saved_at != it:
        saved = save(t, streams)
    progress.print(
        f"stopped by {stop.name} at iteration {it} of {t.cfg.max_iters}: checkpoint"
        f" {path}; resume with `{runs.resume_hint(t.cfg)}`"
    )
    return saved


def _report(t: Trainer, progress: Progress, start: int) -> None:
    if not t.losses and not t.evals:
        return  # stopped before anything was measured: no empty files
    out_dir = Path(t.cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ran = [loss for it, loss in t.losses if it >= start]
    if ran:
        progress.print(
            f"trained iterations {start}..{t.iter_num}: loss {ran[0]:.4f} ->"
            f" {ran[-1]:.4f}"
        )
    best = report.best_eval(t.evals, t.eval_seconds)
    if best is not None:
        it, val, seconds = best
        when = f", {seconds:.1f} s into the run" if seconds is not None else ""
        progress.print(f"best val loss {val:.4f} at iteration {it}{when}")
    csv_path = out_dir / "loss.csv"
    report.write_loss_csv(csv_path, t.losses, t.evals, t.log_seconds, t.eval_seconds)
    if t.cfg.plot:
        png = out_dir / "loss.png"
        progress.print(report.plot_losses(t.losses, t.evals, png, csv_path))
    if checkpoint.path_in(out_dir).is_file():
        progress.print(f"checkpoint: {checkpoint.path_in(out_dir)}")
