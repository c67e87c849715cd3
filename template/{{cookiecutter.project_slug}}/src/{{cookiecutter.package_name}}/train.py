"""The training loop: no framework, just the steps.

`setup` (trainer.py) builds a `Trainer` (model, optimizer, batches on the
device); the bar and the warnings it shows are in train_progress.py. Each iteration
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
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from . import checkpoint, distributed, report, runs
from .config import Config
from .config import replace as replace_config
from .data import Batches
from .device import (
    cuda_fast_matmul,
    device_name,
    mps_available,
    peak_flops,
    pick_device,
    rng_state,
)
from .files import ensure_writable
from .optim import lr_at, portable_state, set_lr
from .train_progress import Progress, evaluation_progress
from .trainer import Trainer, setup


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
    """Mean loss over each split's batches (eval_iters; eval_train_iters for the
    train split where set), from a fixed random stream.

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
            count = left = t.cfg.eval_batches(name)
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
            means[name] = total.item() / count
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
            "optimizer": portable_state(t.optimizer),
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
        set_lr(t.optimizer, lr_at(cfg, it))
        loss = t.graphed_step(t, train_step) if t.graphed_step else train_step(t)
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
