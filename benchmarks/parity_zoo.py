"""Clean building blocks against the CPU: does parity pass, and is a 1% fault caught?

A zoo of common building blocks, written for this script (not the project's
own test models), runs through ``assert_device_parity(..., grads=True)`` on
the device: once with torch's default math settings (on CUDA, cuDNN's TF32
on) and once with TF32 off. A correct block must pass both. Then each block
runs with a fault: a forward hook on one of its layers that makes that
layer's output 1% larger on the device only; the check must fail, and the
localizer should name that layer (``report.localization.layer``). The layer
is never one whose output a normalization follows (a 1% scale there is
normalized away: no check can see it).

Per block the script prints the largest difference seen (|device - CPU| over
the leaf's scale, the quantity the tolerance bounds) with TF32 on and off,
whether each check passed, and for the fault: caught, and the layer named.

Usage: ``python benchmarks/parity_zoo.py [--device cuda|mps] [--json PATH]``;
under ``--mps-emulate``'s device: ``--device mps`` with the emulation
installed by running inside pytest (``pytest benchmarks/parity_zoo.py
--mps-emulate``) is not supported: the emulated device computes on the CPU,
so a clean block matches it exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from pytest_mps import assert_device_parity
from pytest_mps.parity.check import ParityError


class MLP(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(32, 64), act, nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ConvNet(nn.Module):
    def __init__(self, norm: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8) if norm else nn.Identity()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.conv1(x)))
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.head(h.mean((2, 3)))


class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = cell(16, 32, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, 32))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(32), Attention()
        self.ln2, self.mlp = nn.LayerNorm(32), MLP(nn.GELU())
        self.mlp.fc2 = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(64, 32), nn.Embedding(16, 32)
        self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(32), nn.Linear(32, 64)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.silu(self.norm(self.conv1(x))))


class UpConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        return self.conv(up)


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


#: name -> (model factory, inputs factory, the layer the fault goes in)
ZOO: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[Any, ...]], str]] = {
    "linear": (lambda: nn.Linear(32, 8), lambda: (_x(16, 32),), ""),
    "mlp_relu": (lambda: MLP(nn.ReLU()), lambda: (_x(16, 32),), "fc1"),
    "mlp_gelu": (lambda: MLP(nn.GELU()), lambda: (_x(16, 32),), "fc1"),
    "mlp_tanh": (lambda: MLP(nn.Tanh()), lambda: (_x(16, 32),), "fc2"),
    "convnet_train": (lambda: ConvNet().train(), lambda: (_x(4, 3, 16, 16),), "conv2"),
    "convnet_eval": (lambda: ConvNet().eval(), lambda: (_x(4, 3, 16, 16),), "conv1"),
    "convnet_plain": (lambda: ConvNet(False), lambda: (_x(4, 3, 16, 16),), "conv2"),
    "conv1d": (
        lambda: nn.Sequential(nn.Conv1d(4, 8, 5), nn.ReLU(), nn.Conv1d(8, 4, 3)),
        lambda: (_x(4, 4, 64),),
        "0",
    ),
    "conv_transpose": (
        lambda: nn.Sequential(nn.ConvTranspose2d(4, 4, 4, stride=2), nn.Sigmoid()),
        lambda: (_x(2, 4, 8, 8),),
        "0",
    ),
    "depthwise_groupnorm": (
        lambda: nn.Sequential(
            nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.GroupNorm(4, 8), nn.ReLU()
        ),
        lambda: (_x(2, 8, 16, 16),),
        "1",  # the norm's output: a 1% scale before a norm is normalized away
    ),
    "residual_block": (Residual, lambda: (_x(2, 8, 16, 16),), "conv2"),
    "upsample_conv": (UpConv, lambda: (_x(2, 4, 8, 8),), "conv"),
    "gru": (lambda: Recurrent(nn.GRU), lambda: (_x(4, 12, 16),), "head"),
    "lstm": (lambda: Recurrent(nn.LSTM), lambda: (_x(4, 12, 16),), "head"),
    "rnn": (lambda: Recurrent(nn.RNN), lambda: (_x(4, 12, 16),), "head"),
    "multihead_attention": (
        lambda: nn.MultiheadAttention(32, 4, batch_first=True),
        lambda: (_x(2, 10, 32), _x(2, 10, 32), _x(2, 10, 32)),
        "",  # its forward reads out_proj's weight, never calling the module
    ),
    "transformer_encoder_layer": (
        lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
        lambda: (_x(2, 10, 32),),
        "linear1",
    ),
    "sdpa_attention": (Attention, lambda: (_x(2, 10, 32),), "qkv"),
    "gpt_block": (Block, lambda: (_x(2, 10, 32),), "mlp.fc1"),
    "gpt_4_layers": (
        TinyGPT,
        lambda: (torch.randint(0, 64, (2, 16)),),
        "blocks.1.attn.proj",
    ),
    "embedding_bag_mlp": (
        lambda: nn.Sequential(nn.Embedding(100, 16), nn.Flatten(), nn.Linear(64, 4)),
        lambda: (torch.randint(0, 100, (8, 4)),),
        "2",
    ),
    "layernorm_mlp": (
        lambda: nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.SiLU()),
        lambda: (_x(16, 32),),
        "1",
    ),
}


@contextlib.contextmanager
def tf32(on: bool) -> Iterator[None]:
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


def worst(report: Any) -> float:
    """The largest |device - CPU| over the leaf's scale among the leaves."""
    return max((d.max_abs / d.scale for d in report.diffs), default=0.0)


