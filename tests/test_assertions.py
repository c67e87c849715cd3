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
        "tensors are on 2 devices: "
        'model.weight, model.bias, batch["pair"].left on cpu; '
        'batch["input_ids"], batch["pair"].right[0] on meta'
    )


def test_dataclass_and_keyword_names_are_used() -> None:
    data = Batch(torch.zeros(1, device="meta"), {"mask": torch.zeros(1)})
    with pytest.raises(AssertionError) as info:
        assert_same_device(inputs=data)
    assert str(info.value) == (
        # equal-sized groups are ordered by device name
        'tensors are on 2 devices: inputs.extra["mask"] on cpu; '
        "inputs.input_ids on meta"
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
        "tensors are on 2 devices: model.weight, "
        'optimizer.state[model.weight]["step"], '
        'optimizer.state[model.weight]["exp_avg_sq"] on cpu; '
        'optimizer.state[model.weight]["exp_avg"] on meta'
    )


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
    assert str(info.value) == 'expected every tensor on meta, but batch["x"] on cpu'
    assert_on_device(batch["y"], torch.device("meta"))


def test_mps_and_mps0_are_one_device_with_genuine_mps_tensors() -> None:
    # FakeTensorMode makes tensors whose device really is mps:0, even on Linux.
    with FakeTensorMode():
        on_mps = torch.randn(3, device="mps")
        also_mps = torch.zeros(2, device="mps:0")
    assert on_mps.device == torch.device("mps:0")
    assert_on_device(on_mps, "mps")
    assert_on_device(on_mps, torch.device("mps:0"))
    assert_same_device(on_mps, also_mps)
    with pytest.raises(AssertionError) as info:
        assert_same_device(lm_head=on_mps, input_ids=torch.zeros(1))
    assert (
        str(info.value)
        == "tensors are on 2 devices: input_ids on cpu; lm_head on mps:0"
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
            "E       AssertionError: tensors are on 2 devices: model.weight, "
            'model.bias on cpu; batch["input_ids"] on meta',
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
        body = message.split(": ", 1)[1]
        groups = {}
        for part in body.split("; "):
            paths, device = part.rsplit(" on ", 1)
            groups[device] = paths.split(", ")
        for path, device in expected:
            assert path in groups[device], (path, message)
        assert sum(len(v) for v in groups.values()) == len(expected)
