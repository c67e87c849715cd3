"""assert_device_parity: the same module on two devices, every leaf compared by path.

This machine has only a CPU, so the two sides are both the CPU, made to differ
the way two devices do: other thread counts, deterministic algorithms on and
off, a float64 reference, or one leaf perturbed on the second side (the
reference runs first, forward, backward and steps, then the device).
"""

from __future__ import annotations

import pytest
import torch

# Optimizers import torch._dynamo, which registers its test ops once per
# process; pytester's in-process runs drop modules first imported inside them,
# so it is imported here, before any run.
import torch._dynamo  # noqa: F401

from pytest_mps import assert_device_parity
from pytest_mps.parity.check import ParityError

pytest_plugins = ["pytester"]

GPT_BLOCK = """
import itertools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pytest_mps import assert_device_parity


class Block(nn.Module):
    # nanoGPT's pre-norm block: causal self-attention, then a GELU MLP
    def __init__(self, n_embd=32, n_head=4, dropout=0.0):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.out = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln_2(x)))))
"""


def run(
    pytester: pytest.Pytester, body: str, subprocess: bool = False
) -> pytest.RunResult:
    pytester.makepyfile(test_user=GPT_BLOCK + body)
    if subprocess:
        return pytester.runpytest_subprocess("-s", "-v")
    return pytester.runpytest("-s", "-v")


def lines(*patterns: str) -> list[str]:
    """fnmatch patterns with a literal ``[`` (``output["logits"]``, ``x[0]``)."""
    return [p.replace("[", "[[]") for p in patterns]


def test_gpt_block_matches_between_one_and_two_cpu_threads(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
seen = []


class Threaded(Block):
    # two forwards a side (two steps): the reference on 1 thread, then 2
    calls = itertools.count()

    def forward(self, x):
        torch.set_num_threads(1 if next(self.calls) < 2 else 2)
        seen.append(torch.get_num_threads())
        return super().forward(x)


@pytest.fixture(autouse=True)
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_block():
    torch.manual_seed(0)
    block, x = Threaded(), torch.randn(2, 8, 32)
    report = assert_device_parity(block, x, device="cpu", steps=2)
    print(report)
    assert seen == [1, 1, 2, 2]
    assert not report.failed and len(report.diffs) == 1 + 1 + 12 + 12
""",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        lines(
            "cpu against cpu: 26 leaves",
            "*2 optimizer steps with SGD(lr=0.1)",
            "float32: |device - reference| <= 1.0e-05 x scale + 1.3e-06 x "
            "|reference|, scale = the leaf's largest |reference|, at least 1 "
            "(torch.testing.*)",
            "leaf * dtype * shape * max abs * max rel * rtol * atol * worst at * out*",
            "output * float32 * (2, 8, 32) *0/512 (0.0%)",
            "x.grad * float32 * (2, 8, 32) *",
            "block.qkv.weight.grad * float32 * (96, 32) *",
            "block.out.bias after 2 steps * float32 * (32,) *0/32 (0.0%)",
        )
    )


def test_conv_net_matches_with_deterministic_algorithms_on_and_off(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
class Net(nn.Module):
    calls = itertools.count()

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        # the reference deterministic, the device not
        torch.use_deterministic_algorithms(next(self.calls) == 0)
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return {"logits": self.head(x.flatten(1)), "features": (x,)}


def test_net():
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.manual_seed(0)
        net = Net()
        report = assert_device_parity(net, torch.randn(4, 3, 8, 8), device="cpu")
    finally:
        torch.use_deterministic_algorithms(before)
    print(report)
""",
        # use_deterministic_algorithms imports torch._inductor, which registers
        # ops once per process: an in-process run would import it a second time
        subprocess=True,
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        lines(
            'output["logits"] * float32 * (4, 10) *',
            'output["features"][0] * float32 * (4, 8, 4, 4) *',
            "inputs[0].grad * float32 * (4, 3, 8, 8) *",
            "net.bn.running_var after the run * float32 * (8,) *",
            "net.bn.num_batches_tracked after the run * int64 * () *",
        )
    )