def check(name: str, device: str, faulty: bool) -> dict[str, Any]:
    make, inputs, layer = ZOO[name]
    torch.manual_seed(0)
    model = make()
    args = inputs()
    handle = None
    if faulty:
        target = model.get_submodule(layer) if layer else model

        def fault(module: nn.Module, given: Any, output: Any) -> Any:
            if isinstance(output, tuple):
                head, *rest = output
                if head.device.type != "cpu":
                    return (head * 1.01, *rest)
                return output
            return output * 1.01 if output.device.type != "cpu" else output

        handle = target.register_forward_hook(fault)
    try:
        report = assert_device_parity(model, *args, device=device, grads=True)
        return {"passed": True, "worst": worst(report)}
    except ParityError as error:
        found = error.report.localization
        named = found.layer.module if found is not None and found.layer else None
        # the root is named by the call's argument (here "model"): its path only
        path = None if named is None else named.partition(".")[2]
        return {"passed": False, "worst": worst(error.report), "layer": path}
    finally:
        if handle is not None:
            handle.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    rows = {}
    for name in ZOO:
        row: dict[str, Any] = {}
        with tf32(True):
            row["default"] = check(name, options.device, False)
            row["fault"] = check(name, options.device, True)
        with tf32(False):
            row["tf32_off"] = check(name, options.device, False)
        rows[name] = row
        expected = ZOO[name][2] or "the model itself"
        named = row["fault"].get("layer")
        print(
            f"{name:28s} default {'pass' if row['default']['passed'] else 'FAIL'} "
            f"({row['default']['worst']:.1e})  tf32 off "
            f"{'pass' if row['tf32_off']['passed'] else 'FAIL'} "
            f"({row['tf32_off']['worst']:.1e})  1% fault in {expected}: "
            f"{'caught' if not row['fault']['passed'] else 'MISSED'}, named {named}",
            flush=True,
        )
    clean = sum(r["default"]["passed"] for r in rows.values())
    off = sum(r["tf32_off"]["passed"] for r in rows.values())
    caught = sum(not r["fault"]["passed"] for r in rows.values())
    named = sum(r["fault"].get("layer") == ZOO[n][2] for n, r in rows.items())
    gpu = torch.cuda.get_device_name() if options.device.startswith("cuda") else ""
    print(
        f"\n{len(rows)} blocks on {options.device} {gpu} (torch {torch.__version__}, "
        f"{platform.platform()}): clean pass {clean}/{len(rows)} with default "
        f"settings, {off}/{len(rows)} with TF32 off; 1% faults caught "
        f"{caught}/{len(rows)}, the faulted layer named {named}/{len(rows)}"
    )
    if options.json:
        options.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
