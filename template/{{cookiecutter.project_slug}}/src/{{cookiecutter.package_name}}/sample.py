"""Sample text from a trained checkpoint, character-level or GPT-2 BPE."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

from . import checkpoint, tokenizers
from .config import FIELDS, SAMPLE_SETTINGS, Config
from .device import make_generator, make_runtime
from .errors import ConfigError, TokenizerError
from .model import GPT, GPTConfig
from .progress import Bar, Task
from .runs import describe


def read_prompt(start: str) -> str:
    """The prompt itself, or the contents of FILE:path."""
    if not start.startswith("FILE:"):
        return start
    path = Path(start[len("FILE:") :])
    if not path.is_file():
        raise ConfigError(f"--start={start}: no such file {path}")
    return path.read_text(encoding="utf-8")


def refuse_ignored(
    cfg: Config, state: dict[str, Any], typed: frozenset[str], path: Path
) -> None:
    """Refuse settings given to `sample` that it would ignore.

    Sampling uses the checkpoint's model and tokenizer: a training setting given
    here is refused unless it only repeats the checkpoint's value.
    """
    saved = {**state["config"], **state["model_config"]}
    ignored = []
    for name in sorted(typed - set(SAMPLE_SETTINGS)):
        value = getattr(cfg, name)
        if name == "compile" and value == "false":
            continue  # sampling never compiles: that is what was asked
        have = saved.get(name, FIELDS[name].default)
        if value != have:
            ignored.append(f"--{name}={value} (the checkpoint's: {have!r})")
    if ignored:
        raise ConfigError(
            f"sample uses the model and settings saved in {path}; it would ignore "
            + ", ".join(ignored)
            + ". Leave them out; sample reads --"
            + ", --".join(SAMPLE_SETTINGS)
        )


def sample(
    cfg: Config,
    stream: TextIO | None = None,
    typed: frozenset[str] | None = None,
    log: Callable[[str], Any] | None = None,
    progress: TextIO | None = None,
) -> list[str]:
    """Print and return cfg.num_samples continuations of the prompt.

    `typed`: settings given on the command line, checked against the
    checkpoint (refuse_ignored); None: a program's Config, not checked.
    `log` (default: stderr) says which checkpoint was loaded; `progress`
    (default: stderr) shows tokens as they are generated.
    """
    stream = stream or sys.stdout
    out = Bar(progress or sys.stderr)
    log = log or out.print
    path = checkpoint.path_in(cfg.out_dir)
    state = checkpoint.load(path)
    if typed:
        refuse_ignored(cfg, state, typed, path)
    runtime = make_runtime(cfg.device, cfg.dtype, "false")
    model = GPT(GPTConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    model.eval().to(runtime.device)
    tokenizer = tokenizers.from_meta(state["tokenizer"], cfg.bpe_dir)
    log(
        f"sampling from {path}: {describe(state)}; {model.num_params() / 1e6:.2f}M"
        f" parameters, {state['tokenizer']['kind']} tokenizer, on {runtime.device}"
    )
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
    for i in range(cfg.num_samples):
        task = Task(
            out, f"sample {i + 1}/{cfg.num_samples}", cfg.max_new_tokens, "tokens"
        )
        with runtime.autocast:
            out_ids = model.generate(
                context,
                cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                generator=generator,
                vocab_size=tokenizer.vocab_size,
                on_token=task.advance,
            )
        task.finish()
        text = tokenizer.decode(out_ids[0].tolist())
        texts.append(text)
        print(text, file=stream)
        print("-" * 40, file=stream, flush=True)
    return texts
