"""The optimizer: AdamW (nanoGPT's), or Muon for the blocks' matrices.

`--optimizer=muon` updates each 2-d weight inside the transformer blocks with
Muon (momentum, then the update's matrix made orthogonal by a few Newton-Schulz
iterations, as in modded-nanogpt and nanochat); the embeddings (tied with the
output layer), norms and biases keep AdamW. Both live in one torch Optimizer, so
checkpoints, resuming, gradient scaling and the learning-rate schedule treat it
as they treat AdamW. Muon's learning rate is `muon_lr` at the schedule's peak and
follows the same warmup and decay (each group's `lr_scale`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .config import Config
from .model import GPT

# The quintic Newton-Schulz coefficients of modded-nanogpt (Keller Jordan): five
# steps bring every singular value of the normalised update near 1.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def make(
    model: GPT,
    name: str,
    learning_rate: float,
    weight_decay: float,
    betas: tuple[float, float],
    muon_lr: float = 0.02,
    muon_momentum: float = 0.95,
) -> torch.optim.Optimizer:
    """The optimizer `name` (adamw or muon) for `model`, already on its device."""
    if name == "adamw":
        return model.make_optimizer(weight_decay, learning_rate, betas)
    blocks = {id(p) for p in model.blocks.parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    matrices = [p for p in params if p.dim() == 2 and id(p) in blocks]
    others = [p for p in params if id(p) not in {id(m) for m in matrices}]
    groups = [
        {"params": matrices, "kind": "muon", "lr": muon_lr,
         "lr_scale": muon_lr / learning_rate, "weight_decay": weight_decay},
        {"params": [p for p in others if p.dim() >= 2], "kind": "adamw",
         "weight_decay": weight_decay},
        {"params": [p for p in others if p.dim() < 2], "kind": "adamw",
         "weight_decay": 0.0},
    ]  # fmt: skip
    return MuonAdamW(groups, lr=learning_rate, betas=betas, momentum=muon_momentum)


def orthogonalize(update: torch.Tensor) -> torch.Tensor:
    """The nearest semi-orthogonal matrix to each matrix of `update` (the last two
    dimensions; a stack of matrices at once), roughly U V^T of its SVD.

    bfloat16 on CUDA, where tensor cores make it cheap and modded-nanogpt showed
    it is accurate enough; float32 on MPS and the CPU.
    """
    a, b, c = NS_COEFFICIENTS
    dtype = torch.bfloat16 if update.device.type == "cuda" else torch.float32
    x = update.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    # every singular value at most 1
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(NS_STEPS):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the groups of kind "muon", AdamW for those of kind "adamw".

    Each update is a few multi-tensor (foreach) operations per group, and Muon
    orthogonalises all matrices of one shape in one batched call: the step's
    kernel launches do not grow with the number of layers' tensors.
    """

    def __init__(
        self,
        groups: Iterable[dict[str, Any]],
        lr: float,
        betas: tuple[float, float],
        momentum: float = 0.95,
        eps: float = 1e-8,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "momentum": momentum, "eps": eps,
                    "weight_decay": 0.0, "lr_scale": 1.0}  # fmt: skip
        super().__init__(list(groups), defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            # a float, or a device tensor once make_capturable ran
            lr, decay = group["lr"], group["weight_decay"]
            if decay:  # decoupled weight decay, as AdamW's
                torch._foreach_mul_(params, 1 - lr * decay)
            if group["kind"] == "muon":
                self._muon(params, lr, group["momentum"])
            else:
                self._adamw(params, lr, group["betas"], group["eps"])
        return loss

    def _muon(
        self, params: list[torch.Tensor], lr: float | torch.Tensor, momentum: float
    ) -> None:
        grads = [p.grad for p in params]
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            bufs.append(state["momentum_buffer"])
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        nesterov = torch._foreach_lerp(grads, bufs, momentum)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        for shape, index in by_shape.items():
            updates = orthogonalize(torch.stack([nesterov[i] for i in index]))
            # An orthogonal update's entries shrink as the matrix widens: a tall
            # matrix (more outputs than inputs) gets them back (modded-nanogpt).
            scale = max(1.0, shape[0] / shape[1]) ** 0.5
            mine = [params[i] for i in index]
            updates = updates.to(mine[0].dtype)
            if isinstance(lr, torch.Tensor):  # alpha takes numbers only
                updates = updates * (-lr * scale)
                torch._foreach_add_(mine, list(updates.unbind()))
            else:
                torch._foreach_add_(mine, list(updates.unbind()), alpha=-lr * scale)

    def _adamw(
        self,
        params: list[torch.Tensor],
        lr: float | torch.Tensor,
        betas: tuple[float, float],
        eps: float,
    ) -> None:
        grads = [p.grad for p in params]
        # capturable (make_capturable): the step count lives on the device too;
        # once a tensor (a graphed run's checkpoint) it stays one: no read back
        on_device = isinstance(lr, torch.Tensor)
        for p in params:
            state = self.state[p]
            if "exp_avg" not in state:
                state["step"] = 0  # a Python int: no tensor on the host per step
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            step = state["step"]
            if isinstance(step, torch.Tensor) and step.device != p.device:
                state["step"] = step.to(p.device)
            elif on_device and not isinstance(step, torch.Tensor):
                state["step"] = torch.tensor(float(step), device=p.device)
            state["step"] += 1
        states = [self.state[p] for p in params]
        step = states[0]["step"]  # one group's tensors step together
        beta1, beta2 = betas
        exp_avg = [st["exp_avg"] for st in states]
        exp_avg_sq = [st["exp_avg_sq"] for st in states]
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        denom = torch._foreach_div(exp_avg_sq, 1 - beta2**step)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, eps)
        if isinstance(step, torch.Tensor):  # addcdiv's value takes numbers only
            update = torch._foreach_div(exp_avg, denom)
            torch._foreach_mul_(update, -lr / (1 - beta1**step))
            torch._foreach_add_(params, update)
        else:
            step_size = -lr / (1 - beta1**step)
            torch._foreach_addcdiv_(params, exp_avg, denom, value=step_size)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate for this step: `lr` times its `lr_scale` (Muon's
    share), written into the device tensor where make_capturable put one."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_scale", 1.0)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
            group["lr_number"] = value  # for checkpoints: no read from the device
        else:
            group["lr"] = value


def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Keep `optimizer`'s learning rates and step counts on `device`, so that a
    step recorded in a CUDA graph reads each replay's values (train_graph.py)."""
    for group in optimizer.param_groups:
        number = group.get("lr_number", group["lr"])
        group["lr_number"] = number = float(number)
        group["lr"] = torch.tensor(number, device=device)
        if isinstance(optimizer, torch.optim.AdamW):  # the fused kernel's too
            group["capturable"] = True
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[p]["step"] = step.to(device)


def portable_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` as a run without graphs loads it, on any device:
    learning rates as numbers (the ones set_lr wrote, not read back from the
    device), AdamW's `capturable` off (make_capturable sets them again when the
    loading run graphs its steps)."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = group.pop("lr_number")  # what set_lr wrote into it
        if group.get("capturable"):
            group["capturable"] = False
    return state


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
