#!/usr/bin/env python3
"""Speed of the generated project's training loop, next to a nanoGPT-style loop.

    python benchmarks/train_speed.py --preset=shakespeare_char --iters=300
    python benchmarks/train_speed.py --preset=tiny --device=cpu --iters=60 --warmup=10

Bakes the template (cookiecutter) into a temporary folder, or uses an already
baked project (--project=PATH, for machines without cookiecutter), prepares the
embedded Shakespeare, and runs `--iters` optimizer steps of the generated
project's own loop (its `train_step`, the learning-rate schedule, a loss read
every `log_interval` steps, exactly as `train._loop` does, without evaluations)
for each configuration: eager, compiled and, with --modes, other torch.compile
modes. `--baseline` adds the same steps of a loop written like nanoGPT's
train.py and model.py (per-step batches from a np.memmap, pinned and copied to
the GPU, the next batch fetched during the forward pass, GradScaler calls, the
loss divided by gradient_accumulation_steps, gradient clipping, positions made
by torch.arange every forward, `loss.item()` every log_interval): the Nano*
classes below are a re-implementation of nanoGPT's behaviour, written from its
documented facts, not a copy of its code.

`--nanogpt=DIR` (with --baseline) measures the real thing from a user's nanoGPT
checkout DIR (model.py, train.py, configurator.py; this repository never ships
it): the baseline loop additionally runs with DIR/model.py's own `GPT`,
`GPTConfig` and `GPT.configure_optimizers` (imported by path), timed exactly
like the template; and DIR/train.py itself runs as a subprocess, on the same
prepared corpus written in nanoGPT's format (data/<dataset>/train.bin, val.bin
as uint16, meta.pkl with vocab_size, itos, stoi), with the preset's settings on
its command line (and config/train_<preset>.py first where DIR has one),
--eval_interval past the run, wandb off, once with the config's log_interval
(10) and once with --log_interval=1; the median of its printed `iter N: ...
time X ms` over N in warmup..iters is its figure (host wall clock per
iteration, nanoGPT's own method). The issue's anchor (nanoGPT's train.py on an
H100, torch 2.11, bf16: 15.2 ms eager, 12.6 ms compiled) is printed beside.
`--repeat=N` runs every configuration N times, even rounds in reverse order: a
host-bound loop (nanoGPT's, eager) varies by 1-3 ms from run to run on the lent
H100, so compare medians of several rounds, not one figure.

Per-iteration times: on CUDA from events recorded between iterations (no host
sync inside the loop; a host-bound loop shows its gaps), on the CPU from the
wall clock. The table gives the median over iterations warmup..iters, tokens/s
and MFU from that median, the mean logged loss over the last 50 iterations and
the loss at the last iteration, peak device memory and the allocated memory's
change between the first and last logged step after warmup (growth).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import math
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

REPO = Path(__file__).resolve().parent.parent
ANCHOR_MS = {"eager": 15.2, "compiled": 12.6}  # issue 7, measured on the lent H100
ANCHOR_NOTE = "nanoGPT train.py, H100, torch 2.11, bf16 (issue 7's anchor)"


# --------------------------------------------------------------------- the project
def bake(preset: str, out: Path) -> Path:
    try:
        from cookiecutter.main import cookiecutter
    except ImportError:
        sys.exit(
            "cookiecutter is not installed: pip install cookiecutter, or pass"
            " --project=PATH of an already baked project"
        )
    return Path(
        cookiecutter(
            str(REPO / "template"),
            no_input=True,
            output_dir=str(out),
            extra_context={"project_name": "Speed GPT", "preset": preset},
        )
    )


def load_package(project: Path) -> SimpleNamespace:
    inits = sorted((project / "src").glob("*/__init__.py"))
    if len(inits) != 1:
        sys.exit(f"{project}/src should hold one package, found {inits}")
    name = inits[0].parent.name
    sys.path.insert(0, str(project / "src"))
    return SimpleNamespace(
        name=name,
        **{
            m: importlib.import_module(f"{name}.{m}")
            for m in ("config", "data", "device", "train", "trainer", "optim", "model")
        },
    )


# --------------------------------------------------------------------- timing
class Clock:
    """Marks between iterations; CUDA events on a GPU, the wall clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def durations_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            pairs = zip(self.marks, self.marks[1:], strict=False)
            return [a.elapsed_time(b) for a, b in pairs]
        return [
            1000 * (b - a) for a, b in zip(self.marks, self.marks[1:], strict=False)
        ]


