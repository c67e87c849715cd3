"""Training steps replayed as one CUDA graph of the plain (uncompiled) model.

Uncompiled, a training step of the models this project trains is launch-bound on
a GPU: hundreds of small kernels (forward, backward, clipping, the optimizer),
each launched from Python. torch.compile removes the launches but compiles for
tens of seconds before the first step. `--train_graph=true` instead records one
whole step (every micro-batch's forward and backward, the gradient clipping and
the optimizer's update) once, after a few eager steps, and replays it for every
later step: the same kernels, one launch. The learning rate and the optimizer's
step count live on the device (optim.make_capturable), so the replays follow the
schedule; dropout's random numbers advance with each replay.

CUDA only, uncompiled, one process and no gradient scaler (bfloat16 or float32):
`--train_graph=auto` (the default) graphs where those hold, and `true` is
refused by name elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .errors import DeviceError

if TYPE_CHECKING:
    from .trainer import Trainer

#: Eager steps on a side stream before the capture: cuBLAS and the attention
#: kernels pick their algorithms and workspaces, and the optimizer creates its
#: state, outside the graph. They are real steps of the run.
EAGER_STEPS = 3


def refusal(
    setting: str, device: torch.device, compiled: bool, processes: int, scaled: bool
) -> str | None:
    """Why `--train_graph=setting` cannot run here, or None when it can (or is off).

    `auto` is never refused: it graphs where `true` would run.
    """
    if setting != "true":
        return None
    if device.type != "cuda":
        return f"--train_graph=true needs a CUDA device; this run is on {device}"
    if compiled:
        return "--train_graph=true graphs the uncompiled model: add --compile=false"
    if processes > 1:
        return f"--train_graph=true runs in one process; this run has {processes}"
    if scaled:
        return (
            "--train_graph=true cannot replay float16's gradient scaler:"
            " use --dtype=bfloat16"
        )
    return None


def check(
    setting: str, device: torch.device, compiled: bool, processes: int, scaled: bool
) -> bool:
    """Whether to graph training steps; a DeviceError says why `true` cannot."""
    if setting == "auto":
        return refusal("true", device, compiled, processes, scaled) is None
    reason = refusal(setting, device, compiled, processes, scaled)
    if reason is not None:
        raise DeviceError(f"{reason} (or --train_graph=auto or false)")
    return setting == "true"


class GraphedStep:
    """`loss = graphed(t, eager_step)`: one optimizer step of trainer `t`.

    The first EAGER_STEPS calls run `eager_step(t)` on a side stream; the next
    one captures the step and replays it, as does every later call. The returned
    loss is a copy (the graph's own output is overwritten by the next replay).
    Between calls the gradients stay allocated in the graph's memory: nothing
    else may set them to None.
    """

    def __init__(self) -> None:
        self.eager_steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.loss: torch.Tensor | None = None

    def __call__(
        self, t: Trainer, eager_step: Callable[[Trainer], torch.Tensor]
    ) -> torch.Tensor:
        if self.graph is None and self.eager_steps < EAGER_STEPS:
            self.eager_steps += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = eager_step(t)
            torch.cuda.current_stream().wait_stream(side)
            return loss
        if self.graph is None:
            self._capture(t)
        else:
            for static_x, static_y in self.inputs:
                x, y = t.batches.next()
                static_x.copy_(x)
                static_y.copy_(y)
        assert self.graph is not None and self.loss is not None
        self.graph.replay()
        return self.loss.clone()

    def _capture(self, t: Trainer) -> None:
        """Record one step on this step's micro-batches (the replay runs it)."""
        self.inputs = [
            (x.clone(), y.clone())
            for x, y in (t.batches.next() for _ in range(t.micro_steps))
        ]
        t.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                total: torch.Tensor | None = None
                for x, y in self.inputs:
                    with t.runtime.autocast:
                        _, loss = t.step_model(x, y)
                    if t.micro_steps > 1:
                        loss = loss / t.micro_steps
                    loss.backward()
                    total = loss.detach() if total is None else total + loss.detach()
                if t.cfg.grad_clip > 0:
                    params = t.model.parameters()
                    torch.nn.utils.clip_grad_norm_(params, t.cfg.grad_clip)
                t.optimizer.step()
        except RuntimeError as exc:
            raise DeviceError(
                f"recording the training step as a CUDA graph failed ({exc});"
                " run with --train_graph=false"
            ) from exc
        self.graph, self.loss = graph, total
