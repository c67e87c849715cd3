"""What a training run is made of: the `Trainer` and how `setup` builds it.

`setup` loads the dataset, picks the device and its dtype, builds the model
(compiled when asked), the optimizer and the batches, resumes from a checkpoint
where asked, and returns a `Trainer`; train.py's loop runs it.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from . import (
    checkpoint,
    compile_cache,
    distributed,
    eval_graph,
    optim,
    runs,
    train_graph,
)
from .config import Config
from .data import Batches, load_dataset
from .device import (
    Runtime,
    make_runtime,
    peak_flops,
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
    # evaluation passes as CUDA graphs of `model` (--eval_graph); None: step_model
    graphed_loss: eval_graph.GraphedLoss | None = None
    # training steps as one CUDA graph of `model` (--train_graph); None: eager
    graphed_step: train_graph.GraphedStep | None = None
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
    stepped = None
    if train_graph.check(cfg.train_graph, runtime.device, runtime.compile,
                         dist.world_size, scaler is not None):  # fmt: skip
        optim.make_capturable(optimizer, runtime.device)
        stepped = train_graph.GraphedStep()
    return Trainer(
        cfg, runtime, model, step_model, ddp, dist, micro_steps, optimizer, scaler,
        batches, splits, tokenizer_meta, compile_mode=compile_mode,
        graphed_loss=graphed, graphed_step=stepped,
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
        if trainer.graphed_step is not None:  # the loaded groups hold floats
            optim.make_capturable(trainer.optimizer, runtime.device)
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
