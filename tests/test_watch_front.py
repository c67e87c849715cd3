"""The watch front: clean calls skip op-by-op watching, nothing else changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

# Import torch._dynamo here, in the outer process: pytester's in-process runs
# drop the modules first imported inside them, and a second import of it
# re-registers torch's test op libraries and fails.
import torch._dynamo  # noqa: E402, F401
from torch.nn import functional as F

from pytest_mps.watch.findings import TestFindings
from pytest_mps.watch.front import HOST, READ, clean_calls
from pytest_mps.watch.host_sync import HostSyncError, SyncGuard
from pytest_mps.watch.mixed_devices import DeviceGuard
from pytest_mps.watch.mode import watching

cpu = torch.arange(6.0)
meta = torch.empty(6, device="meta")


def _train_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(10, 8),
        torch.nn.LayerNorm(8),
        torch.nn.Linear(8, 8),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(8, 10),
    )
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    idx = torch.randint(10, (2, 5))
    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, 10), idx.view(-1), ignore_index=-1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _attention() -> None:
    q = torch.randn(1, 2, 4, 8)
    qkv = torch.randn(1, 4, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
    y = F.scaled_dot_product_attention(*qkv, is_causal=True)
    (y.transpose(1, 2).reshape(1, 4, 16) + q.sum()).mean()


SNIPPETS: dict[str, Callable[[], Any]] = {
    # syncs on a device (CPU tensors count as device tensors here)
    "item": lambda: cpu.sum().item(),
    "meta_item": lambda: meta.sum().item(),
    "float": lambda: float(cpu.sum()),
    "bool": lambda: bool(cpu.sum() > 0),
    "tolist": lambda: cpu.tolist(),
    "nonzero": lambda: cpu.nonzero(),
    "where_one_arg": lambda: torch.where(cpu > 2),
    "bool_mask_index": lambda: cpu[cpu > 2],
    "list_index": lambda: cpu[[0, 2]],
    "unique": lambda: cpu.unique(),
    "allclose": lambda: torch.allclose(cpu, cpu),
    "meta_to_cpu": lambda: meta.to("cpu"),
    "meta_cpu": lambda: meta.cpu(),
    "cpu_to_cpu": lambda: cpu.to("cpu").cpu(),
    "repr": lambda: repr(cpu),
    "iterate": lambda: [float(x) for x in cpu],
    "cpu_to_meta": lambda: cpu.to(torch.device("meta")),
    "linalg_inv": lambda: torch.linalg.inv(torch.eye(3)),
    # mixes devices
    "scalar_times_meta": lambda: meta * torch.tensor(2.0),
    "meta_add_scalar_tensor": lambda: torch.add(meta, torch.tensor(1.0)),
    "foreach_mixed": lambda: torch._foreach_mul_([meta.clone()], torch.tensor(2.0)),
    "where_mixed": lambda: torch.where(meta > 0, meta, torch.tensor(0.0)),
    "lerp_cpu_weight": lambda: meta.lerp(meta, torch.tensor(0.5)),
    # clean
    "view_slice": lambda: cpu.view(2, 3)[:, 1:][0, ...],
    "to_dtype": lambda: cpu.to(torch.float64).to(dtype=torch.float32),
    "to_same_side": lambda: cpu.to(torch.device("cpu")),
    "iterate_rows": lambda: list(cpu.view(2, 3)),
    "meta_to_meta": lambda: meta.to("meta") * 2,
    "cat_stack": lambda: torch.stack([torch.cat([cpu, cpu]), cpu.repeat(2)]),
    "properties": lambda: (
        cpu.shape,
        cpu.device,
        cpu.dtype,
        cpu.grad,
        meta.view(2, 3).T,
    ),
    "train_step": _train_step,
    "attention": _attention,
}


def _findings(
    snippet: Callable[[], Any], every_op: bool, count_cpu: bool = True
) -> tuple[set[Any], bool]:
    found = TestFindings()
    guards = [DeviceGuard(found), SyncGuard(count_cpu, "test", found)]
    raised = False
    with watching(guards, every_op=every_op):
        try:
            snippet()
        except HostSyncError:
            raised = True
    return {(f.kind, f.op) for f in found.entries.values()}, raised


@pytest.mark.parametrize("count_cpu", [True, False], ids=["cpu-test", "gpu-test"])
@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_the_front_finds_what_watching_every_op_finds(
    name: str, count_cpu: bool
) -> None:
    expected = _findings(SNIPPETS[name], every_op=True, count_cpu=count_cpu)
    assert _findings(SNIPPETS[name], every_op=False, count_cpu=count_cpu) == expected


def test_the_snippets_cover_syncs_mixes_and_clean_code() -> None:
    outcomes = {name: _findings(s, every_op=True) for name, s in SNIPPETS.items()}
    kinds = {kind for found, _ in outcomes.values() for kind, _ in found}
    assert kinds == {"host-sync", "mixed-devices", "cpu-scalar"}
    assert outcomes["train_step"] == (set(), False)
    assert outcomes["item"][1] and not outcomes["view_slice"][1]
    # on an accelerator's test, reading a CPU tensor back is no sync
    assert _findings(SNIPPETS["item"], every_op=True, count_cpu=False) == (set(), False)
    assert _findings(SNIPPETS["meta_item"], every_op=True, count_cpu=False)[1]


def test_every_clean_call_resolves_on_this_torch() -> None:
    table = clean_calls()
    for func in (
        F.linear,
        F.scaled_dot_product_attention,
        torch.Tensor.view,
        torch.Tensor.backward,
        torch._foreach_mul_,
        torch.Tensor.shape.__get__,
        torch.Tensor.grad.__set__,
    ):
        assert func in table, func
    # reading back is clean only for CPU tensors when the CPU does not count
    for read in (torch.Tensor.item, torch.Tensor.__bool__):
        assert table[read] == READ, read
    # reads no aten op tells of on the CPU: shown to host_read callbacks
    for read in (torch.Tensor.tolist, torch.Tensor.__repr__, torch.Tensor.__array__):
        assert table[read] == HOST, read
    for syncing in (
        torch.Tensor.nonzero,
        torch.Tensor.__setitem__,
        torch.where,
        torch.allclose,
        torch.Tensor.copy_,
        torch._foreach_copy_,
    ):
        assert syncing not in table, syncing


CONFTEST_RECORDER = """
import pytest
import torch

