"""Sample text from a trained checkpoint, character-level or GPT-2 BPE."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import torch

from . import checkpoint, tokenizers
from .config import Config
from .device import make_generator, make_runtime
from .errors import ConfigError, TokenizerError
from .model import GPT, GPTConfig


def read_prompt(start: str) -> str:
    """The prompt itself, or the contents of FILE:path."""
    if not start.startswith("FILE:"):
        return start
    path = Path(start[len("FILE:") :])
    if not path.is_file():
        raise ConfigError(f"--start={start}: no such file {path}")
    return path.read_text(encoding="utf-8")


def sample(cfg: Config, stream: TextIO | None = None) -> list[str]:
    """Print and return cfg.num_samples continuations of the prompt."""
    stream = stream or sys.stdout
    state = checkpoint.load(checkpoint.path_in(cfg.out_dir))
    runtime = make_runtime(cfg.device, cfg.dtype, "false")
    model = GPT(GPTConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    model.eval().to(runtime.device)
    tokenizer = tokenizers.from_meta(state["tokenizer"], cfg.bpe_dir)
    prompt = read_prompt(cfg.start)
    try:
        ids = tokenizer.encode(prompt)
    except TokenizerError as exc:
        raise TokenizerError(f"--start={cfg.start!r}: {exc}") from None
    if not ids:
        if not isinstance(tokenizer, tokenizers.GPT2Tokenizer):
            raise ConfigError("--start='' is empty; give at least one character")
        ids = [tokenizers.GPT2_VOCAB_SIZE - 1]  # <|endoftext|> starts a document
    context = torch.tensor([ids], dtype=torch.long, device=runtime.device)
    generator = make_generator(runtime.device, cfg.seed)
    texts = []
    for _ in range(cfg.num_samples):
        with runtime.autocast:
            out = model.generate(
                context,
                cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                generator=generator,
                vocab_size=tokenizer.vocab_size,
            )
        text = tokenizer.decode(out[0].tolist())
        texts.append(text)
        print(text, file=stream)
        print("-" * 40, file=stream, flush=True)
    return texts
