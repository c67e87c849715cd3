import math

import pytest
import torch
from pytest_mps import assert_on_device

from {{ cookiecutter.package_name }}.config import Config
from {{ cookiecutter.package_name }}.model import GPT, GPTConfig
from {{ cookiecutter.package_name }}.trainer import model_config

SMALL = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)


def test_forward_returns_logits_for_every_position_and_a_scalar_loss(device):
    model = GPT(SMALL).to(device)
    idx = torch.randint(SMALL.vocab_size, (3, 16), device=device)
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 16, SMALL.vocab_size)
    assert loss is not None and loss.shape == ()
    assert_on_device(logits, device)


def test_forward_without_targets_returns_only_the_last_position(device):
    model = GPT(SMALL).to(device)
    logits, loss = model(torch.zeros(2, 5, dtype=torch.long, device=device))
    assert logits.shape == (2, 1, SMALL.vocab_size)
    assert loss is None


def test_the_device_computes_what_the_cpu_computes(device_parity):
    # Forward, backward and two AdamW steps on the test's device against the
    # same on the CPU, every logit, gradient and updated weight compared by
    # name (pytest-mps's device_parity). On a CPU run both sides are the CPU;
    # run with --mps (or --device cuda) to check the GPU.
    torch.manual_seed(0)
    model = GPT(SMALL)
    idx, targets = torch.randint(SMALL.vocab_size, (2, 4, 16))
    report = device_parity(
        model,
        idx,
        targets,
        steps=2,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )
    paths = [diff.path for diff in report.diffs]
    assert any("wte.weight" in path for path in paths), paths


def test_initial_loss_is_that_of_a_uniform_guess():
    torch.manual_seed(0)
    model = GPT(SMALL)
    idx, targets = torch.randint(SMALL.vocab_size, (2, 8, 16))
    _, loss = model(idx, targets)
    assert loss.item() == pytest.approx(math.log(SMALL.vocab_size), abs=0.1)


def test_output_layer_shares_the_token_embedding():
    model = GPT(SMALL)
    assert model.lm_head.weight is model.wte.weight
    tied = sum(p.numel() for p in model.parameters())
    assert tied == model.num_params(non_embedding=False)


def test_a_token_never_sees_the_tokens_after_it():
    torch.manual_seed(0)
    model = GPT(SMALL).eval()
    idx = torch.randint(SMALL.vocab_size, (1, 16))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % SMALL.vocab_size
    logits, _ = model(idx, idx)
    logits_changed, _ = model(changed, changed)
    torch.testing.assert_close(logits[:, :10], logits_changed[:, :10])
    assert not torch.allclose(logits[:, 10:], logits_changed[:, 10:])


def test_tiny_preset_has_about_0_8_million_parameters():
    cfg = model_config(Config.for_preset("tiny"), {"kind": "char", "vocab_size": 74})
    assert 0.75e6 < GPT(cfg).num_params() < 0.85e6


def test_gpt2_preset_has_gpt2_small_size():
    cfg = model_config(Config.for_preset("gpt2"), {"kind": "gpt2", "vocab_size": 50257})
    assert cfg.vocab_size == 50304
    with torch.device("meta"):  # shapes only: no memory for 124M parameters
        model = GPT(cfg)
    assert 123e6 < model.num_params() < 125e6


def test_a_sequence_longer_than_the_context_is_refused():
    with pytest.raises(ValueError, match="longer than block_size=16"):
        GPT(SMALL)(torch.zeros(1, 17, dtype=torch.long))


def test_generate_extends_the_prompt_within_the_vocabulary(device):
    model = GPT(SMALL).to(device).eval()
    prompt = torch.zeros(1, 20, dtype=torch.long, device=device)  # > block_size
    out = model.generate(prompt, 30, temperature=1.0, top_k=5, vocab_size=7)
    assert out.shape == (1, 50)
    assert torch.equal(out[:, :20], prompt)
    assert int(out.max()) < 7


def test_greedy_generation_is_deterministic():
    model = GPT(SMALL).eval()
    prompt = torch.tensor([[1, 2, 3]])
    first = model.generate(prompt, 10, temperature=0)
    assert torch.equal(first, model.generate(prompt, 10, temperature=0))
