"""``assert_same_device`` and ``assert_on_device``: name every misplaced tensor."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import linecache
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from pytest_mps.accelerator import canonical

if TYPE_CHECKING:
    import torch

__all__ = ["assert_on_device", "assert_same_device"]


def _leaves(
    obj: Any, path: str, seen: set[int], param_names: dict[int, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    import torch

    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            yield path, obj
        return
    if id(obj) in seen:
        return
    if isinstance(obj, torch.nn.Module):
        seen.add(id(obj))
        for name, param in obj.named_parameters():
            if id(param) not in seen:
                seen.add(id(param))
                yield f"{path}.{name}", param
        for name, buffer in obj.named_buffers():
            if id(buffer) not in seen:
                seen.add(id(buffer))
                yield f"{path}.{name}", buffer
        return
    if isinstance(obj, torch.optim.Optimizer):
        seen.add(id(obj))
        for g, group in enumerate(obj.param_groups):
            for i, param in enumerate(group["params"]):
                label = param_names.get(id(param), f"param_groups[{g}][{i}]")
                yield from _leaves(param, f"{path}.{label}", seen, param_names)
                for key, value in obj.state.get(param, {}).items():
                    if key == "step" and _host_scalar(value):
                        continue  # PyTorch's own step counter: see _host_scalar
                    yield from _leaves(
                        value, f"{path}.state[{label}][{_key(key)}]", seen, param_names
                    )
        return
    if isinstance(obj, Mapping):
        seen.add(id(obj))
        for key, value in obj.items():
            yield from _leaves(value, f"{path}[{_key(key)}]", seen, param_names)
        return
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        seen.add(id(obj))
        for field in obj._fields:
            yield from _leaves(
                getattr(obj, field), f"{path}.{field}", seen, param_names
            )
        return
    if isinstance(obj, (list, tuple)):
        seen.add(id(obj))
        for i, value in enumerate(obj):
            yield from _leaves(value, f"{path}[{i}]", seen, param_names)
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        seen.add(id(obj))
        for field in dataclasses.fields(obj):
            yield from _leaves(
                getattr(obj, field.name), f"{path}.{field.name}", seen, param_names
            )


def _host_scalar(value: Any) -> bool:
    """A 0-dim tensor on the CPU: where PyTorch's optimizers keep ``step``.

    Unless ``capturable`` or ``fused``, torch.optim's Adam, AdamW and the rest
    hold each parameter's step count on the host on purpose, on every device
    (and ``load_state_dict`` keeps it there): never a misplaced tensor.
    """
    import torch

    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 0
        and value.device.type == "cpu"
    )


def named_leaves(obj: Any, root: str) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj``, once each, with its path from ``root``.

    Paths read like Python: ``out["logits"]``, ``out.loss``, ``out[0]``,
    ``model.fc.weight``.
    """
    return list(_leaves(obj, root, set(), {}))


def _key(key: Any) -> str:
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _caller() -> FrameType | None:
    frame = inspect.currentframe()
    # this helper's frame -> the assertion helper -> the user's call site
    return frame.f_back.f_back if frame and frame.f_back else None


