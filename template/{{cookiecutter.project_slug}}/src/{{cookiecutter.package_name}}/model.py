"""The GPT: token and position embeddings, pre-norm transformer blocks, a tied head.

Read top to bottom: attention, MLP, block, then the model with its optimizer setup,
FLOP count and sampling loop. Shapes use B (batch), T (time), C (channels).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = False

    def to_dict(self) -> dict[str, int | float | bool]:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(
                f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}"
            )
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        # One matmul makes queries, keys and values: fewer kernels per step.
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, T, C/heads)
        # The fused kernel (flash or memory-efficient where the backend has one).
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    pos: torch.Tensor  # positions 0..block_size-1, made once on the model's device

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        # Weight tying: the output layer reuses the token embedding matrix.
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write to the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self.register_buffer("pos", torch.arange(cfg.block_size), persistent=False)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position and the loss, or the last position's logits."""
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(
                f"sequence of {T} tokens is longer than"
                f" block_size={self.cfg.block_size}"
            )
        x = self.drop(self.wte(idx) + self.wpe(self.pos[:T]))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None  # sampling needs the last only
        logits = self.lm_head(x)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1
        )
        return logits, loss

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, without the position embeddings unless asked (as in GPT-2)."""
        n = sum(p.numel() for p in self.parameters())  # tied weights count once
        return n - self.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6N for matmuls plus attention (PaLM, app. B)."""
        c = self.cfg
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    def make_optimizer(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float]
    ) -> torch.optim.AdamW:
        """AdamW decaying matrices only; the fused kernel where the backend has one.

        Call it after moving the model to its device: fused support is per device.
        """
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {
                "params": [p for p in params if p.dim() >= 2],
                "weight_decay": weight_decay,
            },
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        try:
            # One kernel for the whole update and no host read per step.
            return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=True)
        except RuntimeError as exc:  # "`fused=True` requires ... supported devices"
            if "fused" not in str(exc):
                raise
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, foreach=True)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int = 0,
        generator: torch.Generator | None = None,
        vocab_size: int | None = None,
        on_token: Callable[[int], object] | None = None,
    ) -> torch.Tensor:
        """Extend each row of `idx` by `max_new_tokens` sampled tokens.

        temperature 0 picks the likeliest token; top_k 0 keeps every token;
        vocab_size drops the padding entries a tokenizer cannot decode;
        on_token(n) is called after the n-th new token (for progress).
        """
        for n in range(max_new_tokens):
            context = idx[:, -self.cfg.block_size :]
            logits, _ = self(context)
            logits = logits[:, -1, :vocab_size].float()
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if 0 < top_k < logits.size(-1):
                    kth = torch.topk(logits, top_k).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat((idx, next_id), dim=1)
            if on_token is not None:
                on_token(n + 1)
        return idx
