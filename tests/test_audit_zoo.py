"""``--mps-audit=error`` says nothing at all about standard models that run on MPS.

Six tiny models, one training step each (forward, loss, backward, AdamW step)
on the CPU: a nanoGPT-style GPT, a ResNet-style conv net with batch norm, a
ViT block, a UNet-style block with group norm and upsampling, an LSTM
language model and an MoE layer routing with ``topk`` and ``index_add_``.
Every op and dtype they use runs on MPS, so a finding is a false alarm.
"""

from __future__ import annotations

import json

import pytest

# Loaded here, not first inside the in-process run (see tests/test_audit.py).
import torch._dynamo  # noqa: F401
import torchgen.gen  # noqa: F401
from conftest import HAS_COMMON_MPS

ZOO = """
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


class GPT(nn.Module):
    def __init__(self, vocab=32, block=16, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.ln1, self.ln2, self.ln = (nn.LayerNorm(width) for _ in range(3))
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.head = nn.Linear(width, vocab, bias=False)
        self.wte.weight = self.head.weight

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.size(-1), dim=2)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.ln(x))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.block = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
        )
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(x + self.block(x))
        x = F.adaptive_avg_pool2d(self.pool(x), 1).flatten(1)
        return self.head(x)


class ViTBlock(nn.Module):
    def __init__(self, width=32, patch=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.zeros(1, 17, width))
        self.layer = nn.TransformerEncoderLayer(
            width, 4, 2 * width, dropout=0.1, batch_first=True, norm_first=True
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1) + self.pos
        return self.head(self.layer(x)[:, 0])


class UNetBlock(nn.Module):
    def __init__(self, channels=8):
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.GroupNorm(4, channels), nn.SiLU()
        )
        self.mid = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.GroupNorm(4, channels),
            nn.SiLU(),
        )
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.out = nn.Conv2d(2 * channels, 3, 3, padding=1)

    def forward(self, x):
        skip = self.down(x)
        y = self.up(self.mid(F.avg_pool2d(skip, 2)))
        return self.out(torch.cat([y, skip], dim=1))


class LSTMLM(nn.Module):
    def __init__(self, vocab=32, width=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        out, _ = self.lstm(self.embed(idx))
        return self.head(out)


class MoE(nn.Module):
    def __init__(self, width=16, experts=4, k=2):
        super().__init__()
        self.k = k
        self.gate = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x):
        weights, chosen = torch.topk(self.gate(x).softmax(-1), self.k, dim=-1)
        out = torch.zeros_like(x)
        rows = torch.arange(x.size(0), device=x.device)
        for slot in range(self.k):
            for e, expert in enumerate(self.experts):
                # every token through every expert, weighted by whether it chose
                # it: no data-dependent shapes, so no host sync
                mask = (chosen[:, slot] == e).to(x.dtype) * weights[:, slot]
                out = out.index_add(0, rows, expert(x) * mask[:, None])
        return out


def train_step(model, inputs, loss_of):
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = loss_of(model(inputs))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # checked without reading a value back (that would be a host sync)
    assert len(optimizer.state) == len(list(model.parameters()))


def test_gpt():
    idx = torch.randint(0, 32, (2, 16))
    train_step(GPT(), idx, lambda logits: F.cross_entropy(
        logits.view(-1, logits.size(-1)), idx.view(-1)))


def test_resnet():
    labels = torch.randint(0, 10, (4,))
    train_step(ResNet(), torch.randn(4, 3, 16, 16),
               lambda logits: F.cross_entropy(logits, labels))


def test_vit_block():
    labels = torch.randint(0, 10, (2,))
    train_step(ViTBlock(), torch.randn(2, 3, 16, 16),
               lambda logits: F.cross_entropy(logits, labels))


def test_unet_block():
    images = torch.randn(2, 3, 16, 16)
    train_step(UNetBlock(), images, lambda out: F.mse_loss(out, images))


def test_lstm_lm():
    idx = torch.randint(0, 32, (2, 12))
    train_step(LSTMLM(), idx, lambda logits: F.cross_entropy(
        logits.reshape(-1, 32), idx.reshape(-1)))


def test_moe_layer():
    x = torch.randn(8, 16)
    train_step(MoE(), x, lambda out: out.pow(2).mean())
"""


@pytest.mark.parametrize(
    "model", ["gpt", "resnet", "vit_block", "unet_block", "lstm_lm", "moe_layer"]
)
def test_a_standard_model_trains_one_step_with_no_audit_finding(
    pytester: pytest.Pytester, model: str
) -> None:
    pytester.makepyfile(test_zoo=ZOO)
    result = pytester.runpytest(
        "--mps-audit=error", "--mps-report", "report.json", "-k", f"test_{model}"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["1 tests audited, 1 without findings"])
    audit = json.loads((pytester.path / "report.json").read_text())["mps_audit"]
    assert audit["tests"] == {f"test_zoo.py::test_{model}": []}
    # PyTorch's own lists took part (not the yaml alone) where torch ships them
    if HAS_COMMON_MPS:
        assert audit["pytorch_lists"]["note"] == ""
    else:
        assert audit["pytorch_lists"]["note"].startswith(
            "PyTorch's MPS test lists not used"
        )