def test_one_perturbed_leaf_fails_with_a_table_naming_its_path(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
calls = itertools.count()


def heads(x):
    logits = x @ x.T  # |values| up to 1.51: atol 1e-5 scales to 1.5e-5
    if next(calls) == 1:  # the device's run
        logits = logits + torch.eye(4)[2:3].T @ torch.eye(4)[1:2] * 1e-3
    return {"logits": logits, "hidden": x.relu()}


def test_heads():
    x = torch.linspace(-1, 1, 8).reshape(4, 2)
    assert_device_parity(heads, x, device="cpu", grads=False)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        lines(
            "E       *.ParityError: assert_device_parity: 1 of 2 "
            "leaves differ between the reference (cpu) and the device (cpu)",
            "E       float32: |device - reference| <= 1.0e-05 x scale + 1.3e-06 x *",
            "E       leaf * dtype * shape * max abs * max rel * rtol * atol * worst at "
            "* out of tol",
            'E       output["logits"] * float32 * (4, 4) * 1.00e-03 * 1.3e-06 '
            "* 1.5e-05 * (2, 1) * 1/16 (6.2%)",
        )
    )
    result.stdout.no_fnmatch_line(*lines('E       output["hidden"]*'))


def test_nested_dataclass_and_tuple_outputs_are_named_by_path(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
import dataclasses


@dataclasses.dataclass
class Out:
    loss: torch.Tensor
    extra: tuple


class Model(nn.Module):
    calls = itertools.count()

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, batch):
        y = self.lin(batch["x"])
        bump = 1e-2 if next(self.calls) == 1 else 0.0
        return Out(y.sum(), (y, {"scaled": y * 2 + bump}))


def test_model():
    torch.manual_seed(0)
    assert_device_parity(Model(), {"x": torch.randn(2, 3)}, device="cpu")
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        lines(
            "E       *ParityError: assert_device_parity: 1 of 6 leaves differ *",
            'E       output.extra[1]["scaled"] * float32 * (2, 3) * 1.00e-02 '
            "*6/6 (100.0%)",
        )
    )
    result.stdout.no_fnmatch_line("E       output.loss *")


def test_gradients_and_parameters_after_steps_are_compared(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
class Model(nn.Module):
    calls = itertools.count()

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        y = self.lin(x)
        if next(self.calls) >= 2:  # the device's forwards: same values, 1% more grad
            y = y + 0.01 * (y - y.detach())
        return y


def test_model():
    torch.manual_seed(0)
    model = Model()
    assert_device_parity(model, torch.randn(4, 3), device="cpu", steps=2)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        lines(
            "E       *ParityError: assert_device_parity: 5 of 6 leaves differ *",
            "E       2 optimizer steps with SGD(lr=0.1)",
            "E       inputs[0].grad * float32 * (4, 3) *",
            "E       model.lin.weight.grad * float32 * (2, 3) *",
            "E       model.lin.bias.grad * float32 * (2,) *",
            "E       model.lin.weight after 2 steps * float32 * (2, 3) *",
            "E       model.lin.bias after 2 steps * float32 * (2,) *",
        )
    )
    result.stdout.no_fnmatch_line("E       output *")


