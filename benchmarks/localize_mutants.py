"""How often a failing parity check names the right layer and the right op.

Fifty seeded mutants of three zoo models (a transformer block stack, a conv
net, a GRU): in each, one aten op is made wrong on the device only, in the
forward or in the backward, either everywhere the device runs it, only for a
non-contiguous input, or only past an output size (the shapes of the bugs
users met: pytorch#124834 and #118115 non-contiguous inputs, #197636 past
2**32 output elements, with the gradients wrong and the forward right). The
mutant is a dispatch mode that changes the op's output when an input is on
the device. It records, by its own bookkeeping (forward hooks for the
forward; full backward hooks for the backward), which module the first
changed call ran in: that is the truth. Then ``assert_device_parity`` runs,
and the localization's first op and layer are scored against it.

Usage: ``python benchmarks/localize_mutants.py [--device mps|cuda]
[--mutants 50] [--seed 0]``. ``mps`` is the emulated device, installed in
this process (``pytest_mps.emulate.install``); ``cuda`` a real GPU. Prints
one line per mutant and the totals. Goal (issue 55): the layer named for at
least 48 of 50, the op for at least 45.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_mps import assert_device_parity, assert_reproducible  # noqa: E402
from pytest_mps.emulate import tags  # noqa: E402
from pytest_mps.parity.check import ParityError  # noqa: E402

# -- the zoo ------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, block: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).bool())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, block: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, block)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, block: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d, heads, block) for _ in range(2)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.act2 = nn.SiLU()
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act1(self.bn1(self.conv1(x))))
        x = self.gap(self.act2(self.bn2(self.conv2(x))))
        return self.fc(torch.flatten(x, 1))


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 12)
        self.rnn = nn.GRU(12, 16, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(torch.tanh(self.inp(x)))
        return self.out(self.norm(h[:, -1]))


ZOO: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "transformer": (Transformer, lambda: torch.randn(2, 8, 32)),
    "convnet": (ConvNet, lambda: torch.randn(2, 3, 12, 12)),
    "gru": (Recurrent, lambda: torch.randn(2, 5, 6)),
}

# -- mutants ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mutant:
    model: str
    op: Any  # an OpOverload
    phase: str  # "forward" or "backward"
    trigger: str  # "always", "non-contiguous" or "size"
    size: int  # with trigger "size": the smallest output numel changed
    change: str  # "scale", "shift" or "roll"

    def describe(self) -> str:
        when = {
            "always": "every call",
            "non-contiguous": "non-contiguous inputs",
            "size": f"outputs of {self.size}+ elements",
        }[self.trigger]
        return f"{self.model}: {self.op} {self.phase}, {when}, {self.change}"


def _on_device(value: Any, device_type: str) -> bool:
    if not isinstance(value, torch.Tensor):
        return False
    if device_type == "mps":
        return tags.tagged(value)
    return value.device.type == device_type


def _tensors(args: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree

    return [t for t in _pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]


def _changed(out: torch.Tensor, how: str) -> torch.Tensor:
    if how == "scale":
        return out * 1.05
    if how == "shift":
        return out + (0.05 * out.abs().mean() + 1e-2).to(out.dtype)
    return out.roll(1, dims=-1) if out.dim() else out * 1.05


class Modules:
    """The mutant's own bookkeeping: the innermost module, forward and backward."""

    def __init__(self, model: nn.Module, root: str) -> None:
        self.forward: list[str] = []
        self.backward: list[str] = []
        self.handles = []
        for path, module in model.named_modules():
            name = f"{root}.{path}" if path else root
            self.handles += [
                module.register_forward_pre_hook(self._push(self.forward, name)),
                module.register_forward_hook(self._pop(self.forward)),
                module.register_full_backward_pre_hook(self._push(self.backward, name)),
                module.register_full_backward_hook(self._pop(self.backward)),
            ]

    @staticmethod
    def _push(stack: list[str], name: str) -> Callable[..., None]:
        return lambda *args: stack.append(name)

    @staticmethod
    def _pop(stack: list[str]) -> Callable[..., None]:
        def pop(*args: Any) -> None:  # a hook that returns a value replaces one
            if stack:
                stack.pop()

        return pop

    def innermost(self, phase: str) -> str | None:
        stack = self.forward if phase == "forward" else self.backward
        return stack[-1] if stack else None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class Mutation(TorchDispatchMode):
    """Makes one op wrong on the device; records the first call it changed."""

    def __init__(self, mutant: Mutant | None, modules: Modules, device_type: str):
        super().__init__()
        self.mutant = mutant
        self.modules = modules
        self.device_type = device_type
        self.first: tuple[str | None, str] | None = None
        self.calls: list[tuple[Any, str, str | None, bool, int]] = []
        self.drift = 0  # "drift": how many calls changed so far

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        inputs = _tensors((args, kwargs))
        if not any(_on_device(t, self.device_type) for t in inputs):
            return out
        phase = (
            "backward" if torch._C._current_autograd_node() is not None else "forward"
        )
        outputs = _tensors(out)
        if not outputs or not outputs[0].is_floating_point():
            return out
        module = self.modules.innermost(phase)
        strided = any(not t.is_contiguous() for t in inputs)
        if self.mutant is None:  # the profiling run
            self.calls.append((func, phase, module, strided, outputs[0].numel()))
            return out
        m = self.mutant
        if func is not m.op or phase != m.phase or module is None:
            return out
        if m.trigger == "non-contiguous" and not strided:
            return out
        if m.trigger == "size" and outputs[0].numel() < m.size:
            return out
        if self.first is None:
            self.first = (module, str(func))
        if m.change == "drift":  # each call a little more than the one before
            changed = outputs[0] * (1 + 1e-3 * self.drift)
            self.drift += 1
        else:
            changed = _changed(outputs[0], m.change)
        if isinstance(out, torch.Tensor):
            return changed
        return (changed, *out[1:])