def allocated(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    try:  # the process's resident set, Linux
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf(
            "SC_PAGE_SIZE"
        )
    except (OSError, ValueError):
        return 0


def run_loop(
    device: torch.device,
    iters: int,
    log_interval: int,
    set_lr: Callable[[int], None],
    step: Callable[[], torch.Tensor],
    warmup: int,
    loss_scale: float = 1.0,
) -> dict[str, Any]:
    """`iters` steps, timed per iteration; the loss read every log_interval steps."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    clock = Clock(device)
    losses: dict[int, float] = {}
    memory: dict[int, int] = {}
    wall = time.perf_counter()
    for it in range(iters):
        clock.mark()
        set_lr(it)
        loss = step()
        if (it + 1) % log_interval == 0 or it + 1 == iters:
            losses[it + 1] = loss.item() * loss_scale
            memory[it + 1] = allocated(device)
    clock.mark()
    times = clock.durations_ms()
    wall = time.perf_counter() - wall
    timed = times[warmup:]
    after = {it: m for it, m in memory.items() if it > warmup}
    first, last = after[min(after)], after[max(after)]
    tail = [v for it, v in losses.items() if it > iters - 50]
    return {
        "ms_per_iter": statistics.median(timed),
        "ms_mean": statistics.fmean(timed),
        "timed_iters": f"{warmup}..{iters}",
        "wall_s": wall,
        "loss_last": losses[iters],
        "loss_tail_mean": statistics.fmean(tail),
        "losses": losses,
        "peak_memory_mib": (
            torch.cuda.max_memory_allocated(device) / 2**20
            if device.type == "cuda"
            else None
        ),
        "memory_growth_mib": (last - first) / 2**20,
    }


def template_config(pkg: SimpleNamespace, args: argparse.Namespace, **changes: Any):
    base = pkg.config.Config.for_preset(args.preset, "nanogpt")  # AdamW, as nanoGPT
    return pkg.config.replace(
        base,
        data_dir=str(args.data_dir),
        device=args.device,
        dtype=args.dtype,
        max_iters=args.schedule_iters,
        plot=False,
        **changes,
    )


def run_template(pkg, args, compile: str, mode: str) -> dict[str, Any]:
    cfg = template_config(pkg, args, compile=compile, compile_mode=mode)
    t = pkg.trainer.setup(cfg, log=lambda _: None)

    def set_lr(it: int) -> None:
        lr = pkg.optim.lr_at(cfg, it)
        for group in t.optimizer.param_groups:
            group["lr"] = lr

    with pkg.device.cuda_fast_matmul(t.runtime.device):
        result = run_loop(
            t.runtime.device,
            args.iters,
            cfg.log_interval,
            set_lr,
            lambda: pkg.train.train_step(t),
            args.warmup,
        )
    seconds = result["ms_per_iter"] / 1000
    result.update(
        tokens_per_s=t.tokens_per_iter / seconds,
        mfu=t.mfu(seconds),
        runtime=t.runtime.describe(),
        params_m=t.model.num_params() / 1e6,
    )
    return result


# --------------------------------------------------------- a nanoGPT-style loop
# nanoGPT's model.py and train.py, re-typed from their documented behaviour
# (the repository cannot be fetched here): same shapes, same per-step work.
class NanoLayerNorm(nn.Module):
    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoAttention(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.attn_dropout = nn.Dropout(c.dropout)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.n_head, self.n_embd, self.dropout = c.n_head, c.n_embd, c.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None,
            dropout_p=self.dropout if self.training else 0,
            is_causal=True,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class NanoMLP(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class NanoBlock(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.ln_1 = NanoLayerNorm(c.n_embd, bias=c.bias)
        self.attn = NanoAttention(c)
        self.ln_2 = NanoLayerNorm(c.n_embd, bias=c.bias)
        self.mlp = NanoMLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(c.vocab_size, c.n_embd),
                wpe=nn.Embedding(c.block_size, c.n_embd),
                drop=nn.Dropout(c.dropout),
                h=nn.ModuleList([NanoBlock(c) for _ in range(c.n_layer)]),
                ln_f=NanoLayerNorm(c.n_embd, bias=c.bias),
            )
        )
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
        )
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {
                "params": [p for p in params if p.dim() >= 2],
                "weight_decay": weight_decay,
            },
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        fused = "fused" in inspect.signature(torch.optim.AdamW).parameters
        extra = {"fused": True} if fused and device_type == "cuda" else {}
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)


def load_nanogpt_model(folder: Path):
    """DIR/model.py of a nanoGPT checkout, imported by path (its GPT, GPTConfig)."""
    path = Path(folder) / "model.py"
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    if spec is None or spec.loader is None:
        sys.exit(f"--nanogpt: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_baseline(pkg, args, compile: bool, real: bool = False) -> dict[str, Any]:
    """nanoGPT's train.py loop with the same preset, on the same prepared data.

    real: the model and optimizer from --nanogpt's model.py instead of Nano*.
    """
    cfg = template_config(pkg, args)
    device = pkg.device.pick_device(cfg.device)
    dtype = pkg.device.pick_dtype(device, cfg.dtype)
    folder = Path(cfg.data_dir) / cfg.dataset
    meta = json.loads((folder / "meta.json").read_text())
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device_type = "cuda" if device.type == "cuda" else "cpu"  # nanoGPT's rule
    ctx = (
        contextlib.nullcontext()
        if device_type == "cpu"
        else torch.amp.autocast(device_type=device_type, dtype=dtype)
    )

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        data = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - cfg.block_size, (cfg.batch_size,))
        x = torch.stack(
            [
                torch.from_numpy(data[i : i + cfg.block_size].astype(np.int64))
                for i in ix
            ]
        )
        y = torch.stack(
            [
                torch.from_numpy(data[i + 1 : i + 1 + cfg.block_size].astype(np.int64))
                for i in ix
            ]
        )
        if device_type == "cuda":
            return (
                x.pin_memory().to(device, non_blocking=True),
                y.pin_memory().to(device, non_blocking=True),
            )
        return x.to(device), y.to(device)

    # the template's model shape (GPT-2 BPE padded to 50304, as nanoGPT does)
    gpt_config = pkg.trainer.model_config(cfg, meta["tokenizer"])
    shape = SimpleNamespace(**gpt_config.to_dict())
    if real:
        nanogpt = load_nanogpt_model(args.nanogpt)
        with contextlib.redirect_stdout(io.StringIO()):  # its parameter-count prints
            model = nanogpt.GPT(nanogpt.GPTConfig(**vars(shape))).to(device)
    else:
        model = NanoGPT(shape).to(device)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == torch.float16))
    with contextlib.redirect_stdout(io.StringIO()):
        optimizer = model.configure_optimizers(
            cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type
        )
    step_model = torch.compile(model) if compile else model
    accum = cfg.gradient_accumulation_steps
    batch = [get_batch()]

    def set_lr(it: int) -> None:
        lr = pkg.optim.lr_at(cfg, it)  # the same warmup-cosine schedule as nanoGPT
        for group in optimizer.param_groups:
            group["lr"] = lr

    def step() -> torch.Tensor:
        X, Y = batch[0]
        for _ in range(accum):
            with ctx:
                _, loss = step_model(X, Y)
                loss = loss / accum
            X, Y = batch[0] = get_batch()  # fetched while the GPU runs the forward
            scaler.scale(loss).backward()
        if cfg.grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss  # nanoGPT scales by accum on the host, after .item()

    result = run_loop(
        device, args.iters, cfg.log_interval, set_lr, step, args.warmup, accum
    )
    seconds = result["ms_per_iter"] / 1000
    tokens = cfg.batch_size * cfg.block_size * accum
    peak = pkg.device.peak_flops(device, dtype)
    gpt = pkg.model.GPT(pkg.trainer.model_config(cfg, meta["tokenizer"]))
    result.update(
        tokens_per_s=tokens / seconds,
        mfu=None if peak is None else gpt.flops_per_token() * tokens / seconds / peak,
        runtime=f"{device}, {str(dtype).removeprefix('torch.')},"
        f" {'nanoGPT model.py' if real else 'nanoGPT-style'}",
        params_m=gpt.num_params() / 1e6,
    )
    return result


# ------------------------------------------------------- nanoGPT's own train.py
NANOGPT_LINE = re.compile(r"^iter (\d+): loss ([-+\d.eE]+|nan), time ([\d.]+)ms")


def write_nanogpt_data(folder: Path, target: Path) -> int:
    """The prepared dataset in nanoGPT's format: train.bin, val.bin, meta.pkl."""
    meta = json.loads((folder / "meta.json").read_text())
    tokenizer = meta["tokenizer"]
    target.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):  # both are raw uint16 token ids already
        shutil.copyfile(folder / f"{split}.bin", target / f"{split}.bin")
    nano_meta: dict[str, Any] = {"vocab_size": int(tokenizer["vocab_size"])}
    if tokenizer.get("kind") == "char":
        chars = tokenizer["chars"]
        nano_meta["itos"] = dict(enumerate(chars))
        nano_meta["stoi"] = {c: i for i, c in enumerate(chars)}
    with open(target / "meta.pkl", "wb") as f:
        pickle.dump(nano_meta, f)
    return nano_meta["vocab_size"]