def test_dropout_in_train_mode_is_seeded_alike_and_the_output_says_so(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
def test_train_mode_seeded():
    torch.manual_seed(0)
    block = Block(dropout=0.5)
    report = assert_device_parity(block, torch.randn(2, 4, 32), device="cpu")
    assert not report.failed


def test_eval_mode_when_asked():
    torch.manual_seed(0)
    assert_device_parity(
        Block(dropout=0.5), torch.randn(2, 4, 32), device="cpu", train=False
    )


def test_the_callers_generators_are_left_as_they_were():
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    assert_device_parity(Block(dropout=0.5), torch.randn(2, 4, 32), device="cpu")
    assert not torch.equal(torch.rand(3), expected)  # Block() and randn drew
    torch.manual_seed(1)
    block, x = Block(dropout=0.5), torch.randn(2, 4, 32)
    state = torch.get_rng_state()
    assert_device_parity(block, x, device="cpu", seed=7)
    assert torch.equal(torch.get_rng_state(), state)
""",
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        lines(
            "*assert_device_parity: dropout (drop) in train mode: both sides seeded "
            "with 0, drawing the same numbers",
            "*assert_device_parity: eval mode (train=False), both sides seeded with 0",
        )
    )


def test_float64_reference_compares_with_the_targets_tolerance(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
def test_block():
    torch.manual_seed(0)
    report = assert_device_parity(
        Block(), torch.randn(2, 8, 32), device="cpu", reference_dtype=torch.float64
    )
    print(report)
    worst = max(d.max_abs for d in report.diffs)
    assert 0 < worst < 1e-5  # float32 against float64: rounding, not equality
""",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        lines(
            "*assert_device_parity: the reference runs in float64 on cpu",
            "output * float32 (ref float64) * (2, 8, 32) *",
        )
    )