# ops that make no number of their own, or draw random ones: never mutated
_PLAIN = ("detach", "_to_copy", "clone", "copy_", "zeros_like", "ones_like",
          "fill_", "zero_", "empty", "new_empty", "expand", "lift_fresh",
          "alias", "masked_fill")  # fmt: skip


def candidates(
    calls: list[tuple[Any, str, str | None, bool, int]],
) -> list[tuple[Any, str, str, bool, list[int]]]:
    """Each (op, phase, module) the device ran, with its layouts and sizes."""
    seen: dict[tuple[Any, str, str], tuple[bool, list[int]]] = {}
    for func, phase, module, strided, numel in calls:
        if module is None or func.is_view or func.__name__.split(".")[0] in _PLAIN:
            continue
        if torch.Tag.nondeterministic_seeded in func.tags:
            continue
        key = (func, phase, module)
        was = seen.get(key, (False, []))
        seen[key] = (was[0] or strided, [*was[1], numel])
    return [(f, p, m, s, n) for (f, p, m), (s, n) in seen.items()]


def make_mutants(
    profiles: dict[str, list[tuple[Any, str, str, bool, list[int]]]],
    seed: int,
) -> Iterator[Mutant]:
    """Seeded mutants, the models in turn, each (op, phase, trigger) once at first."""
    rng = random.Random(seed)
    models = sorted(profiles)
    used: set[tuple[str, str, str, str]] = set()
    made = 0
    while True:
        model = models[made % len(models)]
        func, phase, _module, strided, sizes = rng.choice(profiles[model])
        triggers = ["always", "size"] + (["non-contiguous"] if strided else [])
        trigger = rng.choice(triggers)
        size = max(sizes) if trigger == "size" else 0
        key = (model, str(func), phase, trigger)
        if key in used and len(used) < 200:
            continue
        used.add(key)
        change = rng.choice(["scale", "shift", "roll"])
        made += 1
        yield Mutant(model, func, phase, trigger, size, change)


@contextlib.contextmanager
def mutated(
    model: nn.Module, mutant: Mutant | None, device_type: str
) -> Iterator[Mutation]:
    modules = Modules(model, "model")
    mode = Mutation(mutant, modules, device_type)
    try:
        with mode:
            yield mode
    finally:
        modules.remove()


def profile(name: str, device: str, seed: int) -> list[Any]:
    """Every op the device runs for this model, by module, phase and layout."""
    make, data = ZOO[name]
    torch.manual_seed(seed)
    model, x = make(), data()
    quiet = contextlib.redirect_stdout(io.StringIO())  # parity's notes
    with mutated(model, None, device.split(":")[0]) as mode, quiet:
        assert_device_parity(model, x, device=device)
    return candidates(mode.calls)


