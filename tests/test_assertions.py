"""assert_same_device / assert_on_device: every misplaced leaf named by its path."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from pytest_mps import assert_on_device, assert_same_device

Pair = collections.namedtuple("Pair", ["left", "right"])
FIX = "move them to one device with .to(device) (map_location= for a checkpoint)"


@dataclasses.dataclass
class Batch:
    input_ids: torch.Tensor
    extra: dict[str, Any]


def test_nested_mix_names_every_leaf_grouped_by_device() -> None:
    model = torch.nn.Linear(2, 2)
    batch = {
        "input_ids": torch.zeros(2, device="meta"),
        "pair": Pair(torch.zeros(1), [torch.zeros(1, device="meta")]),
    }
    with pytest.raises(AssertionError) as info:
        assert_same_device(model, batch)
    assert str(info.value) == (
        # the tensors off the device most of them are on come first
        'tensors are on 2 devices: batch["input_ids"], batch["pair"].right[0] on '
        'meta; the other 3 on cpu: model.weight, model.bias, batch["pair"].left\n' + FIX
    )


def test_dataclass_and_keyword_names_are_used() -> None:
    data = Batch(torch.zeros(1, device="meta"), {"mask": torch.zeros(1)})
    with pytest.raises(AssertionError) as info:
        assert_same_device(inputs=data)
    assert str(info.value) == (
        # of equal-sized groups, the first by device name is taken as home
        "tensors are on 2 devices: inputs.input_ids on meta; the other 1 on cpu: "
        'inputs.extra["mask"]\n' + FIX
    )


def test_optimizer_state_is_named_after_the_model_parameter() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    # Moving the state away is what loading a checkpoint with map_location does.
    state = optimizer.state[model.weight]
    state["exp_avg"] = state["exp_avg"].to("meta")
    with pytest.raises(AssertionError) as info:
        assert_same_device(model, optimizer)
    assert str(info.value) == (
        'tensors are on 2 devices: optimizer.state[model.weight]["exp_avg"] on meta; '
        "the other 2 on cpu: model.weight, "
        'optimizer.state[model.weight]["exp_avg_sq"]\n' + FIX
    )


def test_the_optimizers_host_step_counter_is_not_a_misplaced_tensor() -> None:
    """torch.optim keeps ``step`` as a 0-dim CPU tensor unless capturable or
    fused, whatever the parameters' device: on a GPU that is by design."""
    model = torch.nn.Linear(2, 1).to("meta")
    optimizer = torch.optim.AdamW(model.parameters())
    for param in model.parameters():
        optimizer.state[param] = {
            "step": torch.tensor(3.0),
            "exp_avg": torch.zeros_like(param),
        }
    assert_same_device(model, optimizer)
    assert_on_device(optimizer, "meta")
    # a step counter of another shape, or one under another key, still counts
    optimizer.state[model.weight]["step"] = torch.tensor([3.0])
    with pytest.raises(AssertionError, match=r'state\[model.weight\]\["step"\] on cpu'):
        assert_same_device(model, optimizer)
    optimizer.state[model.weight]["step"] = torch.tensor(3.0, device="meta")
    optimizer.state[model.bias]["count"] = torch.tensor(3.0)
    with pytest.raises(AssertionError, match=r'state\[model.bias\]\["count"\] on cpu'):
        assert_same_device(model, optimizer)


def test_same_device_passes_and_buffers_count() -> None:
    model = torch.nn.BatchNorm1d(3)
    assert_same_device(model, {"x": torch.zeros(3)})
    model.running_mean = model.running_mean.to("meta")
    with pytest.raises(AssertionError, match=r"model\.running_mean on meta"):
        assert_same_device(model)


def test_nothing_to_compare_is_an_error() -> None:
    with pytest.raises(AssertionError) as info:
        assert_same_device({"a": 1}, [2.0])
    assert str(info.value) == (
        "assert_same_device: no tensors found in {'a': 1}, [2.0]"
    )


def test_assert_on_device_names_what_is_elsewhere() -> None:
    batch = {"x": torch.zeros(1), "y": torch.zeros(1, device="meta")}
    with pytest.raises(AssertionError) as info:
        assert_on_device(batch, "meta")
    assert str(info.value) == (
        'expected every tensor on meta, but batch["x"] on cpu\n'
        "move them with .to('meta')"
    )
    assert_on_device(batch["y"], torch.device("meta"))


def test_mps_and_mps0_are_one_device_with_genuine_mps_tensors() -> None:
    # FakeTensorMode makes tensors whose device really is mps:0, even on Linux.
    with FakeTensorMode():
        on_mps = torch.randn(3, device="mps")
        also_mps = torch.zeros(2, device="mps:0")
    # torch 2.6's FakeTensorMode leaves the index off (mps); later ones say mps:0
    assert on_mps.device.type == "mps" and on_mps.device.index in (None, 0)
    assert_on_device(on_mps, "mps")
    assert_on_device(on_mps, torch.device("mps:0"))
    assert_same_device(on_mps, also_mps)
    with pytest.raises(AssertionError) as info:
        assert_same_device(lm_head=on_mps, input_ids=torch.zeros(1))
    assert str(info.value) == (
        "tensors are on 2 devices: lm_head on mps:0; the other 1 on cpu: "
        "input_ids\n" + FIX
    )


