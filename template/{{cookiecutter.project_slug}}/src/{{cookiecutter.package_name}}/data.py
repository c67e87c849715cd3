"""Datasets: turn text into token files once, then draw batches on the device.

Three sources: the embedded Shakespeare corpus, character-level (`shakespeare_char`)
or GPT-2 BPE (`--dataset=shakespeare --tokenizer=gpt2`), and any UTF-8 text file
(`--input_file=notes.txt --dataset=notes`). `prepare` writes, under
data_dir/dataset/, train.bin and val.bin (uint16 token ids) and meta.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import Config
from .device import make_generator
from .errors import DatasetError
from .tokenizers import CharTokenizer, GPT2Tokenizer, Tokenizer

PROG = "{{ cookiecutter.project_slug }}"
CORPUS = "corpus/shakespeare.txt"
SPLITS = ("train", "val")


@dataclass(frozen=True)
class Dataset:
    folder: Path
    train: np.ndarray
    val: np.ndarray
    meta: dict[str, Any]

    @property
    def tokenizer_meta(self) -> dict[str, Any]:
        return self.meta["tokenizer"]

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])


def embedded_corpus() -> str:
    """About 1.1 MB of Shakespeare (seven plays, public domain, Project Gutenberg)."""
    return (resources.files(__package__) / CORPUS).read_text(encoding="utf-8")


def read_source(cfg: Config) -> tuple[str, str]:
    """The text to prepare and a description of where it came from."""
    if not cfg.input_file:
        return embedded_corpus(), "the embedded Shakespeare corpus"
    path = Path(cfg.input_file)
    where = f"--input_file={cfg.input_file}"
    if not path.is_file():
        raise DatasetError(f"{where}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{where}: not UTF-8 text ({exc})") from None
    if not text.strip():
        raise DatasetError(f"{where}: the file is empty")
    return text, str(path)


def make_tokenizer(cfg: Config, text: str) -> Tokenizer:
    if cfg.tokenizer == "char":
        return CharTokenizer.from_text(text)
    return GPT2Tokenizer(cfg.bpe_dir)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def prepare(cfg: Config, log: Any = print) -> Dataset:
    """Tokenize the source text and write the dataset's files."""
    text, source = read_source(cfg)
    tokenizer = make_tokenizer(cfg, text)
    if tokenizer.vocab_size > 2**16:
        raise DatasetError(
            f"{source} has {tokenizer.vocab_size} distinct characters; token files"
            " hold at most 65536: use --tokenizer=gpt2"
        )
    cut = int(len(text) * (1 - cfg.val_fraction))
    ids = {"train": tokenizer.encode(text[:cut]), "val": tokenizer.encode(text[cut:])}
    folder = Path(cfg.data_dir) / cfg.dataset
    folder.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        _write_atomic(
            folder / f"{split}.bin", np.array(ids[split], np.uint16).tobytes()
        )
    meta = {
        "source": source,
        "tokenizer": tokenizer.to_meta(),
        "tokens": {split: len(ids[split]) for split in SPLITS},
    }
    # meta.json last: its presence means the dataset is complete.
    _write_atomic(folder / "meta.json", json.dumps(meta, indent=1).encode())
    log(
        f"prepared {folder} from {source}: {cfg.tokenizer} tokenizer,"
        f" vocab {tokenizer.vocab_size}, {len(ids['train']):,} train and"
        f" {len(ids['val']):,} val tokens"
    )
    return load_dataset(cfg)


def load_dataset(cfg: Config) -> Dataset:
    """Read a prepared dataset, or explain how to prepare it."""
    folder = Path(cfg.data_dir) / cfg.dataset
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        how = f"{PROG} prepare --dataset={cfg.dataset} --tokenizer={cfg.tokenizer}"
        if cfg.dataset not in ("shakespeare_char", "shakespeare"):
            how += " --input_file=YOUR_TEXT.txt"
        raise DatasetError(
            f"dataset {cfg.dataset!r} is not prepared ({meta_path} not found);"
            f" run `{how}` first"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        expected = {split: int(meta["tokens"][split]) for split in SPLITS}
        meta["tokenizer"]["vocab_size"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(
            f"{meta_path} is unreadable ({exc!r}); prepare again"
        ) from None
    arrays = {}
    for split in SPLITS:
        path = folder / f"{split}.bin"
        size = path.stat().st_size if path.is_file() else -1
        if size != 2 * expected[split]:
            raise DatasetError(
                f"{path} should hold {expected[split]} tokens but"
                f" {'is missing' if size < 0 else f'has {size} bytes'}; prepare again"
            )
        arrays[split] = np.fromfile(path, dtype=np.uint16)
    return Dataset(folder, arrays["train"], arrays["val"], meta)


def stream_seed(seed: int, slot: int) -> int:
    """The seed of micro-batch slot `slot`: slot 0 uses the run's seed itself."""
    return seed + 1000 * slot


class Batches:
    """Random windows of a token tensor that lives on the device.

    Offsets come from generators on the same device, so a batch costs a couple of
    kernels and no host round trip. Every micro-batch position of an optimizer
    step (a slot, 0 .. gradient_accumulation_steps-1) has its own seeded stream,
    and `next()` cycles through this process's slots. So one process drawing
    slots 0 and 1 sees exactly the batches two DDP processes see drawing slot 0
    and slot 1: the global batch does not depend on how it is split.
    The streams' states go into checkpoints: a resumed run draws exactly the
    batches the uninterrupted run would have.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        block_size: int,
        batch_size: int,
        seed: int,
        name: str = "train",
        slots: range | None = None,
    ) -> None:
        if tokens.numel() < block_size + 1:
            raise DatasetError(
                f"the {name} split has {tokens.numel()} tokens; block_size={block_size}"
                f" needs at least {block_size + 1}: lower --block_size or use more"
                " text"
            )
        slots = range(1) if slots is None else slots
        if len(slots) < 1:
            raise ValueError(f"Batches needs at least one slot, got {slots}")
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.slots = slots
        self.generators = [
            make_generator(tokens.device, stream_seed(seed, slot)) for slot in slots
        ]
        self.turn = 0
        self.window = torch.arange(block_size + 1, device=tokens.device)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, each (batch_size, block_size); targets shift by one."""
        generator = self.generators[self.turn]
        self.turn = (self.turn + 1) % len(self.generators)
        starts = torch.randint(
            self.tokens.numel() - self.block_size,
            (self.batch_size, 1),
            generator=generator,
            device=generator.device,
        ).to(self.tokens.device, non_blocking=True)
        chunk = self.tokens[starts + self.window]
        return chunk[:, :-1], chunk[:, 1:]

    def state_dict(self) -> dict[int, torch.Tensor]:
        """{slot: generator state}; merge several processes' dicts for all slots."""
        if self.turn:
            raise RuntimeError(
                f"batch stream saved mid-step (slot turn {self.turn}); save between"
                " optimizer steps"
            )
        pairs = zip(self.slots, self.generators, strict=True)
        return {slot: generator.get_state() for slot, generator in pairs}

    def load_state_dict(self, state: dict[int, torch.Tensor]) -> None:
        missing = [slot for slot in self.slots if slot not in state]
        if missing:
            raise KeyError(
                f"the checkpoint's batch streams are slots {sorted(state)}; this run"
                f" needs {list(self.slots)} (another gradient_accumulation_steps?)"
            )
        for slot, generator in zip(self.slots, self.generators, strict=True):
            generator.set_state(state[slot])
        self.turn = 0