def test_the_module_and_inputs_passed_in_are_left_untouched() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    x = torch.randn(4, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert_device_parity(model, x, device="cpu", steps=2)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert x.grad is None and not x.requires_grad
    assert all(p.grad is None for p in model.parameters())


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def total(x: torch.Tensor) -> float:
    return float(x.detach().sum())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: assert_device_parity(twice, torch.ones(2), device="gpu"),
            "assert_device_parity: device='gpu' is not a device; use cpu, mps, cuda",
        ),
        (
            lambda: assert_device_parity(twice, torch.ones(2), device="meta"),
            "assert_device_parity: device='meta': parity is checked on cpu, mps or",
        ),
        (
            lambda: assert_device_parity(3, torch.ones(2), device="cpu"),
            "assert_device_parity: fn_or_module must be a torch.nn.Module or a "
            "callable, got int 3",
        ),
        (
            lambda: assert_device_parity(twice, torch.ones(2), device="cpu", steps=1),
            "assert_device_parity: steps=1 needs fn_or_module to be a "
            "torch.nn.Module with parameters, not a function",
        ),
        (
            lambda: assert_device_parity(
                torch.nn.Linear(2, 2), torch.ones(2), device="cpu", steps=-1
            ),
            "assert_device_parity: steps=-1 is not a count of steps",
        ),
        (
            lambda: assert_device_parity(twice, torch.ones(2), device="cpu", rtol=1e-3),
            "assert_device_parity: give both rtol and atol or neither "
            "(rtol=0.001, atol=None)",
        ),
        (
            lambda: assert_device_parity(
                twice, torch.ones(2), device="cpu", reference_dtype=torch.int64
            ),
            "assert_device_parity: reference_dtype=torch.int64 is not a floating",
        ),
        (
            lambda: assert_device_parity(twice, torch.ones(2), device="cpu", train=1),
            "assert_device_parity: train=1 needs True or False and a torch.nn.Module",
        ),
    ],
    ids=[
        "unknown-device",
        "meta-device",
        "not-callable",
        "steps-without-module",
        "negative-steps",
        "rtol-alone",
        "integer-reference-dtype",
        "train-on-a-function",
    ],
)
def test_bad_arguments_raise_naming_the_argument(call: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        call()  # type: ignore[operator]
    assert str(info.value).startswith(message), str(info.value)


def test_a_function_returning_no_tensor_is_named() -> None:
    with pytest.raises(TypeError) as info:
        assert_device_parity(total, torch.ones(2), device="cpu")
    assert str(info.value) == (
        "assert_device_parity: fn_or_module (total) returned no tensor on cpu: "
        "got float 2.0"
    )


def test_results_of_different_structure_on_the_two_sides_are_named() -> None:
    calls = iter(range(2))

    def grows(x: torch.Tensor) -> dict[str, torch.Tensor]:
        if next(calls) == 0:
            return {"a": x, "b": x[:1]}
        return {"a": x, "c": x + 1, "b": x * 2}

    with pytest.raises(AssertionError) as info:
        assert_device_parity(grows, torch.ones(2), device="cpu", grads=False)
    assert str(info.value) == (
        "assert_device_parity: fn_or_module (grows) gives results of different "
        "structure on the reference (cpu) and the device (cpu):\n"
        '  output["c"] only on the device (cpu)\n'
        '  output["b"] has shape (1,) on the reference (cpu), (2,) on the device (cpu)'
    )


def test_device_parity_fixture_runs_on_the_tests_device_and_names_paths(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
def test_block(device_parity, device):
    torch.manual_seed(0)
    block, x = Block(), torch.randn(2, 4, 32)
    report = device_parity(block, x, steps=1)
    assert report.target == str(device)
    print(report)


def test_device_is_the_tests_own(device_parity):
    with pytest.raises(TypeError, match="device_parity: device is the test's"):
        device_parity(Block(), torch.randn(2, 4, 32), device="cpu")
""",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        lines(
            "test_user.py::test_block[cpu] *1 optimizer step with SGD(lr=0.1)",
            "cpu against cpu: 26 leaves",
            "block.qkv.weight.grad * float32 * (96, 32) *",
            "block.qkv.weight after 1 step * float32 * (96, 32) *",
            "PASSED",
        )
    )


def test_a_project_fixture_named_device_parity_is_the_projects(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
import pytest


@pytest.fixture
def device_parity():
    return "the project's"
"""
    )
    pytester.makepyfile(
        """
def test_own(device_parity):
    assert device_parity == "the project's"
"""
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_the_failure_carries_the_report_of_every_leaf() -> None:
    calls = iter(range(2))

    def bumped(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + (1e-3 if next(calls) else 0.0)

    with pytest.raises(ParityError) as info:
        assert_device_parity(bumped, torch.ones(3), device="cpu")
    report = info.value.report
    assert [(d.path, d.ok) for d in report.diffs] == [
        ("output", False),
        ("inputs[0].grad", True),
    ]
    assert report.failed[0].mismatched == 3


@pytest.mark.parametrize(
    ("values", "error", "fails"),
    [
        (1e3, 1e-3, False),  # 1e-6 of the leaf's scale: rounding in a long sum
        (1e3, 1e-1, True),  # 1e-4 of the scale
        (0.5, 2e-5, True),  # values below 1: assert_close's atol, unscaled
        (0.5, 5e-6, False),
    ],
)
def test_atol_counts_in_units_of_the_leafs_largest_value(
    values: float, error: float, fails: bool
) -> None:
    calls = iter(range(2))

    def gradient_like(x: torch.Tensor) -> torch.Tensor:
        # one element near zero, as where a long sum cancels
        out = torch.tensor([values, 0.0], dtype=torch.float64) * x
        return out + torch.tensor([0.0, error if next(calls) else 0.0])

    x = torch.ones(2, dtype=torch.float64)
    rtol, atol = 0.0, 1e-5
    if fails:
        with pytest.raises(ParityError) as info:
            assert_device_parity(gradient_like, x, device="cpu", rtol=rtol, atol=atol)
        (diff,) = info.value.report.failed
        assert diff.scale == max(1.0, values) and diff.worst == (1,)
    else:
        report = assert_device_parity(
            gradient_like, x, device="cpu", rtol=rtol, atol=atol, grads=False
        )
        assert report.diffs[0].atol == atol * max(1.0, values)


def test_a_reference_device_not_here_skips_with_the_reason() -> None:
    with pytest.raises(pytest.skip.Exception) as info:
        assert_device_parity(twice, torch.ones(2), device="cpu", reference="cuda:99")
    assert str(info.value.msg).startswith(
        "assert_device_parity: reference='cuda:99' is not usable here: "
    )