seen = []

def pytest_mps_watch_ops(item):
    def record(func, args, kwargs):
        seen.append(func._schema.name)
    record.every_op = False
    return record

@pytest.fixture
def seen_ops():
    seen.clear()
    return seen
"""

TEST_RECORDER = """
import torch

def test_ops(seen_ops):
    x = torch.ones(3)
    y = (x * 2).view(3, 1)[0]
    y.item()
    assert seen_ops == {expected!r}
"""


def test_a_callback_that_skips_clean_calls_sees_only_the_others(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST_RECORDER)
    pytester.makepyfile(TEST_RECORDER.format(expected=["aten::_local_scalar_dense"]))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.parametrize("where", ["option", "ini"])
def test_watch_every_op_shows_a_skipping_callback_every_op(
    pytester: pytest.Pytester, where: str
) -> None:
    pytester.makeconftest(CONFTEST_RECORDER)
    every = ["aten::ones", "aten::mul", "aten::view", "aten::select"]
    pytester.makepyfile(
        TEST_RECORDER.format(expected=[*every, "aten::_local_scalar_dense"])
    )
    if where == "ini":
        pytester.makeini("[pytest]\nmps_watch_every_op = true\n")
        args: list[str] = []
    else:
        args = ["--mps-watch-every-op"]
    pytester.runpytest("-p", "no:cacheprovider", *args).assert_outcomes(passed=1)


def test_no_host_sync_still_fails_after_compiled_code_and_leaves_no_mode(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        @torch.compile(backend="eager")
        def scaled(x):
            return (x * 2).sin().sum()

        @pytest.mark.no_host_sync
        def test_compiled_then_item():
            y = scaled(torch.ones(4))
            y.item()

        def test_no_mode_left():
            assert _get_current_function_mode_stack() == []
            assert _get_current_dispatch_mode_stack() == []
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*aten::_local_scalar_dense makes the host wait*"])


def test_an_every_op_callback_inside_a_skipping_test_gets_every_op(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST_RECORDER)
    pytester.makepyfile(
        """
        import torch
        from pytest_mps.watch.mode import op_watch

        def test_mine(seen_ops):
            mine = []
            with op_watch(lambda f, a, k: mine.append(f._schema.name)):
                torch.zeros(2).neg()
            assert mine == ["aten::zeros", "aten::neg"]
            assert seen_ops == []
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