def run_nanogpt_train(pkg, args, compile: bool, log_interval: int) -> dict[str, Any]:
    """DIR/train.py as a subprocess; the median of its printed per-iteration times."""
    cfg = template_config(pkg, args)
    device = pkg.device.pick_device(cfg.device)
    dtype = pkg.device.pick_dtype(device, cfg.dtype)
    work = Path(tempfile.mkdtemp(prefix="nanogpt-run-", dir=args.data_dir.parent))
    try:
        return _nanogpt_train_in(
            work, pkg, args, cfg, device, dtype, compile, log_interval
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)  # a failed run leaves nothing either


def _nanogpt_train_in(
    work: Path, pkg, args, cfg, device, dtype, compile: bool, log_interval: int
) -> dict[str, Any]:
    source = Path(args.nanogpt)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copyfile(source / name, work / name)
    write_nanogpt_data(Path(cfg.data_dir) / cfg.dataset, work / "data" / cfg.dataset)
    command = [sys.executable, "train.py"]
    config_file = source / "config" / f"train_{args.preset}.py"
    if config_file.is_file():  # nanoGPT's own config first, as the anchor ran
        (work / "config").mkdir()
        shutil.copyfile(config_file, work / "config" / config_file.name)
        command.append(f"config/{config_file.name}")
    settings = {  # the preset's run, spelled out (configurator.py checks the types)
        "dataset": cfg.dataset,
        "batch_size": cfg.batch_size,
        "block_size": cfg.block_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_embd": cfg.n_embd,
        "dropout": float(cfg.dropout),
        "bias": bool(cfg.bias),
        "learning_rate": float(cfg.learning_rate),
        "min_lr": float(cfg.min_lr),
        "warmup_iters": cfg.warmup_iters,
        "lr_decay_iters": cfg.lr_decay_steps,
        "weight_decay": float(cfg.weight_decay),
        "beta1": float(cfg.beta1),
        "beta2": float(cfg.beta2),
        "grad_clip": float(cfg.grad_clip),
        "max_iters": args.iters,
        "eval_interval": 10 * args.iters + 1000,  # only the evaluation at iter 0
        "eval_iters": cfg.eval_iters,
        "log_interval": log_interval,
        "always_save_checkpoint": False,
        "wandb_log": False,
        "out_dir": "out",
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "compile": compile,
    }
    command += [f"--{key}={value}" for key, value in settings.items()]
    begun = time.perf_counter()
    proc = subprocess.run(
        command,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=args.nanogpt_timeout_s,
        check=False,
    )
    wall = time.perf_counter() - begun
    lines = [NANOGPT_LINE.match(line) for line in proc.stdout.splitlines()]
    points = {int(m[1]): (float(m[2]), float(m[3])) for m in lines if m}
    if proc.returncode != 0 or not points:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"train.py exited {proc.returncode}; output tail:\n{tail}")
    timed = [ms for it, (_, ms) in points.items() if args.warmup <= it < args.iters]
    last = max(it for it in points if it < args.iters)
    tail_losses = [
        v for it, (v, _) in points.items() if args.iters - 50 <= it < args.iters
    ]
    median = statistics.median(timed)
    tokens = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps
    peak = pkg.device.peak_flops(device, dtype)
    meta = json.loads((Path(cfg.data_dir) / cfg.dataset / "meta.json").read_text())
    gpt = pkg.model.GPT(pkg.trainer.model_config(cfg, meta["tokenizer"]))
    return {
        "ms_per_iter": median,
        "ms_mean": statistics.fmean(timed),
        "timed_iters": f"{args.warmup}..{args.iters} ({len(timed)} printed)",
        "wall_s": wall,
        "loss_last": points[last][0],
        "loss_last_iter": last + 1,  # steps done when that loss was computed
        "loss_tail_mean": statistics.fmean(tail_losses),
        "losses": {it + 1: v for it, (v, _) in points.items()},
        "peak_memory_mib": None,
        "memory_growth_mib": None,
        "tokens_per_s": tokens / (median / 1000),
        "mfu": None
        if peak is None
        else gpt.flops_per_token() * tokens / (median / 1000) / peak,
        "runtime": f"nanoGPT train.py, {device}, {settings['dtype']}, host clock,"
        f" log_interval={log_interval}",
        "params_m": gpt.num_params() / 1e6,
        "command": " ".join(command[1:]),
    }


