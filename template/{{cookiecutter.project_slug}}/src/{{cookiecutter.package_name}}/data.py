"""Datasets: turn text into token files once, then draw batches on the device.

Three sources: the embedded Shakespeare corpus, character-level (`shakespeare_char`)
or GPT-2 BPE (`--dataset=shakespeare --tokenizer=gpt2`), and any UTF-8 text file
(`--input_file=notes.txt`, a dataset named `notes` after the file, or
`--dataset=NAME`). `prepare` writes, under data_dir/dataset/, train.bin and val.bin
(uint16 token ids) and meta.json, and never replaces a dataset made from other
text or with another tokenizer unless told `--overwrite=true`.
"""

from __future__ import annotations

import json
import re
import sys
from collections import deque
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import DEFAULT_PRESET, FIELDS, Config
from .errors import DatasetError
from .files import ensure_writable, write_atomic
from .progress import Bar, Task
from .tokenizers import CharTokenizer, GPT2Tokenizer, Tokenizer

PROG = "{{ cookiecutter.project_slug }}"
CORPUS = "corpus/shakespeare.txt"
SPLITS = ("train", "val")
# Text is tokenized in pieces of about this many characters, to show progress.
CHUNK = 1 << 18


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


def dataset_name_for(input_file: str) -> str:
    """A dataset named after its file: `notes/my poems.txt` -> `my_poems`."""
    name = re.sub(r"[^\w.-]+", "_", Path(input_file).stem).strip("._")
    if not name:
        raise DatasetError(
            f"--input_file={input_file}: cannot name a dataset after this file;"
            " pass --dataset=NAME"
        )
    return name


def pieces(text: str, size: int = CHUNK) -> list[str]:
    """`text` cut after lone newlines (non-space on both sides), about `size` apart.

    Both tokenizers give the same ids for the pieces as for the whole text:
    GPT-2's pre-tokenizer makes a lone newline a token of its own, whether it
    ends the text or not, and starts a new token after it; the character
    tokenizer has nothing to join. (After a run of spaces or newlines it would
    not: a run at the end of a piece becomes one token, inside the text two.)
    """
    cuts = [0]
    lone_newline = re.compile(r"(?<=\S)\n(?=\S)")
    while len(text) - cuts[-1] > size:
        found = lone_newline.search(text, cuts[-1] + size)
        if found is None:
            break
        cuts.append(found.end())
    cuts.append(len(text))
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def encode(tokenizer: Tokenizer, text: str, task: Task, done: int) -> list[int]:
    """Tokenize piece by piece, advancing `task` by characters."""
    ids: list[int] = []
    for piece in pieces(text):
        ids += tokenizer.encode(piece)
        done += len(piece)
        task.advance(done)
    return ids


def prepare(
    cfg: Config,
    log: Any = print,
    dataset_given: bool = True,
    stream: Any = None,
) -> Dataset:
    """Tokenize the source text and write the dataset's files.

    dataset_given=False (the command line without --dataset) names the dataset
    of an --input_file after the file, so the embedded corpus's dataset is
    never reused for other text. A folder that already holds a dataset made
    differently is refused, unless cfg.overwrite. `stream` shows progress.
    """
    if cfg.input_file and not dataset_given:
        cfg = replace(cfg, dataset=dataset_name_for(cfg.input_file))
    ensure_writable(cfg.data_dir, "data_dir")
    text, source = read_source(cfg)
    tokenizer = make_tokenizer(cfg, text)
    if tokenizer.vocab_size > 2**16:
        raise DatasetError(
            f"{source} has {tokenizer.vocab_size} distinct characters; token files"
            " hold at most 65536: use --tokenizer=gpt2"
        )
    folder = Path(cfg.data_dir) / cfg.dataset
    _refuse_replacing(cfg, folder, source, tokenizer.to_meta())
    cut = int(len(text) * (1 - cfg.val_fraction))
    out = Bar(stream or sys.stderr)
    task = Task(out, f"tokenizing {source}", len(text), "characters")
    ids = {
        "train": encode(tokenizer, text[:cut], task, 0),
        "val": encode(tokenizer, text[cut:], task, cut),
    }
    task.finish()
    folder.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        write_atomic(folder / f"{split}.bin", np.array(ids[split], np.uint16).tobytes())
    meta = {
        "source": source,
        "tokenizer": tokenizer.to_meta(),
        "tokens": {split: len(ids[split]) for split in SPLITS},
    }
    # meta.json last: its presence means the dataset is complete.
    write_atomic(folder / "meta.json", json.dumps(meta, indent=1).encode())
    log(
        f"prepared {folder} from {source}: {cfg.tokenizer} tokenizer,"
        f" vocab {tokenizer.vocab_size}, {len(ids['train']):,} train and"
        f" {len(ids['val']):,} val tokens"
    )
    default = Config.for_preset(DEFAULT_PRESET)
    if (cfg.dataset, cfg.data_dir) != (default.dataset, default.data_dir):
        log(f"train on it with `{PROG} train{_where(cfg)}`")
    return load_dataset(cfg)


