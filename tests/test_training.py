"""Training equivalence: a resumed run, accumulated micro-batches, autocast.

The user's loop is a small classifier with AdamW and a step-decay scheduler.
Each check passes the correct loop and fails on the injected bug the issue
names: a scheduler stepped twice on resume, a loss not divided by the number
of micro-batches, and a loss summed in float16 under autocast.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

LOOP = """
import torch
from torch import nn

from pytest_mps import (
    assert_accumulation_matches,
    assert_autocast_close,
    assert_resume_matches,
)

DEVICE = "cpu"


def data(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def fresh():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def make_train(bug=False):
    def train(steps, state):
        model, opt, sched = fresh()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            start = state["step"]
            if bug:
                sched.step()  # the bug: stepped again on resume
        for step in range(start, start + steps):
            x, y = data(step)
            loss = nn.functional.cross_entropy(model(x.to(DEVICE)), y.to(DEVICE))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        return {"model": model, "opt": opt, "sched": sched, "step": start + steps}

    return train


def make_step(bug=False):
    def step(batches):
        model, opt, _ = fresh()
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x.to(DEVICE)), y.to(DEVICE))
            if not bug:
                loss = loss / len(batches)  # the bug leaves this out
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        return {"model": model, "grads": grads}

    return step


def make_run(bug=False):
    def run(context):
        model, opt, _ = fresh()
        for step in range(3):
            x, y = data(step)
            with context:
                logits = model(x.to(DEVICE)) * 40
                if bug:  # the bug: a softmax without its max overflows float16
                    e = logits.exp()
                    p = (e / e.sum(-1, keepdim=True)).gather(1, y[:, None])
                    loss = -p.clamp_min(1e-4).log().mean()
                else:
                    loss = nn.functional.cross_entropy(logits.float(), y.to(DEVICE))
            opt.zero_grad()
            loss.float().backward()
            opt.step()
        return {"model": model}

    return run
"""


def _run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_loop=LOOP + body)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_each_check_passes_a_correct_loop(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
def test_resume():
    assert_resume_matches(make_train(), steps=6, resume_at=3)


def test_accumulation():
    assert_accumulation_matches(make_step(), data(0), micro_batches=4)


def test_autocast():
    assert_autocast_close(
        make_run(), device=DEVICE, dtype=torch.float16, rtol=0.1, atol=0.1
    )
""",
    )
    result.assert_outcomes(passed=3)


def test_a_scheduler_stepped_twice_on_resume_is_caught(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
def test_resume():
    assert_resume_matches(make_train(bug=True), steps=6, resume_at=3)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *AssertionError: assert_resume_matches: 3 steps, a checkpoint, then "
            "3 resumed differs from 6 steps in one run (bit for bit) in * of * "
            "leaves:",
            "E  *  state*'sched'*'_step_count'*: 8 against 7",
            "E  *  state*'sched'*'last_epoch'*: 7 against 6",
            "E  *  state*'model'*'0.bias'*: max |diff| *, 16/16 out",
        ]
    )


def test_a_loss_not_divided_by_the_micro_batches_is_caught(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
def test_accumulation():
    assert_accumulation_matches(make_step(bug=True), data(0), micro_batches=4)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *AssertionError: assert_accumulation_matches: 4 accumulated "
            "micro-batches differs from one batch (rtol=1e-05, atol=1e-06) in * of "
            "* leaves:",
            "E  *  state*'grads'*'0.bias'*: max |diff| *, 16/16 out",
        ]
    )


def test_a_float16_overflow_under_autocast_is_caught(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
def test_autocast():
    assert_autocast_close(
        make_run(bug=True), device=DEVICE, dtype=torch.float16, rtol=0.1, atol=0.1
    )
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *AssertionError: assert_autocast_close: autocast to float16 differs "
            "from full precision (rtol=0.1, atol=0.1) in * of * leaves:",
            "E  *  state*'model'*'0.bias'*: max |diff| inf, */16 out",
        ]
    )


def test_bad_arguments_are_named() -> None:
    from pytest_mps import assert_accumulation_matches, assert_resume_matches

    with pytest.raises(ValueError, match=r"resume_at=6 must lie between 0 and steps=6"):
        assert_resume_matches(lambda n, s: {}, steps=6, resume_at=6)
    with pytest.raises(ValueError, match=r"a batch of 6 does not split into 4"):
        import torch

        assert_accumulation_matches(lambda b: {}, torch.ones(6, 2), micro_batches=4)
    with pytest.raises(ValueError, match=r"rtol=-1 is not a tolerance"):
        assert_resume_matches(lambda n, s: {}, rtol=-1)