# --------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="shakespeare_char")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument(
        "--warmup", type=int, default=50, help="iterations left out of the median"
    )
    parser.add_argument(
        "--schedule_iters",
        type=int,
        default=5000,
        help="max_iters of the lr schedule (the preset's run)",
    )
    parser.add_argument(
        "--configs",
        default="eager,compiled",
        help="comma list: eager, compiled, reduce-overhead, max-autotune-no-cudagraphs",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also run the nanoGPT-style loop, eager and compiled",
    )
    parser.add_argument(
        "--nanogpt",
        type=Path,
        help="a nanoGPT checkout: with --baseline, also time its model.py in the"
        " baseline loop and run its train.py (never shipped here)",
    )
    parser.add_argument(
        "--nanogpt_log_intervals",
        default="10,1",
        help="comma list: a train.py run for each of these log_interval values",
    )
    parser.add_argument(
        "--nanogpt_timeout_s",
        type=float,
        default=480,
        help="limit for one train.py subprocess",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every configuration this many times, even rounds in reverse order",
    )
    parser.add_argument("--project", type=Path, help="an already baked project")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument(
        "--budget_s",
        type=float,
        default=0,
        help="skip configurations once this many seconds passed",
    )
    args = parser.parse_args(argv)
    if args.iters <= args.warmup + 1:
        parser.error(f"--iters={args.iters} must exceed --warmup={args.warmup} + 1")
    if args.nanogpt is not None:
        missing = [
            name
            for name in ("model.py", "train.py", "configurator.py")
            if not (args.nanogpt / name).is_file()
        ]
        if missing:
            parser.error(f"--nanogpt={args.nanogpt} lacks {', '.join(missing)}")
        args.nanogpt = args.nanogpt.resolve()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        project = args.project or bake(args.preset, Path(tmp))
        pkg = load_package(project)
        args.data_dir = Path(tmp) / "data"
        prep = template_config(pkg, args)
        pkg.data.prepare(prep, log=lambda _: None)
        runs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        for name in args.configs.split(","):
            if name == "eager":
                runs.append(
                    (
                        "template eager",
                        lambda: run_template(pkg, args, "false", "default"),
                    )
                )
            elif name == "compiled":
                runs.append(
                    (
                        "template compiled",
                        lambda: run_template(pkg, args, "true", "default"),
                    )
                )
            else:
                runs.append(
                    (
                        f"template {name}",
                        lambda m=name: run_template(pkg, args, "true", m),
                    )
                )
            if args.baseline and name in ("eager", "compiled"):
                compiled = name == "compiled"
                runs.append(
                    (
                        f"nanoGPT-style {name}",
                        lambda c=compiled: run_baseline(pkg, args, c),
                    )
                )
                if args.nanogpt is not None:
                    runs.append(
                        (
                            f"nanoGPT model.py {name}",
                            lambda c=compiled: run_baseline(pkg, args, c, real=True),
                        )
                    )
                    for interval in args.nanogpt_log_intervals.split(","):
                        runs.append(
                            (
                                f"nanoGPT train.py {name} log{int(interval)}",
                                lambda c=compiled, i=int(interval): run_nanogpt_train(
                                    pkg, args, c, i
                                ),
                            )
                        )
        rounds = list(runs)
        for k in range(2, args.repeat + 1):  # later rounds reversed: order effects
            order = runs[::-1] if k % 2 == 0 else runs
            rounds += [(f"{label} #{k}", fn) for label, fn in order]
        results: dict[str, Any] = {}
        for label, fn in rounds:
            if args.budget_s and time.perf_counter() - started > args.budget_s:
                print(f"{label}: skipped, past --budget_s={args.budget_s}", flush=True)
                continue
            begun = time.perf_counter()
            try:
                results[label] = fn()
            except Exception as exc:  # report, and go on with the next config
                traceback.print_exc()
                results[label] = {"error": f"{type(exc).__name__}: {exc}"}
            results[label]["total_s"] = time.perf_counter() - begun
            print(f"{label}: {summary(results[label])}", flush=True)
            if args.json:  # after every configuration: a later one may not finish
                write_json(args.json, results)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        print_table(results, args, pkg)
    return 0


