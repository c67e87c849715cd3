"""One side of a parity check: copy the module and inputs over, run, read back.

Both sides run the same plan: the same weights, inputs, seeds, output weights
for the backward and optimizer steps; only the device, the dtype and, for the
layout runs, the inputs' memory layout differ.

All of it is the plugin's own work (:func:`pytest_mps.watch.attribution.
plugin_work`, entered by the caller), which the audit and the watchers do not
see; on the side that is checked, the calls into the user's code (forward,
backward, optimizer) are handed back to them as the user's code.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pytest_mps.accelerator import manual_seed
from pytest_mps.assertions import named_leaves
from pytest_mps.watch.attribution import user_code

if TYPE_CHECKING:
    import torch

Leaves = list[tuple[str, "torch.Tensor | None"]]


@dataclasses.dataclass
class Run:
    """What one side computed, copied to the host."""

    outputs: Leaves
    grads: Leaves
    after: Leaves
    backward: bool


@dataclasses.dataclass(frozen=True)
class Plan:
    """The call, checked: what both sides run."""

    fn: Any
    name: str
    inputs: tuple[Any, ...]
    input_names: list[str]
    kwargs: Mapping[str, Any]
    train: bool | None
    grads: bool
    steps: int
    optimizer: Callable[[list[Any]], Any]
    seed: int
    #: remakes each input in another memory layout (same values); None: as given
    layout: Callable[[torch.Tensor], torch.Tensor] | None = None
    #: the module's memory format for this layout (channels_last); None: as given
    memory_format: Any = None


def make_plan(
    fn: Any,
    names: list[str],
    inputs: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    *,
    train: bool | None,
    grads: bool,
    steps: int,
    optimizer: Callable[[list[Any]], Any] | None,
    seed: int,
) -> Plan:
    """The plan of a call; ``names`` are the call site's argument texts.

    A name that is not a plain path (``make()``, ``x[0] + 1``) becomes
    ``model``/``fn`` or ``inputs[i]``; no optimizer is ``SGD(lr=0.1)``.
    """
    import torch

    from pytest_mps.parity.arguments import simple

    is_module = isinstance(fn, torch.nn.Module)
    return Plan(
        fn=fn,
        name=names[0] if simple(names[0]) else ("model" if is_module else "fn"),
        inputs=inputs,
        input_names=[
            n if simple(n) else f"inputs[{i}]" for i, n in enumerate(names[1:])
        ],
        kwargs=dict(kwargs or {}),
        train=train,
        grads=grads,
        steps=steps,
        optimizer=optimizer or (lambda params: torch.optim.SGD(params, lr=0.1)),
        seed=seed,
    )


def _map(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``obj`` with every tensor replaced by ``fn(tensor)``, containers rebuilt."""
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        items = {k: _map(v, fn) for k, v in obj.items()}
        kind: Any = type(obj)
        try:
            return kind(items)
        except TypeError:
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
            # object.__setattr__ reaches frozen dataclasses too
            object.__setattr__(new, field.name, _map(getattr(obj, field.name), fn))
        return new
    return obj