def _where(cfg: Config) -> str:
    """The --data_dir and --dataset flags that find this dataset again."""
    flags = f" --dataset={cfg.dataset}"
    if cfg.data_dir != FIELDS["data_dir"].default:
        flags += f" --data_dir={cfg.data_dir}"
    return flags


def _same_file(a: str, b: str) -> bool:
    return a == b or Path(a).resolve() == Path(b).resolve()


def _refuse_replacing(
    cfg: Config, folder: Path, source: str, tokenizer: dict[str, Any]
) -> None:
    """Refuse to replace a dataset made from other text or another tokenizer."""
    meta_path = folder / "meta.json"
    if cfg.overwrite or not meta_path.is_file():
        return
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        old_source, old_kind = meta["source"], meta["tokenizer"]["kind"]
    except (ValueError, KeyError, TypeError):
        old_source, old_kind = "an unreadable meta.json", "unknown"
    if _same_file(old_source, source) and old_kind == tokenizer["kind"]:
        return  # the same text again: preparing it anew is what was asked
    name_flag = "" if cfg.input_file else " and no --input_file"
    raise DatasetError(
        f"{folder} already holds dataset {cfg.dataset!r}, prepared from"
        f" {old_source} ({old_kind} tokenizer); preparing {source}"
        f" ({tokenizer['kind']} tokenizer{name_flag}) would replace it. Pass"
        " another --dataset=NAME, or --overwrite=true to replace it"
    )


def load_dataset(cfg: Config) -> Dataset:
    """Read a prepared dataset, or explain how to prepare it."""
    folder = Path(cfg.data_dir) / cfg.dataset
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        how = f"{PROG} prepare{_where(cfg)} --tokenizer={cfg.tokenizer}"
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

    The window offsets come from seeded CPU generators, as nanoGPT's get_batch
    draws them, and reach the device in one small non-blocking copy (batch_size
    integers per micro-batch); the windows are gathered on the device. Offsets
    drawn on the device (Philox on CUDA, seeded like the dropout generator) were
    tried first and learned measurably worse, although both programs take
    identical steps given identical random numbers: on an H100 (shakespeare_char,
    bf16) val loss at iteration 1000 was 0.012 above nanoGPT's train.py paired by
    seed over 4 seeds; with CPU-drawn offsets it is 0.004 above over 5 seeds, and
    0.001 at 5000 over 3 (benchmarks/learning_parity.py has the figures).
    Every micro-batch position of an optimizer step (a slot, 0 ..
    gradient_accumulation_steps-1) has its own seeded stream, and `next()` cycles
    through this process's slots. So one process drawing slots 0 and 1 sees
    exactly the batches two DDP processes see drawing slot 0 and slot 1: the
    global batch does not depend on how it is split. The streams' states go into
    checkpoints: a resumed run draws exactly the batches the uninterrupted run
    would have.
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
            torch.Generator().manual_seed(stream_seed(seed, slot)) for slot in slots
        ]
        self.turn = 0
        self.window = torch.arange(block_size + 1, device=tokens.device)
        # MPS only: offsets on the CPU whose copy to the device may not have run.
        self.in_flight: deque[tuple[Any, torch.Tensor]] = deque()

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, each (batch_size, block_size); targets shift by one."""
        generator = self.generators[self.turn]
        self.turn = (self.turn + 1) % len(self.generators)
        drawn = torch.randint(
            self.tokens.numel() - self.block_size,
            (self.batch_size, 1),
            generator=generator,
        )
        starts = drawn.to(self.tokens.device, non_blocking=True)
        if self.tokens.device.type == "mps":
            self._keep_until_copied(drawn)
        chunk = self.tokens[starts + self.window]
        return chunk[:, :-1], chunk[:, 1:]

    def _keep_until_copied(self, drawn: torch.Tensor) -> None:
        """Hold `drawn` until the device has run its copy.

        A non-blocking copy to MPS reads the CPU memory only when the device runs
        it; freed earlier, the offsets could be garbage (pytorch#189690). An event
        recorded after the copy says when it has run.
        """
        event = torch.mps.Event()
        event.record()
        self.in_flight.append((event, drawn))
        while self.in_flight and self.in_flight[0][0].query():
            self.in_flight.popleft()

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