def write_json(path: Path, results: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str))
    os.replace(tmp, path)


def summary(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "unknown"
    peak = r["peak_memory_mib"]
    growth = r["memory_growth_mib"]
    return (
        f"{r['ms_per_iter']:.2f} ms/iter (median; mean {r['ms_mean']:.2f}),"
        f" {r['tokens_per_s']:,.0f} tok/s, MFU {mfu}, loss {r['loss_last']:.4f}"
        f" (last-50 mean {r['loss_tail_mean']:.4f}), peak"
        f" {'-' if peak is None else f'{peak:.0f} MiB'}, growth"
        f" {'-' if growth is None else f'{growth:+.1f} MiB'};"
        f" {r['total_s']:.0f} s incl. compile"
        f" [{r['runtime']}]"
    )


def print_table(results: dict[str, Any], args: argparse.Namespace, pkg) -> None:
    device = pkg.device.pick_device(args.device)
    print(
        f"\npreset {args.preset} on {pkg.device.device_name(device)} ({device}),"
        f" torch {torch.__version__}; median ms/iter over iterations"
        f" {args.warmup}..{args.iters}"
    )
    head = (
        "config",
        "ms/iter",
        "x anchor",
        "tok/s",
        "MFU",
        "loss@end",
        "loss last50",
        "peak MiB",
        "growth MiB",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, r in results.items():
        if "error" in r:
            print(f"| {label} | error: {r['error'][:80]} |")
            continue
        kind = "eager" if "eager" in label else "compiled"
        ratio = r["ms_per_iter"] / ANCHOR_MS[kind] if device.type == "cuda" else None
        cells = (
            label,
            f"{r['ms_per_iter']:.2f}",
            f"{ratio:.2f}" if ratio is not None else "-",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['mfu']:.1%}" if r["mfu"] is not None else "unknown",
            f"{r['loss_last']:.4f}"
            + (f" @{r['loss_last_iter']}" if "loss_last_iter" in r else ""),
            f"{r['loss_tail_mean']:.4f}",
            f"{r['peak_memory_mib']:.0f}" if r["peak_memory_mib"] is not None else "-",
            "-" if r["memory_growth_mib"] is None else f"{r['memory_growth_mib']:+.1f}",
        )
        print("| " + " | ".join(cells) + " |")
    for kind in ("eager", "compiled"):
        mine = results.get(f"template {kind}", {}).get("ms_per_iter")
        others = [
            (label, r["ms_per_iter"])
            for label, r in results.items()
            if label.startswith("nanoGPT")
            and "#" not in label
            and kind in label.split()
            and "ms_per_iter" in r
        ]
        if mine is not None and others:
            print(
                f"template {kind} / "
                + "; ".join(f"{label}: {mine / ms:.2f}x" for label, ms in others)
            )
    if device.type == "cuda":
        print(
            f"anchor: {ANCHOR_MS['eager']} ms eager, {ANCHOR_MS['compiled']} ms"
            f" compiled ({ANCHOR_NOTE}); 'x anchor' = ms/iter / anchor (goal <= 0.90)"
        )
    else:
        print("growth: resident memory (RSS) on the CPU; peak device memory: n/a")


if __name__ == "__main__":
    sys.exit(main())