def test_failure_shows_like_a_builtin_assertion(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_mps import assert_same_device

        def test_mismatch():
            model = torch.nn.Linear(2, 2)
            batch = {"input_ids": torch.zeros(2, device="meta")}
            assert_same_device(model, batch)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            ">       assert_same_device(model, batch)",
            'E       AssertionError: tensors are on 2 devices: batch["input_ids"] on '
            "meta; the other 2 on cpu: model.weight, model.bias",
            "E       " + FIX,
        ]
    )
    # The helper's own frames are hidden from the traceback.
    result.stdout.no_fnmatch_line("*pytest_mps/assertions.py*")


def _structures() -> st.SearchStrategy[Any]:
    leaf = st.sampled_from(["cpu", "meta"]).map(lambda d: torch.zeros(1, device=d))
    keys = st.text("abcdef", min_size=1, max_size=3)
    return st.recursive(
        leaf | st.integers(),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(keys, inner, max_size=3)
            | st.tuples(inner, inner)
        ),
        max_leaves=8,
    )


def _expected_paths(obj: Any, path: str) -> list[tuple[str, str]]:
    if isinstance(obj, torch.Tensor):
        return [(path, str(obj.device))]
    if isinstance(obj, dict):
        items = [(f'{path}["{k}"]', v) for k, v in obj.items()]
        return [p for sub, v in items for p in _expected_paths(v, sub)]
    if isinstance(obj, (list, tuple)):
        return [
            p for i, v in enumerate(obj) for p in _expected_paths(v, f"{path}[{i}]")
        ]
    return []


@settings(max_examples=60, deadline=None)
@given(_structures())
def test_random_nested_structures_name_each_leaf_once(data: Any) -> None:
    expected = _expected_paths(data, "data")
    devices = {device for _, device in expected}
    if not expected:
        with pytest.raises(AssertionError, match="no tensors found"):
            assert_same_device(data)
    elif len(devices) == 1:
        assert_same_device(data)
    else:
        with pytest.raises(AssertionError) as info:
            assert_same_device(data)
        message = str(info.value)
        first, _ = message.split("\n")
        body = first.split(": ", 1)[1]
        *offenders, rest = body.split("; ")
        groups = {}
        for part in offenders:
            paths, device = part.rsplit(" on ", 1)
            groups[device] = paths.split(", ")
        home, paths = rest.removeprefix("the other ").split(" on ", 1)[1].split(": ")
        groups[home] = paths.split(", ")
        for path, device in expected:
            assert path in groups[device], (path, message)
        assert sum(len(v) for v in groups.values()) == len(expected)


class TinyGPT(torch.nn.Module):
    # the shape of the template's model: embeddings, two blocks, a tied head
    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(65, 32)
        self.wpe = torch.nn.Embedding(16, 32)
        self.h = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {"ln": torch.nn.LayerNorm(32), "attn": torch.nn.Linear(32, 96)}
            )
            for _ in range(2)
        )
        self.lm_head = torch.nn.Linear(32, 65, bias=False)


def test_the_tensor_off_a_models_device_is_named_first_in_two_short_lines() -> None:
    model = TinyGPT().to("meta")
    batch = {"input_ids": torch.zeros(2, 16, dtype=torch.long)}
    with pytest.raises(AssertionError) as info:
        assert_same_device(model, batch)
    message = str(info.value)
    assert message == (
        'tensors are on 2 devices: batch["input_ids"] on cpu; the other 11 on meta: '
        "model.wte.weight, model.wpe.weight, model.h.0.ln.weight, model.h.0.ln.bias, "
        "model.h.0.attn.weight, model.h.0.attn.bias, model.h.1.ln.weight, "
        "model.h.1.ln.bias, model.h.1.attn.weight and 2 more\n" + FIX
    )
    # ten names at most: 915 characters before, with the offender last
    assert message.count(", ") + message.count(" and ") == 9
    assert len(message.splitlines()) == 2 and len(message) < 350


def test_many_tensors_off_the_device_are_counted_past_ten() -> None:
    moved = {f"x{i}": torch.zeros(1, device="meta") for i in range(12)}
    with pytest.raises(AssertionError) as info:
        assert_on_device(moved, "cpu")
    message = str(info.value)
    assert message.startswith(
        'expected every tensor on cpu, but moved["x0"], moved["x1"], '
    )
    assert 'moved["x9"] and 2 more on meta\n' in message
    assert len(message) < 250


def test_a_device_that_is_no_device_is_a_value_error_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        assert_on_device(torch.zeros(1), "gpu")
    message = str(info.value)
    assert message == (
        "assert_on_device: device='gpu' is not a device; use cpu, mps, cuda, "
        "cuda:N or a torch.device"
    )
    assert len(message.splitlines()) == 1 and len(message) < 120
