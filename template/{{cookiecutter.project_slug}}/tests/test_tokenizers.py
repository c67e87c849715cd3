import shutil

import pytest

from {{ cookiecutter.package_name }}.data import embedded_corpus
from {{ cookiecutter.package_name }}.errors import TokenizerError
from {{ cookiecutter.package_name }}.tokenizers import (
    CharTokenizer,
    GPT2Tokenizer,
    from_meta,
    gpt2_files,
)

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler...\n"


def test_characters_round_trip_through_the_corpus_vocabulary():
    corpus = embedded_corpus()
    tokenizer = CharTokenizer.from_text(corpus)
    assert tokenizer.decode(tokenizer.encode(corpus[:5000])) == corpus[:5000]
    assert from_meta(tokenizer.to_meta()).encode(TEXT) == tokenizer.encode(TEXT)


def test_characters_outside_the_vocabulary_are_named():
    with pytest.raises(TokenizerError, match=r"characters '\$€' are not in"):
        CharTokenizer.from_text("abc").encode("a€b$")


def test_gpt2_round_trips_any_text():
    tokenizer = GPT2Tokenizer()
    text = TEXT + "naïve café, 東京, emoji 🙂"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_gpt2_gives_the_original_token_ids():
    assert GPT2Tokenizer().encode("Hello world") == [15496, 995]


def test_gpt2_is_built_exactly_as_tiktoken_builds_it():
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    files = gpt2_files()
    ranks = data_gym_to_mergeable_bpe_ranks(
        str(files["vocab.bpe"]), str(files["encoder.json"])
    )
    assert GPT2Tokenizer().encoding._mergeable_ranks == ranks


def test_a_tampered_bpe_file_is_refused(tmp_path):
    for name, path in gpt2_files().items():
        shutil.copy(path, tmp_path / name)
    with open(tmp_path / "vocab.bpe", "a", encoding="utf-8") as f:
        f.write("x y\n")
    with pytest.raises(TokenizerError, match=r"vocab.bpe has SHA-256 .* expected 1ce1"):
        GPT2Tokenizer(str(tmp_path))


def test_missing_bpe_files_say_where_they_were_looked_for(tmp_path):
    with pytest.raises(TokenizerError, match=rf"vocab.bpe not found .*{tmp_path.name}"):
        GPT2Tokenizer(str(tmp_path))