def _move(obj: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """``obj.to`` ``device`` and ``dtype``: widen where the data is, narrow first.

    MPS holds no float64: a float64 reference is made on its own device, and a
    float64 model bound for MPS is narrowed before it leaves the CPU.
    """
    import torch

    if dtype is None:
        return obj.to(device)
    if dtype == torch.float64:
        return obj.to(device).to(dtype)
    return obj.to(dtype).to(device)


def _place(
    tensor: torch.Tensor,
    device: torch.device,
    dtype: torch.dtype | None,
    grad: bool,
    layout: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """A fresh leaf on ``device``; floating tensors in ``dtype`` where given."""
    if not tensor.is_floating_point():
        dtype = None
    t: torch.Tensor = _move(tensor.detach(), device, dtype)
    if t.data_ptr() == tensor.data_ptr():
        t = t.clone()  # never let the function write into the caller's tensor
    if layout is not None:
        t = layout(t)
    if grad and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _host(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().to("cpu", copy=True)


def dropout_layers(module: Any) -> list[str]:
    """The submodules that draw random numbers in training mode."""
    from torch import nn

    kinds = (
        nn.Dropout,
        nn.Dropout1d,
        nn.Dropout2d,
        nn.Dropout3d,
        nn.AlphaDropout,
        nn.FeatureAlphaDropout,
    )
    found = []
    for name, sub in module.named_modules():
        p = sub.p if isinstance(sub, kinds) else None
        if isinstance(sub, nn.MultiheadAttention):
            p = sub.dropout
        if p:
            found.append(name or "the module itself")
    return found


def _weights(outputs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Fixed grad_outputs, one per differentiable output, the same on both sides.

    Random multiples of 1/16 in (0, 1]: exact in every float dtype, so both
    sides weigh each output by the same numbers whatever their dtypes; random
    rather than ones, so that softmax-like outputs get nonzero gradients.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    weights = []
    for t in outputs:
        w = torch.randint(1, 17, t.shape, generator=generator) / 16
        weights.append(w.to(t.device, t.dtype))
    return weights


def _backward(outputs: Any, seed: int, user: Callable[[], Any]) -> bool:
    """The backward of ``sum(w * output)`` over the outputs; False if none."""
    import torch

    diff = [
        t
        for _, t in named_leaves(outputs, "output")
        if t.requires_grad and (t.is_floating_point() or t.is_complex())
    ]
    if diff:
        weights = _weights(diff, seed)
        with user():
            torch.autograd.backward(diff, weights)
    return bool(diff)


@contextlib.contextmanager
def rng_restored(devices: list[torch.device]) -> Iterator[None]:
    import torch

    with contextlib.ExitStack() as stack:
        # fork_rng always forks the CPU generator; each device's its own
        stack.enter_context(torch.random.fork_rng(devices=[], device_type="cpu"))
        for device in {d for d in devices if d.type != "cpu"}:
            index = [] if device.index is None else [device.index]
            stack.enter_context(
                torch.random.fork_rng(devices=index, device_type=device.type)
            )
        yield


def _seed(device: torch.device, seed: int) -> None:
    import torch

    torch.default_generator.manual_seed(seed)
    manual_seed(device, seed)


def _grads(objects: list[tuple[str, Any]]) -> Leaves:
    return [
        (f"{path}.grad", _host(t.grad))
        for name, obj in objects
        for path, t in named_leaves(obj, name)
        if t.requires_grad
    ]


def run(
    plan: Plan, device: torch.device, dtype: torch.dtype | None, checked: bool = True
) -> Run:
    """Forward, backward and steps on ``device``; every leaf copied to the host.

    ``checked``: the side whose code the audit and the watchers look at (the
    device); the reference is the plugin's own work throughout.
    """
    import torch

    user: Callable[[], Any] = user_code if checked else contextlib.nullcontext

    def place(t: torch.Tensor) -> torch.Tensor:
        return _place(t, device, dtype, plan.grads, plan.layout)

    fn = plan.fn
    module: torch.nn.Module | None = None
    if isinstance(fn, torch.nn.Module):
        fn = module = _move(copy.deepcopy(fn), device, dtype)
        if plan.memory_format is not None:
            module.to(memory_format=plan.memory_format)  # type: ignore[call-overload]
        if plan.train is not None:
            module.train(plan.train)
    inputs = tuple(_map(x, place) for x in plan.inputs)
    kwargs = {k: _map(v, place) for k, v in plan.kwargs.items()}
    _seed(device, plan.seed)
    with user():
        out = fn(*inputs, **kwargs)
    leaves = named_leaves(out, "output")
    if not leaves:
        raise TypeError(
            f"assert_device_parity: fn_or_module ({plan.name}) returned no tensor "
            f"on {device}: got {type(out).__name__} {out!r:.80}"
        )
    run = Run([(p, _host(t)) for p, t in leaves], [], [], False)
    if plan.grads and _backward(out, plan.seed, user):
        run.backward = True
        run.grads = _grads(
            [*zip(plan.input_names, inputs, strict=True), *kwargs.items()]
        )
        if module is not None:
            run.grads += [
                (f"{plan.name}.{path}.grad", _host(p.grad))
                for path, p in module.named_parameters()
                if p.requires_grad
            ]
    if module is None:
        return run
    if plan.steps:
        params = [p for p in module.parameters() if p.requires_grad]
        with user():
            optimizer = plan.optimizer(params)
        for step in range(plan.steps):
            if step:
                with user():
                    optimizer.zero_grad()
                _seed(device, plan.seed + step)
                with user():
                    again = fn(*inputs, **kwargs)
                _backward(again, plan.seed, user)
            with user():
                optimizer.step()
        after = f"after {plan.steps} step{'s' if plan.steps > 1 else ''}"
        run.after += [
            (f"{plan.name}.{path} {after}", _host(p))
            for path, p in module.named_parameters()
        ]
    run.after += [
        (f"{plan.name}.{path} after the run", _host(b))
        for path, b in module.named_buffers()
    ]
    return run


def float64_in(*objs: Any) -> bool:
    import torch

    return any(
        t.dtype == torch.float64 for obj in objs for _, t in named_leaves(obj, "")
    )


def mode_notes(
    module: Any, train: bool | None, seed: int, ref: str, target: str
) -> tuple[bool | None, list[str]]:
    """The train mode both sides run in, and the note that says why."""
    layers = dropout_layers(module)
    if not layers:
        return train, []
    shown = ", ".join(layers[:3]) + (", ..." if len(layers) > 3 else "")
    if train is not None:
        mode = "train" if train else "eval"
        return train, [f"{mode} mode (train={train}), both sides seeded with {seed}"]
    if not module.training:
        return None, [f"dropout ({shown}) off: the module is in eval mode"]
    if ref == target:
        return None, [
            f"dropout ({shown}) in train mode: both sides seeded with {seed}, "
            "drawing the same numbers"
        ]
    return False, [
        f"dropout ({shown}): {ref} and {target} draw different numbers from one "
        "seed, so both run in eval mode (train=True compares in train mode)"
    ]


def tf32_notes(module: Any) -> list[str]:
    """CUDA float32 kernels that round to TF32 (10-bit mantissas) here.

    Any note means the device side's float32 leaves get TF32's allowance
    (:func:`pytest_mps.parity.compare.tf32_allowed`). A function (not a
    module) is seen through the matmul settings only.
    """
    import torch
    from torch import nn

    notes = []
    precision = torch.get_float32_matmul_precision()
    if precision != "highest":
        notes.append(
            f"cuda: float32 matmuls may use TF32 or bfloat16 (float32 matmul "
            f"precision {precision!r}): float32 leaves get TF32's allowance"
        )
    convs: tuple[type, ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
    convs += (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
    rnns: tuple[type, ...] = (nn.RNN, nn.GRU, nn.LSTM)
    if module is not None and torch.backends.cudnn.allow_tf32:
        found = {type(m).__name__ for m in module.modules() if isinstance(m, convs)}
        found |= {type(m).__name__ for m in module.modules() if isinstance(m, rnns)}
        if found:
            notes.append(
                f"cuda: cuDNN runs {', '.join(sorted(found))} in TF32 "
                "(torch.backends.cudnn.allow_tf32, on by default): float32 "
                "leaves get TF32's allowance"
            )
    return notes
