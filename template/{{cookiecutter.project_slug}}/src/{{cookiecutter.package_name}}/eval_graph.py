"""Evaluation passes replayed as CUDA graphs of the plain (uncompiled) model.

An evaluation pass of the models this project trains is launch-bound on a GPU:
hundreds of small kernels, each launched from Python. torch.compile removes the
launches but compiles a graph of its own for evaluation (no gradients, no
dropout), which took 13 s of a cold H100 run before its first step. Capturing
the plain model's pass once per input shape with `torch.cuda.graph` takes
milliseconds; each later pass is one replay of the same kernels.

CUDA only (MPS and the CPU have no graphs to capture): elsewhere, and with
`--eval_graph=false`, evaluation calls the step model as training does.
"""

from __future__ import annotations

import torch

from .errors import DeviceError
from .model import GPT

#: Eager passes on a side stream before a capture: cuBLAS and the attention
#: kernels pick their algorithms and workspaces outside the graph.
WARMUP_PASSES = 2


def wanted(setting: str, device: torch.device) -> bool:
    """Whether `--eval_graph=setting` graphs evaluation on `device`."""
    if setting == "auto":
        return device.type == "cuda"
    if setting == "true" and device.type != "cuda":
        raise DeviceError(
            f"--eval_graph=true needs a CUDA device; this run is on {device}:"
            " use --eval_graph=auto or false"
        )
    return setting == "true"


class GraphedLoss:
    """`loss = graphed(x, y)`: the model's mean loss over a batch, in eval mode.

    One graph per (x, y) shape, captured at its first call; `release()` frees
    them all. evaluate() releases them at its end, so their activations do not
    stay allocated between evaluations: capturing again costs a few passes,
    against the hundreds an evaluation makes. The returned tensor is the
    graph's own output: the next call overwrites it, so read or accumulate it
    first (stream order makes `total += loss` safe). The graph reads the
    parameters' memory, so optimizer steps in place are seen; call it only
    under `torch.no_grad()` with the model in eval mode, as it was captured (no
    dropout, hence no random numbers in the graph).
    """

    def __init__(self, model: GPT, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype
        self.graphs: dict[
            tuple[torch.Size, torch.Size],
            tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph],
        ] = {}

    def _pass(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.float32:
            _, loss = self.model(x, y)
        else:
            # No autocast weight cache: a cached cast would be captured once and
            # replayed stale after the optimizer changes the weights.
            with torch.autocast("cuda", dtype=self.dtype, cache_enabled=False):
                _, loss = self.model(x, y)
        assert loss is not None  # targets given
        return loss

    def _capture(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph]:
        static_x, static_y = x.clone(), y.clone()
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_PASSES):
                self._pass(static_x, static_y)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = self._pass(static_x, static_y)
        return static_x, static_y, loss, graph

    def release(self) -> None:
        """Drop every graph and its memory; the next call captures again."""
        self.graphs.clear()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        key = (x.shape, y.shape)
        entry = self.graphs.get(key)
        if self.model.training or torch.is_grad_enabled():
            raise RuntimeError("GraphedLoss runs the model in eval mode, without grad")
        if entry is None:
            try:
                entry = self.graphs[key] = self._capture(x, y)
            except RuntimeError as exc:
                raise DeviceError(
                    f"capturing an evaluation pass of shape {tuple(x.shape)} as a"
                    f" CUDA graph failed ({exc}); run with --eval_graph=false"
                ) from exc
        static_x, static_y, loss, graph = entry
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return loss
