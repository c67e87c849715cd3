import json

import numpy as np
import pytest
import torch
from pytest_mps import assert_on_device

from {{ cookiecutter.package_name }}.config import Config, replace
from {{ cookiecutter.package_name }}.data import (
    Batches,
    embedded_corpus,
    load_dataset,
    prepare,
)
from {{ cookiecutter.package_name }}.errors import DatasetError
from {{ cookiecutter.package_name }}.tokenizers import from_meta


def quiet(_):
    pass


def test_the_embedded_corpus_is_about_a_megabyte_of_shakespeare():
    corpus = embedded_corpus()
    assert 1_000_000 < len(corpus) < 1_200_000
    assert "by William Shakespeare" in corpus
    assert "gutenberg" not in corpus.lower()


def test_prepare_splits_the_corpus_into_train_and_val(data_dir):
    dataset = load_dataset(replace(Config.for_preset("tiny"), data_dir=str(data_dir)))
    corpus = embedded_corpus()
    assert len(dataset.train) + len(dataset.val) == len(corpus)
    assert len(dataset.val) == pytest.approx(0.1 * len(corpus), abs=1)
    tokenizer = from_meta(dataset.tokenizer_meta)
    assert tokenizer.decode(dataset.val[-200:].tolist()) == corpus[-200:]


def test_prepare_reads_a_users_text_file_with_gpt2_bpe(tmp_path):
    text = "The quick brown fox jumps over the lazy dog.\n" * 50
    (tmp_path / "fox.txt").write_text(text, encoding="utf-8")
    cfg = replace(
        Config.for_preset("tiny"),
        data_dir=str(tmp_path / "data"),
        dataset="fox",
        input_file=str(tmp_path / "fox.txt"),
        tokenizer="gpt2",
    )
    dataset = prepare(cfg, log=quiet)
    assert dataset.vocab_size == 50257
    ids = np.concatenate([dataset.train, dataset.val]).tolist()
    assert from_meta(dataset.tokenizer_meta).decode(ids) == text
    assert json.loads((dataset.folder / "meta.json").read_text())["source"].endswith(
        "fox.txt"
    )


def test_a_missing_input_file_is_named(tmp_path):
    cfg = replace(Config.for_preset("tiny"), input_file=str(tmp_path / "nope.txt"))
    with pytest.raises(DatasetError, match=r"--input_file=.*nope.txt: no such file"):
        prepare(cfg, log=quiet)


def test_an_unprepared_dataset_says_how_to_prepare_it(tmp_path):
    cfg = replace(Config.for_preset("tiny"), data_dir=str(tmp_path), dataset="poems")
    with pytest.raises(
        DatasetError, match=r"'poems' is not prepared.*prepare --dataset=poems"
    ):
        load_dataset(cfg)


def test_a_truncated_token_file_is_detected(tmp_path):
    cfg = replace(
        Config.for_preset("tiny"),
        data_dir=str(tmp_path),
        input_file=__file__,
        dataset="own",
    )
    dataset = prepare(cfg, log=quiet)
    with open(dataset.folder / "val.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(
        DatasetError, match=r"val.bin should hold \d+ tokens but has 10"
    ):
        load_dataset(cfg)


def test_batches_are_made_on_the_device_and_targets_are_shifted(device):
    tokens = torch.arange(1000, device=device)
    x, y = Batches(tokens, block_size=16, batch_size=4, seed=0).next()
    assert x.shape == y.shape == (4, 16)
    assert_on_device((x, y), device)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y - x, torch.ones_like(x))  # consecutive tokens


def test_restoring_the_batch_state_replays_the_same_batches():
    batches = Batches(torch.arange(1000), block_size=8, batch_size=4, seed=3)
    batches.next()
    state = batches.state_dict()
    expected = [batches.next()[0] for _ in range(3)]
    again = Batches(torch.arange(1000), block_size=8, batch_size=4, seed=99)
    again.load_state_dict(state)
    for want in expected:
        assert torch.equal(again.next()[0], want)


def test_a_split_shorter_than_the_context_is_refused():
    with pytest.raises(DatasetError, match="val split has 10 tokens; block_size=16"):
        Batches(torch.arange(10), block_size=16, batch_size=2, seed=0, name="val")