def argument_names(frame: FrameType | None, func: str, count: int) -> list[str]:
    """The source text of each positional argument at the caller's call site."""
    fallback = [f"args[{i}]" for i in range(count)]
    if frame is None:
        return fallback
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    source = "".join(linecache.getlines(filename, frame.f_globals))
    if not source:
        return fallback
    try:
        tree = _parse(filename, source)
    except SyntaxError:
        return fallback
    found: list[list[str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        end = node.end_lineno or node.lineno
        if not node.lineno <= lineno <= end:
            continue
        callee = node.func
        name = callee.attr if isinstance(callee, ast.Attribute) else None
        if isinstance(callee, ast.Name):
            name = callee.id
        if name != func or len(node.args) != count:
            continue
        if any(isinstance(a, ast.Starred) for a in node.args):
            continue
        found.append([ast.unparse(a) for a in node.args])
    return found[0] if len(found) == 1 else fallback


_parsed: dict[tuple[str, int], ast.Module] = {}


def _parse(filename: str, source: str) -> ast.Module:
    key = (filename, hash(source))
    if key not in _parsed:
        _parsed[key] = ast.parse(source, filename)
    return _parsed[key]


def _collect(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: list[str]
) -> list[tuple[str, torch.Tensor]]:
    import torch

    labelled = list(zip(names, args, strict=True)) + list(kwargs.items())
    param_names: dict[int, str] = {}
    for label, obj in labelled:
        if isinstance(obj, torch.nn.Module):
            for pname, param in obj.named_parameters():
                param_names.setdefault(id(param), f"{label}.{pname}")
    seen: set[int] = set()
    leaves: list[tuple[str, torch.Tensor]] = []
    for label, obj in labelled:
        leaves.extend(_leaves(obj, label, seen, param_names))
    return leaves


def _group(leaves: list[tuple[str, torch.Tensor]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for path, tensor in leaves:
        groups.setdefault(canonical(tensor.device), []).append(path)
    return groups


def _no_tensors(func: str, names: list[str]) -> str:
    return f"{func}: no tensors found in {', '.join(names) or 'the arguments'}"


#: a failure names at most this many tensors, offenders first
MAX_NAMED = 10


def _named(paths: list[str], room: int) -> str:
    """Up to ``room`` paths, then how many more."""
    shown = ", ".join(paths[:room])
    more = len(paths) - min(room, len(paths))
    if not shown:
        return f"{more} tensor{'s' if more > 1 else ''}"
    return shown + (f" and {more} more" if more else "")


def _offenders(groups: list[tuple[str, list[str]]]) -> tuple[str, int]:
    """``a, b on cpu; c on meta``, naming at most MAX_NAMED; and the room left."""
    room = MAX_NAMED
    parts = []
    for device, paths in groups:
        parts.append(f"{_named(paths, room)} on {device}")
        room = max(0, room - len(paths))
    return "; ".join(parts), room


_FIX = "move them to one device with .to(device) (map_location= for a checkpoint)"


def assert_same_device(*objs: Any, **named: Any) -> None:
    """Assert that every tensor in ``objs`` lives on one device.

    Accepts tensors, modules (parameters and buffers), optimizers (parameters and
    state; a 0-dim ``step`` on the CPU, where torch.optim keeps it, is left
    out), and nested dicts, lists, tuples, named tuples and dataclasses. The
    failure names the tensors off the device most of them are on first, then
    the others, each by its path, ten at most (``batch["input_ids"] on cpu;
    the other 14 on mps:0: model.wte.weight, ... and 12 more``). Keyword
    arguments name their objects; positional ones are named from the call's
    source.
    """
    __tracebackhide__ = True
    names = argument_names(_caller(), "assert_same_device", len(objs))
    leaves = _collect(objs, named, names)
    if not leaves:
        raise AssertionError(_no_tensors("assert_same_device", names + list(named)))
    groups = _group(leaves)
    if len(groups) > 1:
        # the device holding most tensors is where they belong, most likely
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        (home, rest), others = ordered[0], ordered[1:]
        offenders, room = _offenders(others)
        raise AssertionError(
            f"tensors are on {len(groups)} devices: {offenders}; the other "
            f"{len(rest)} on {home}: {_named(rest, room)}\n{_FIX}"
        )


def assert_on_device(obj: Any, device: str | torch.device, **named: Any) -> None:
    """Assert that every tensor in ``obj`` (and in keyword arguments) is on ``device``.

    ``mps`` and ``mps:0`` are the same device; so are ``cuda`` and the current
    CUDA device. The failure names the tensors elsewhere, grouped by device,
    ten at most; a ``device`` that names no device is a ValueError.
    """
    __tracebackhide__ = True
    expected = _expected_device(device)
    frame = _caller()
    names = argument_names(frame, "assert_on_device", 2)
    if names[0] == "args[0]":
        names = argument_names(frame, "assert_on_device", 1)
    leaves = _collect((obj,), named, names[:1])
    if not leaves:
        raise AssertionError(_no_tensors("assert_on_device", names[:1] + list(named)))
    groups = _group(leaves)
    wrong = {dev: paths for dev, paths in groups.items() if dev != expected}
    if wrong:
        ordered = sorted(wrong.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        detail, _ = _offenders(ordered)
        moved = f"move them with .to({expected!r})"
        raise AssertionError(
            f"expected every tensor on {expected}, but {detail}\n{moved}"
        )


def _expected_device(device: Any) -> str:
    """``canonical(device)``; ValueError naming the devices when it is none."""
    __tracebackhide__ = True
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"assert_on_device: device={device!r} is not a device; use cpu, mps, "
            "cuda, cuda:N or a torch.device"
        ) from None
    return canonical(device)
