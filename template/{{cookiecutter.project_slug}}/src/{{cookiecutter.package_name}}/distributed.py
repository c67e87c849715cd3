"""Several processes, one model: DistributedDataParallel under torchrun.

`torchrun --standalone --nproc_per_node=N -m {{ cookiecutter.package_name }} train`
starts N processes and tells each its RANK, LOCAL_RANK and WORLD_SIZE through the
environment. Each process takes one GPU (NCCL) or runs on the CPU (gloo), does
gradient_accumulation_steps / N of the micro-batches of every optimizer step, and
DDP averages the gradients; the global batch is the same as one process's. Rank 0
alone logs, evaluates, samples and writes checkpoints. MPS has no multi-process
backend, and a Mac has one GPU: asking for several processes there is refused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from .errors import ConfigError, DeviceError

ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class Dist:
    """This process's place among the training processes (one process: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env(environ: Mapping[str, str] | None = None) -> Dist:
    """Read torchrun's RANK, LOCAL_RANK and WORLD_SIZE; absent means one process."""
    environ = os.environ if environ is None else environ
    values = {}
    for name in ENV_VARS:
        text = environ.get(name, "1" if name == "WORLD_SIZE" else "0")
        try:
            values[name] = int(text)
        except ValueError:
            raise ConfigError(
                f"environment variable {name}={text!r} is not an integer"
                " (torchrun sets it; unset it to train in one process)"
            ) from None
    rank, local_rank, world = values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"]
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        raise ConfigError(
            f"environment RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world}"
            " do not describe a process group (need 0 <= RANK < WORLD_SIZE)"
        )
    return Dist(rank, local_rank, world)


def micro_steps(gradient_accumulation_steps: int, dist: Dist) -> int:
    """This process's share of the micro-batches of one optimizer step."""
    if gradient_accumulation_steps % dist.world_size:
        per_process = max(1, gradient_accumulation_steps // dist.world_size)
        suggestion = dist.world_size * per_process
        raise ConfigError(
            f"gradient_accumulation_steps={gradient_accumulation_steps} is not"
            f" divisible by WORLD_SIZE={dist.world_size} (the number of processes"
            " torchrun started): each process does an equal share of the"
            f" micro-batches; pass --gradient_accumulation_steps={suggestion}"
            " or start another number of processes"
        )
    return gradient_accumulation_steps // dist.world_size


def device_for(setting: str, dist: Dist, mps_available: bool, cuda_count: int) -> str:
    """The --device a process of `dist` uses: its own GPU, or the CPU.

    One process keeps the setting as it is. Several take cuda:LOCAL_RANK for
    auto or cuda, the CPU for cpu, and are refused MPS with the reason.
    """
    if not dist.enabled:
        return setting
    wants_mps = setting == "mps" or (setting == "auto" and mps_available)
    if wants_mps:
        raise DeviceError(
            f"WORLD_SIZE={dist.world_size} (from torchrun) asks for several"
            f" training processes, but --device={setting} means MPS, which has no"
            " multi-process backend (a Mac has one GPU): train in one process"
            " without torchrun, or pass --device=cpu to spread over CPU processes"
        )
    if setting.startswith("cuda:"):
        raise DeviceError(
            f"--device={setting}: under torchrun each process takes the GPU of its"
            " LOCAL_RANK; pass --device=cuda and choose GPUs with"
            " CUDA_VISIBLE_DEVICES"
        )
    if setting in ("auto", "cuda") and cuda_count > 0:
        if dist.local_rank >= cuda_count:
            raise DeviceError(
                f"LOCAL_RANK={dist.local_rank} has no GPU: this machine has"
                f" {cuda_count} CUDA device(s); start at most {cuda_count}"
                " processes per node (--nproc_per_node)"
            )
        return f"cuda:{dist.local_rank}"
    if setting == "cuda":
        raise DeviceError("--device=cuda: CUDA is not available here")
    return "cpu"


@contextlib.contextmanager
def process_group(dist: Dist, device: torch.device) -> Iterator[None]:
    """Join the process group for the run (NCCL on CUDA, gloo elsewhere)."""
    if not dist.enabled:
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch_dist.init_process_group("nccl", device_id=device)
    else:
        torch_dist.init_process_group("gloo")
    try:
        yield
        torch_dist.barrier()  # rank 0 may still be writing its last checkpoint
    finally:
        torch_dist.destroy_process_group()


def mean(value: torch.Tensor, dist: Dist) -> torch.Tensor:
    """The mean of a scalar over all processes (a collective: every rank calls it)."""
    if not dist.enabled:
        return value
    total = value.detach().float().clone()
    torch_dist.all_reduce(total)  # a sum: gloo has no average
    return total / dist.world_size


def mean_and_any(value: torch.Tensor, flag: bool, dist: Dist) -> tuple[float, bool]:
    """The mean of a scalar over all processes, and whether any process's `flag`
    is set, in one collective and one read (every rank calls it)."""
    loss = value.detach().float()
    both = torch.stack([loss, torch.full_like(loss, float(flag))])
    torch_dist.all_reduce(both)  # a sum: gloo has no average
    total, flags = both.tolist()
    return total / dist.world_size, flags > 0


def gather(obj: Any, dist: Dist) -> list[Any]:
    """Every rank's `obj`, in rank order (a collective: every rank calls it)."""
    if not dist.enabled:
        return [obj]
    out: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any, dist: Dist) -> Any:
    """Rank 0's `obj` on every rank (a collective: every rank calls it)."""
    if not dist.enabled:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]
