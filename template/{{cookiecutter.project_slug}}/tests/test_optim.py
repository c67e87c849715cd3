"""--optimizer=muon: Muon for the blocks' matrices, AdamW for the rest."""

import io

import pytest
import torch

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.optim import MuonAdamW, lr_at, orthogonalize
from {{ cookiecutter.package_name }}.train import train, train_step
from {{ cookiecutter.package_name }}.trainer import setup


def test_orthogonalize_brings_the_singular_values_near_one(device):
    for shape in [(48, 16), (16, 48)]:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        x[:, 0] *= 30  # badly conditioned, as gradients are
        wide = orthogonalize(x.to(device)).float()
        if shape[0] > shape[1]:
            wide = wide.mT
        # (O O^T - I) has the eigenvalues s^2 - 1 over O's singular values s:
        # its Frobenius norm over sqrt(n) is their root mean square. The
        # quintic iteration trades exactness for speed (s in 0.68 to 1.14 or so:
        # 0.24 to 0.32); the input, normalised, reads 0.97.
        n = wide.size(0)
        gram = wide @ wide.mT
        spread = (gram - torch.eye(n, device=device)).norm() / n**0.5
        assert spread.item() < 0.4, spread
        assert orthogonalize(x.to(device)).shape == shape
        # A stack of matrices is orthogonalised matrix by matrix, in one call.
        stack = torch.stack([x, x.flip(0)]).to(device)
        one_by_one = torch.stack([orthogonalize(m) for m in stack])
        torch.testing.assert_close(orthogonalize(stack), one_by_one)


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(small_config, device):
    t = setup(replace(small_config, optimizer="muon"), log=lambda _: None)
    assert isinstance(t.optimizer, MuonAdamW)
    kinds = {}
    for group in t.optimizer.param_groups:
        for p in group["params"]:
            kinds[id(p)] = group["kind"]
    names = {name: kinds[id(p)] for name, p in t.model.named_parameters()}
    assert names["blocks.0.attn.qkv.weight"] == "muon"
    assert names["blocks.1.mlp.fc.weight"] == "muon"
    assert names["wte.weight"] == names["wpe.weight"] == "adamw"  # wte is lm_head's
    assert names["blocks.0.ln_1.weight"] == "adamw"
    assert set(names.values()) == {"muon", "adamw"}
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    train_step(t)
    for name, p in t.model.named_parameters():
        assert not torch.equal(p.detach(), before[name]), f"{name} did not move"
        assert p.device.type == device.type


def test_a_muon_run_trains_follows_the_schedule_and_resumes(small_config):
    cfg = replace(small_config, optimizer="muon", muon_lr=0.05, max_iters=40,
                  eval_interval=20, eval_iters=4, learning_rate=3e-3,
                  warmup_iters=5)  # fmt: skip
    stream = io.StringIO()
    result = train(cfg, stream=stream)
    (_, _, val_before), *_, (_, _, val_after) = result.evals
    assert val_after < val_before - 0.5, stream.getvalue()
    state = checkpoint.load(result.checkpoint)
    groups = state["optimizer"]["param_groups"]
    # The last step's rate from the schedule, and Muon's share of it.
    lr = lr_at(cfg, 39)
    adamw = [g for g in groups if g["kind"] == "adamw"]
    (muon,) = [g for g in groups if g["kind"] == "muon"]
    assert lr < 3e-3 and all(g["lr"] == pytest.approx(lr) for g in adamw)
    assert muon["lr"] == pytest.approx(lr * 0.05 / 3e-3)
    resumed = train(replace(cfg, max_iters=44, lr_decay_iters=40,
                            init_from="resume", allow_changes="max_iters"),
                    stream=stream)  # fmt: skip
    assert resumed.iter_num == 44


def test_resuming_with_another_optimizer_is_refused(small_config):
    train(small_config, stream=io.StringIO())
    refused = r"optimizer: 'adamw' in the checkpoint, 'muon' asked for"
    with pytest.raises(ConfigError, match=refused):
        setup(replace(small_config, optimizer="muon", init_from="resume"),
              log=lambda _: None, typed=frozenset({"optimizer"}))  # fmt: skip


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_muon_steps_along_the_orthogonalised_nesterov_momentum(device, momentum):
    # Two steps on one tall matrix: the second step's direction is the
    # orthogonalised Nesterov blend of the momentum buffer and the gradient.
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4, device=device))
    opt = MuonAdamW([{"params": [w], "kind": "muon", "weight_decay": 0.0}],
                    lr=0.1, betas=(0.9, 0.99), momentum=momentum)  # fmt: skip
    grads = [torch.randn(8, 4, device=device) for _ in range(2)]
    buf = torch.zeros_like(w)
    for grad in grads:
        before = w.detach().clone()
        w.grad = grad.clone()
        opt.step()
        buf = momentum * buf + (1 - momentum) * grad
        direction = orthogonalize(grad + momentum * (buf - grad))
        expected = before - 0.1 * (8 / 4) ** 0.5 * direction
        # bfloat16 Newton-Schulz on CUDA: the blend's last-bit differences
        # come out of it about 1e-3 apart; float32 elsewhere
        tol = {"atol": 3e-3, "rtol": 1e-2} if device.type == "cuda" else {}
        torch.testing.assert_close(
            w.detach(), expected, **(tol or {"atol": 1e-5, "rtol": 1e-4})
        )
