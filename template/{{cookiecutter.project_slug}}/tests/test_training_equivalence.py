"""The training loop against the runs it must equal, with pytest-mps's checks.

Resuming from a checkpoint must give the run that was never stopped; four
accumulated micro-batches must give the step of the one batch they were cut
from; autocast must stay near float32. Each check runs the project's own code:
``train`` and its checkpoints, ``train_step``, the configured precision.
"""

import io
from itertools import count

import pytest
import torch
from pytest_mps import (
    assert_accumulation_matches,
    assert_autocast_close,
    assert_resume_matches,
)

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.train import train, train_step
from {{ cookiecutter.package_name }}.trainer import setup

NOT_BITWISE = "GPU kernels are not bitwise reproducible; exact resume is a CPU promise"
# the run's clock and its evaluations: bookkeeping, not the training state
NOT_STATE = ("seconds", "eval_seconds", "log_seconds", "evals", "best_val_loss")


@pytest.mark.skip_device("mps", "cuda", reason=NOT_BITWISE)
def test_a_resumed_run_is_the_run_it_resumed(small_config):
    # Dropout on and two micro-batches: the restored random state and batch
    # streams matter as well as the weights and the optimizer.
    cfg = replace(small_config, dropout=0.1, lr_decay_iters=8,
                  gradient_accumulation_steps=2)  # fmt: skip
    runs = count()

    def train_for(steps, state):
        out = f"{cfg.out_dir}-{next(runs)}"
        if state is None:
            run = replace(cfg, out_dir=out, max_iters=steps)
        else:
            checkpoint.save(state, checkpoint.path_in(out))
            run = replace(cfg, out_dir=out, init_from="resume",
                          max_iters=state["iter_num"] + steps,
                          allow_changes="max_iters")  # fmt: skip
        result = train(run, stream=io.StringIO())
        return checkpoint.load(result.checkpoint)

    assert_resume_matches(train_for, steps=8, resume_at=5, ignore=NOT_STATE)


def test_accumulated_micro_batches_are_the_batch_they_were_cut_from(small_config):
    first = setup(small_config, log=lambda _: None)
    batch = first.batches.next()  # 8 sequences

    def step(batches):
        t = setup(replace(small_config, gradient_accumulation_steps=len(batches)),
                  log=lambda _: None)  # fmt: skip
        given = iter(batches)
        t.batches.next = lambda: next(given)  # the step's micro-batches, in order
        loss = train_step(t)
        return {"model": t.model, "loss": loss}

    # float32 sums in another order: a few ulps apart on any device
    assert_accumulation_matches(step, batch, micro_batches=4, rtol=1e-4, atol=1e-5)


def test_autocast_training_stays_near_float32(small_config, device):
    def run(context):
        dtype = getattr(context, "fast_dtype", torch.float32)
        name = str(dtype).removeprefix("torch.")
        t = setup(replace(small_config, dtype=name), log=lambda _: None)
        losses = [train_step(t).float() for _ in range(3)]
        return {"losses": torch.stack(losses), "model": t.model}

    # bfloat16 keeps 8 bits of mantissa: losses and weights within a few %
    assert_autocast_close(run, device=device, dtype=torch.bfloat16, rtol=5e-2,
                          atol=5e-2)  # fmt: skip