def score(mutant: Mutant, device: str, seed: int) -> tuple[str, str, str]:
    """(layer outcome, op outcome, what was named) for one mutant."""
    make, data = ZOO[mutant.model]
    torch.manual_seed(seed)
    model, x = make(), data()
    quiet = contextlib.redirect_stdout(io.StringIO())  # parity's notes
    with mutated(model, mutant, device.split(":")[0]) as mode, quiet:
        try:
            assert_device_parity(model, x, device=device)
        except ParityError as error:
            found = error.report.localization
        else:
            return "undetected", "undetected", "parity passed"
    truth = mode.first
    if truth is None:
        return "not fired", "not fired", "the mutant changed nothing"
    if found is None:
        return "missed", "missed", "the localization failed"
    first = found.first
    # the layer: the first wrong op's, else the first layer wrong on its own
    module = first.site.module if first else found.layer and found.layer.module
    if module is None:
        return "missed", "missed", "no op or layer named"
    layer = "right" if module == truth[0] else "wrong"
    op = "right" if first and first.op == truth[1] and layer == "right" else "wrong"
    how = f"{first.op} in {module}" if first else f"layer {module} (no op)"
    return layer, op, f"named {how}; truth {truth[1]} in {truth[0]}"


def score_flaky(mutant: Mutant, device: str, seed: int) -> tuple[str, str]:
    """(outcome, what was named) for a mutant whose op drifts call by call."""
    from pytest_mps.parity.twice import NotReproducible

    make, data = ZOO[mutant.model]
    torch.manual_seed(seed)
    model, x = make(), data()
    with mutated(model, mutant, device.split(":")[0]) as mode:
        try:
            assert_reproducible(model, x, device=device)
        except NotReproducible as error:
            first = error.differs
        else:
            return "missed", "both runs agreed"
    truth = mode.first
    if truth is None:
        return "not fired", "the op never ran"
    if first is None:
        return "caught", "no op named"
    right = first.site.module == truth[0] and first.op == truth[1]
    named = f"named {first.op} in {first.site.module}; truth {truth[1]} in {truth[0]}"
    return ("caught, right op and layer" if right else "caught, wrong op"), named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="mps", help="mps (emulated) or cuda")
    parser.add_argument("--mutants", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--flaky", type=int, default=10, help="mutants whose op drifts per call"
    )
    args = parser.parse_args()
    # CUDA's TF32 rounds float32 matmuls and convolutions to 10-bit
    # mantissas: the clean models would differ from the CPU before any mutant
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    emulation = None
    if args.device.startswith("mps") and not torch.backends.mps.is_available():
        from pytest_mps.emulate.install import Emulation

        emulation = Emulation((26, 0), fallback=False)
        emulation.install()
    try:
        started = time.perf_counter()
        profiles = {name: profile(name, args.device, args.seed) for name in ZOO}
        layers = ops = total = harmless = 0
        for mutant in make_mutants(profiles, args.seed):
            if total == args.mutants:
                break
            layer, op, named = score(mutant, args.device, args.seed + total + 1)
            if layer in ("undetected", "not fired"):
                # the change reached no output or gradient (a shift before a
                # softmax or a LayerNorm): nothing to localize; drawn again
                harmless += 1
                print(f"  - {mutant.describe()}: harmless ({named}), drawn again")
                continue
            total += 1
            layers += layer == "right"
            ops += op == "right"
            print(f"{total:2d}. {mutant.describe()}: layer {layer}, op {op} ({named})")
        flaky: dict[str, int] = {}
        for i, mutant in enumerate(make_mutants(profiles, args.seed + 1000)):
            if i == args.flaky:
                break
            drifting = dataclasses.replace(mutant, change="drift")
            outcome, named = score_flaky(drifting, args.device, args.seed + i)
            flaky[outcome] = flaky.get(outcome, 0) + 1
            print(f"  flaky {i + 1}. {drifting.describe()}: {outcome} ({named})")
        seconds = time.perf_counter() - started
    finally:
        if emulation is not None:
            emulation.undo()
    print(
        f"\n{args.device}: right layer {layers}/{total}, right op {ops}/{total} "
        f"({harmless} harmless mutants drawn again; {seconds:.0f} s)"
    )
    print(
        f"run-twice (assert_reproducible), {args.flaky} mutants whose op drifts "
        "call by call: "
        + ", ".join(f"{n} {outcome}" for outcome, n in sorted(flaky.items()))
    )
    print("goal: layer >= 48/50, op >= 45/50")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
